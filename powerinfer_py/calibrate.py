"""Calibrate threshold sparsity (threshold.py): run a SwiGLU/GeGLU model densely over calibration text, pick per
layer the cut-off on the neuron score |act(gate)_i| * c_i below which the target fraction of neurons falls,
and write a copy of the model file with the cut-offs and scales in its metadata (config.py: KEY_SPARSITY,
KEY_FFN_THRESHOLDS, KEY_FFN_QUANTILES, KEY_FFN_NEURON_SCALES).

The activations come from the FFN observer hook (ffn.py), which sees act(gate·x) of the real dense forward
pass. The text runs in the windows perplexity.py uses (BOS + up to ctx - 1 tokens, fresh cache each), and the
BOS position is left out of the statistics (its activations are atypical and it never needs predicting).
The neuron scale c_i is the mean |up_i·x| over the text, divided by its mean over the layer's neurons
(threshold.py says why); with scales=False every c_i is 1 and no scales are written (the plain |act| score).
Cut-off t_l = the `sparsity` quantile of the score over all (token, neuron) pairs of layer l, so on this text
a fraction `sparsity` of the neurons is skipped per layer, on average over tokens. The full quantile grid is
stored too, so a run may ask for another sparsity without calibrating again.

Two stages (up_sparsity U < sparsity, threshold.py): the candidate cut-off u_l is the U quantile of that score;
the cut-off t_l is then the `sparsity` quantile of |h| = |act_i * (up_i·x)| over all pairs, the non-candidates
counting as below any cut-off, so the fraction `sparsity` of neurons is skipped (down rows) and U of them are
never read from ffn_up. Such a file is calibrated for its one sparsity (no quantile table).

Without a text, calibration text is sampled from the model itself (temperature 0.8 from BOS, fixed seed):
the result says so. Memory: at most MAX_VALUES |act| samples per layer are kept (a uniform subsample when the
text has more, with their neuron indices), so calibrating a 7B model stays within a few hundred MB. The up
values cost one more up mat-vec per token during calibration (the observer sees act only).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .config import (KEY_FFN_NEURON_SCALES, KEY_FFN_QUANTILES, KEY_FFN_THRESHOLDS, KEY_FFN_UP_THRESHOLDS,
                     KEY_SPARSITY, KEY_UP_SPARSITY)
from .errors import PowerInferError, UnsupportedError
from .perplexity import DEFAULT_BATCH, windows
from .threshold import THRESHOLD_VARIANTS, check_sparsity, quantile_rows

DEFAULT_TOKENS = 1024
DEFAULT_CTX = 256
MAX_VALUES = 1 << 22  # |act| samples kept per layer
SAMPLE_SEED = 1234


@dataclass
class CalibrationResult:
    path: Path  # the written file
    sparsity: float
    thresholds: list[float]
    n_tokens: int  # text tokens whose activations were counted
    text_source: str  # "file" or "sampled from the model"
    skipped: list[float] = field(default_factory=list)  # per layer, fraction below the cut-off on the text
    scaled: bool = True  # neuron scales written (score |act_i| * c_i), else the plain |act_i| score
    up_sparsity: float | None = None  # two-stage files: the fraction of up rows skipped (None: one stage)
    up_thresholds: list[float] | None = None  # two-stage files: per layer the candidate cut-offs
    up_skipped: list[float] | None = None  # two-stage files: per layer, fraction of up rows not read on the text

    def to_json(self) -> dict:
        return {"path": str(self.path), "sparsity": self.sparsity, "thresholds": self.thresholds,
                "n_tokens": self.n_tokens, "text_source": self.text_source, "skipped": self.skipped,
                "neuron_scales": self.scaled, "up_sparsity": self.up_sparsity, "up_thresholds": self.up_thresholds,
                "up_skipped": self.up_skipped}


class _Collector:
    """Observer that keeps |act| samples with their neuron indices per layer (skipping the BOS row of each
    window) and, for the neuron scales, sums |up·x| per neuron over every counted row."""

    def __init__(self, ffns, keep: float, scales: bool, seed: int = 0, ups: bool = False):
        n_layer, n_ff = len(ffns), ffns[0].n_ff if ffns else 0
        self.ffns, self.scales, self.ups = ffns, scales, ups  # ups: keep |up·x| beside each |act| sample
        self.values: list[list[np.ndarray]] = [[] for _ in range(n_layer)]
        self.up_values: list[list[np.ndarray]] = [[] for _ in range(n_layer)]
        self.neurons: list[list[np.ndarray]] = [[] for _ in range(n_layer)]
        self.up_sum = [np.zeros(f.n_ff, dtype=np.float64) for f in ffns]
        self.rows = [0] * n_layer
        self.keep, self.rng = keep, np.random.default_rng(seed)
        self.skip_first = False  # set per forward call: the chunk starts with BOS

    def __call__(self, layer, x, p, act) -> None:
        first = 1 if self.skip_first else 0
        a = np.abs(act[first:])
        if self.scales or self.ups:
            f = self.ffns[layer]
            u = f.k.matmul(f.w.up, x[first:]) if len(a) else np.zeros((0, f.n_ff), np.float32)
            self.up_sum[layer] += np.abs(u).sum(axis=0, dtype=np.float64)
            self.rows[layer] += len(a)
        n_ff = a.shape[1]
        flat = a.reshape(-1)
        if self.keep >= 1.0:
            idx = np.arange(flat.shape[0])
        else:
            idx = np.flatnonzero(self.rng.random(flat.shape[0]) < self.keep)
        self.values[layer].append(flat[idx].astype(np.float32))
        if self.ups:
            self.up_values[layer].append(np.abs(u).reshape(-1)[idx].astype(np.float32))
        self.neurons[layer].append((idx % n_ff).astype(np.int32))

    def layer_scale(self, layer: int) -> np.ndarray | None:
        """f32 [n_ff]: mean |up·x| per neuron over the counted rows, normalized to mean 1 (None: no scales)."""
        if not self.scales or self.rows[layer] == 0:
            return None
        c = self.up_sum[layer] / self.rows[layer]
        mean = c.mean()
        return (c / mean if mean > 0 else np.ones_like(c)).astype(np.float32)


def sample_text(llm, n_tokens: int, seed: int = SAMPLE_SEED) -> list[int]:
    """About n_tokens tokens sampled from the model from BOS (several generations if it ends early)."""
    bos = llm.tokenizer.bos_id
    out: list[int] = []
    while len(out) < n_tokens:
        start = [bos] if bos is not None and bos >= 0 else [0]
        want = min(n_tokens - len(out), llm.n_ctx - len(start))
        got = list(llm.generate_tokens(start, max_tokens=want, temperature=0.8, top_k=40, top_p=0.95,
                                       seed=seed + len(out)))
        if not got:
            raise PowerInferError("the model ended every sampled text at once: give calibration text with --text")
        out.extend(got)
    return out[:n_tokens]


def collect_thresholds(llm, ids: list[int], sparsity: float, ctx: int = DEFAULT_CTX, batch: int = DEFAULT_BATCH,
                       on_window: Callable[[int], None] | None = None, scales: bool = True,
                       up_sparsity: float | None = None
                       ) -> tuple[list[float], np.ndarray, list[float], list[np.ndarray] | None,
                                  tuple[list[float], list[float]] | None]:
    """(per-layer cut-offs, quantile table f32 [n_layer, 101], per-layer skipped fraction on ids, per-layer
    neuron scales f32 [n_ff] or None when scales=False, and for two stages (per-layer candidate cut-offs,
    per-layer fraction of up rows skipped on ids), else None) from a dense run of `llm` over the token ids (no
    BOS; windows as in perplexity.py). Two stages: the cut-offs apply to |h| among the candidates."""
    c, model = llm.config, llm.model
    bos = llm.tokenizer.bos_id if llm.tokenizer.bos_id is not None and llm.tokenizer.bos_id >= 0 else None
    keep = min(1.0, MAX_VALUES / max(1, len(ids) * c.n_ff))
    col = _Collector(model.ffns, keep, scales, ups=up_sparsity is not None)
    cache = model.new_cache(min(ctx, llm.n_ctx))
    for f in model.ffns:
        f.observer = col
    try:
        for iw, w in enumerate(windows(ids, min(ctx, llm.n_ctx), bos)):
            cache.clear()
            arr = np.asarray(w, dtype=np.int32)
            for s in range(0, len(arr), batch):
                col.skip_first = s == 0 and bos is not None
                model.forward(arr[s:s + batch], cache)
            if on_window is not None:
                on_window(iw)
    finally:
        for f in model.ffns:
            f.observer = None
    thresholds, table, skipped, layer_scales, up_cuts, up_skipped = [], [], [], [], [], []
    for il in range(c.n_layer):
        mags = np.concatenate(col.values[il]) if col.values[il] else np.zeros(0, np.float32)
        if mags.size == 0:
            raise PowerInferError("no activations were collected: the calibration text is empty")
        scale = col.layer_scale(il)
        layer_scales.append(scale)
        if scale is not None:  # the score threshold mode compares: |act_i| * c_i
            mags *= scale[np.concatenate(col.neurons[il])]
        if up_sparsity is not None:  # candidates: score >= u_l; then the score is |h| (-1: not a candidate)
            u_cut = np.float32(np.quantile(mags.astype(np.float64), up_sparsity))
            up_cuts.append(float(u_cut))
            h = np.abs(np.concatenate(col.values[il])) * np.concatenate(col.up_values[il])
            up_skipped.append(float(np.mean(mags < u_cut)))
            mags = np.where(mags >= u_cut, h, np.float32(-1))
            col.up_values[il] = []
        table.append(quantile_rows(mags))
        t = float(np.quantile(mags.astype(np.float64), sparsity)) if sparsity > 0 else 0.0
        thresholds.append(t)
        skipped.append(float(np.mean(mags < np.float32(t))) if sparsity > 0 else 0.0)
        col.values[il], col.neurons[il] = [], []
    two_stage = (up_cuts, up_skipped) if up_sparsity is not None else None
    return thresholds, np.stack(table), skipped, (layer_scales if scales else None), two_stage


def calibrate(model: str | os.PathLike, out: str | os.PathLike, sparsity: float, text: str | None = None,
              n_tokens: int = DEFAULT_TOKENS, ctx: int = DEFAULT_CTX, threads: int | None = None,
              on_progress: Callable[[str], None] | None = None, scales: bool = True,
              up_sparsity: float | None = None) -> CalibrationResult:
    """Calibrate `model` for `sparsity` on `text` (None: text sampled from the model) and write the copy `out`
    (atomically: a temporary file in out's folder, renamed when complete). scales=False: the plain |act|
    score, no neuron scales. up_sparsity (< sparsity): two stages (the module docstring)."""
    from .gguf import open_gguf
    from .gguf.writer import check_free_space, write_gguf
    from .llm import load

    sparsity = check_sparsity(sparsity)
    if up_sparsity is not None and not (0.0 <= check_sparsity(up_sparsity) < sparsity):
        raise PowerInferError(f"--up-sparsity must be below --sparsity ({sparsity:g}), got {up_sparsity:g}: the "
                              "neurons whose up row is skipped are a part of the skipped ones")
    if n_tokens < 1:
        raise PowerInferError(f"--tokens must be at least 1, got {n_tokens}")
    out = Path(out)
    if not out.parent.is_dir():
        raise PowerInferError(f"output folder does not exist: {out.parent}")
    if out.is_dir():
        raise PowerInferError(f"output path is a folder: {out}")
    check_free_space(out, Path(model).stat().st_size)  # the copy is about the source's size: fail before the work
    say = on_progress or (lambda msg: None)
    with load(model, threads=threads, n_ctx=max(ctx, 2), sparse="off") as llm:
        from .ffn import ffn_variant
        from .moe import require_dense_ffn

        require_dense_ffn(llm.config, "calibrate")
        variant = ffn_variant(llm.config)
        if variant not in THRESHOLD_VARIANTS:
            raise UnsupportedError(f"calibrate is for SwiGLU/GeGLU models; this {llm.config.arch} model's FFN is "
                                   f"{variant} (ReLU models need no thresholds: use --sparse exact)")
        if text is None:
            say(f"no --text: sampling {n_tokens} calibration tokens from the model itself")
            ids, source = sample_text(llm, n_tokens), "sampled from the model"
        else:
            ids, source = llm.tokenize(text, add_bos=False, special=False)[:n_tokens], "file"
            if not ids:
                raise PowerInferError("the calibration text is empty")
        say(f"calibrating on {len(ids)} tokens ({source})")
        thresholds, table, skipped, layer_scales, two = collect_thresholds(llm, ids, sparsity, ctx, scales=scales,
                                                                           up_sparsity=up_sparsity)
        up_cuts, up_skipped = two if two is not None else (None, None)
    with open_gguf(model) as src:
        meta = dict(src.metadata)
        types = dict(src.metadata_types)
        stale = [k for k in meta if k.startswith(KEY_FFN_NEURON_SCALES)]  # a file calibrated before
        for key in (KEY_SPARSITY, KEY_FFN_THRESHOLDS, KEY_FFN_QUANTILES, KEY_UP_SPARSITY, KEY_FFN_UP_THRESHOLDS,
                    *stale):
            meta.pop(key, None)
            types.pop(key, None)
        meta[KEY_SPARSITY] = np.float32(sparsity)
        meta[KEY_FFN_THRESHOLDS] = np.asarray(thresholds, dtype=np.float32)
        if up_cuts is None:  # a two-stage file runs at its one sparsity (its |h| cut-offs need the candidates)
            meta[KEY_FFN_QUANTILES] = table.astype(np.float32).reshape(-1)
        else:
            meta[KEY_UP_SPARSITY] = np.float32(up_sparsity)
            meta[KEY_FFN_UP_THRESHOLDS] = np.asarray(up_cuts, dtype=np.float32)
        for il, scale in enumerate(layer_scales or ()):
            meta[f"{KEY_FFN_NEURON_SCALES}{il}"] = scale
        write_gguf(out, meta, src.tensors, types=types, magic=src.magic, alignment=src.alignment)
    say(f"wrote {out}")
    return CalibrationResult(out, sparsity, thresholds, len(ids), source, skipped, layer_scales is not None,
                             up_sparsity, up_cuts, up_skipped)
