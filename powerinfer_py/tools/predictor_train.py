"""Train PowerInfer activation predictors for a model: collect (p, active) pairs over a text, fit every layer.

    powerinfer train-predictor -m MODEL --text FILE [--rank R | --rank auto] -o OUT [--format pwri|pt]

1. collect(): the model runs densely over the calibration tokens (observe.py); for every layer and text token
   the FFN observer gives p, the exact predictor input of docs/FORMATS.md section 2 (pre-ffn_norm residual; falcon:
   the layer input), and act, the activated gating values. Label: neuron active iff act != 0, which is what
   the sparse engine skips on (ReLU-family FFNs: reglu, fatreglu, dreglu, relu). SwiGLU/GeGLU FFNs (llama with
   silu, qwen2, gemma3) have no exact zeros: their label is threshold mode's keep rule |act| * c >= the
   layer's cut-off (threshold.py; c the file's neuron scales, 1 without them), read from a file calibrated
   by `powerinfer calibrate --one-stage` (at its sparsity, or another one interpolated from its quantiles; a
   two-stage file's cut-offs apply to |act * up| and are refused), so the
   predictor learns to skip what threshold mode would skip -- without computing the gate. ffn.py's predictor
   mode then computes gate and up rows for predicted neurons only.
   Memory: p is kept as f32 [T, n_embd] per layer and the labels as packed bits, so T tokens of an L-layer
   model take about T * L * (4 * n_embd + n_ff / 8) bytes (2048 tokens of a 7B model: ~1.1 GB).
2. train(): per layer, predictor_fit.fit_layer at a fixed rank, or with rank "auto" at the smallest rank of
   RANKS (up to max_rank) whose held-out recall reaches the target; if none does, the rank with the best
   recall. The threshold convention is ffn.py's: active iff logit >= threshold (0 here).
3. predictor_out writes a PWRI file or a folder of model_N.pt files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..errors import PowerInferError, UnsupportedError
from ..layers.ffn import PREDICTED_GLU, RELU_FAMILY, ffn_variant
from .predictor_fit import FitConfig, LayerPredictor, Metrics, fit_layer

RANKS = (16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass
class LayerData:
    """One layer's training data: p f32 [T, n_embd] and packed labels uint8 [T, ceil(n_ff / 8)]."""
    n_ff: int
    p_parts: list = field(default_factory=list)
    y_parts: list = field(default_factory=list)

    def add(self, p: np.ndarray, act: np.ndarray, cut: float | None = None, scale=None) -> None:
        """One batch: p [n, n_embd], act [n, n_ff]; active = act != 0, or, when a cut is given, threshold
        mode's keep rule |act| * scale >= cut (scale: the calibration's neuron scales, None: 1)."""
        self.p_parts.append(np.array(p, dtype=np.float32))
        if cut is None:
            label = act != 0
        else:
            score = np.abs(act) if scale is None else np.abs(act) * np.asarray(scale, dtype=np.float32)
            label = score >= np.float32(cut)
        self.y_parts.append(np.packbits(label, axis=1))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(p f32 [T, n_embd], y bool [T, n_ff])."""
        p = np.concatenate(self.p_parts)
        y = np.unpackbits(np.concatenate(self.y_parts), axis=1, count=self.n_ff).astype(bool)
        return p, y


def label_cuts(config, sparsity: float | None = None, path: str = "MODEL") -> tuple[float, ...] | None:
    """None for ReLU-family FFNs (label: act != 0); for SwiGLU/GeGLU the per-layer cut-offs on |act| of the
    file's threshold calibration (at `sparsity`, None: the calibrated one). Other FFNs: UnsupportedError."""
    variant = ffn_variant(config)
    if variant in RELU_FAMILY:
        if sparsity is not None:
            raise PowerInferError(f"--sparsity is for SwiGLU/GeGLU models; this {variant} FFN's labels are its "
                                  "exact zeros")
        return None
    if variant not in PREDICTED_GLU:
        raise UnsupportedError(f"{config.arch} with a {variant} FFN: predictor training needs a ReLU-family FFN "
                               "(ReluLLaMA, ProSparse, Bamboo, ReluFalcon, OPT) or a SwiGLU/GeGLU one")
    if config.ffn_up_thresholds:  # its cut-offs apply to |act * up| among candidates: not a rule on act alone
        raise PowerInferError(f"{path} is calibrated in two stages, whose cut-offs need the up values: predictor "
                              f"labels need the single rule on |act(gate)|, `powerinfer calibrate -m MODEL "
                              f"--sparsity {sparsity if sparsity is not None else config.calibrated_sparsity:g} "
                              "--one-stage -o calibrated.gguf`")
    from ..layers.threshold import layer_cuts
    return layer_cuts(config, sparsity, path)[0]


def collect(llm, ids: Sequence[int], *, ctx: int = 512, batch: int = 256, add_bos: bool = True,
            sparsity: float | None = None,
            progress: Callable[[int, int], None] | None = None) -> list[LayerData]:
    """Per-layer (p, label) data of the model over token ids (see the module docstring)."""
    from .observe import observe

    cuts = label_cuts(llm.config, sparsity, str(llm.path))
    data = [LayerData(llm.config.n_ff) for _ in range(llm.config.n_layer)]
    scales = llm.config.ffn_neuron_scales if cuts is not None else ()
    observe(llm, ids, lambda il, p, act: data[il].add(p, act, None if cuts is None else cuts[il],
                                                      scales[il] if scales else None), ctx=ctx,
            batch=batch, add_bos=add_bos, progress=progress)
    return data


def auto_ranks(n_embd: int, n_ff: int, max_rank: int | None = None) -> list[int]:
    """The candidate ranks for rank "auto": RANKS up to min(max_rank, n_embd, n_ff), at least one."""
    cap = min(n_embd, n_ff, max_rank or max(RANKS))
    ranks = [r for r in RANKS if r <= cap]
    return ranks or [cap]


@dataclass
class LayerResult:
    layer: int
    predictor: LayerPredictor
    tried: list[tuple[int, Metrics]]  # (rank, held-out metrics) of every rank trained, in order

    @property
    def metrics(self) -> Metrics:
        return self.predictor.metrics


def train_layer(il: int, p: np.ndarray, y: np.ndarray, rank: int | str, cfg: FitConfig,
                max_rank: int | None = None) -> LayerResult:
    """One layer at a fixed rank, or rank "auto" (the smallest candidate meeting cfg.recall_target)."""
    if rank != "auto":
        lp = fit_layer(p, y, int(rank), cfg)
        return LayerResult(il, lp, [(lp.rank, lp.metrics)])
    tried: list[tuple[int, Metrics]] = []
    best: LayerPredictor | None = None
    for r in auto_ranks(p.shape[1], y.shape[1], max_rank):
        lp = fit_layer(p, y, r, cfg)
        tried.append((r, lp.metrics))
        if best is None or lp.metrics.recall > best.metrics.recall:
            best = lp
        if lp.metrics.meets(cfg.recall_target):
            return LayerResult(il, lp, tried)
    return LayerResult(il, best, tried)


def train(data: list[LayerData], rank: int | str = "auto", cfg: FitConfig = FitConfig(), *,
          max_rank: int | None = None, layer_done: Callable[[LayerResult], None] | None = None
          ) -> list[LayerResult]:
    """Train every layer's predictor; layer_done(result) is called as each layer finishes."""
    out = []
    for il, d in enumerate(data):
        p, y = d.arrays()
        res = train_layer(il, p, y, rank, cfg, max_rank)
        out.append(res)
        if layer_done:
            layer_done(res)
    return out


def parse_rank(text: str) -> int | str:
    """--rank: "auto" or a positive integer."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise PowerInferError(f"--rank must be a positive integer or 'auto', got {text!r}")
    return value
