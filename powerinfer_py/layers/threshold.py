"""Threshold sparsity for gated FFNs whose activation is never exactly zero (SwiGLU, GeGLU: llama with silu,
qwen2, gemma3): the "threshold" sparse mode of ffn.py.

Per layer l a cut-off t_l on a neuron score is calibrated (calibrate.py) so that a target fraction of neurons
falls below it on calibration text. At run time, per token:
  a = act(gate·x)                        dense (the gate is what tells which neurons matter)
  keep i  iff  |a_i| * c_i >= t_l        (skipped neurons contribute exactly 0)
  h_i = a_i * (up_i·x)                   for kept i only: the row gather pi_matmul_rows, as in the ReLU path
  y = sum_{kept i} h_i * down[:, i]      the down projection over kept neurons only (see below)
c_i is the neuron's scale, a per-neuron constant from calibration: the mean |up_i·x| over the calibration
text (normalized to mean 1 per layer, which changes nothing but the units of t_l). A neuron's contribution is
a_i * (up_i·x), and up_i·x is unknown before the neuron is computed, so its typical size stands in for it: a
neuron whose up value is usually large is worth keeping at a smaller |a_i|. On Gemma 3 270M (40% skipped,
perplexity on text the calibration never saw, windows of 256) this cut the increase from +14.2% (plain |a_i|)
to +7.9%; also weighting by the down column's norm did worse (docs/sparse.md: the criteria tried). Files calibrated
without scales (or with `calibrate --plain`) use c_i = 1. Cost at run time: one multiply of |a| by the scale
vector per token and layer.
Two-stage files (`calibrate`'s default since the single rule's cost was measured, or `--up-sparsity U`;
KEY_FFN_UP_THRESHOLDS): the score rule above, with the cut-off u_l, only picks the candidates whose up row is
read (skipping the fraction U of up rows, by default half the sparsity); a candidate is then kept, i.e. given
its down row, only if its exact |h_i| = |a_i * (up_i·x)| >= t_l, which skips the (larger) fraction `sparsity`
of the down rows. The guess c_i of up_i·x is what costs the single-stage rule its perplexity; the second stage
ranks by the true contribution among the candidates. On Gemma 3 270M (`powerinfer perplexity`, evaluation
text, windows of 512; docs/sparse.md): 40% skipped, up 20%: +3.8%, against +8.6% for the single rule at 40% and +5.0%
at 30% (the same up + down bytes as 20% + 40%). Another sparsity at run time interpolates the file's two
tables (calibrate.two_stage_rows), keeping its ratio of up rows to neurons skipped.
A layer whose cut-off is <= 0 keeps every neuron and runs the dense FFN itself, so sparsity 0 is bit-for-bit
dense. Batches (prefill) compute the union of the tokens' kept sets once and zero each token's own skipped
neurons, exactly like predictor mode, so every token gets its per-token result whatever the batching.

Down projection of dense GGUF files. ffn_down is (n_embd, n_ff) with quantized blocks running along n_ff, so
skipping neurons there saves nothing. At load, threshold mode can make a transposed copy down_t (n_ff, n_embd)
and use the AXPY over kept rows (pi_axpy_rows), reading only the kept neurons' rows. The copy keeps the dtype
for F32/F16/BF16 (the same values) and is re-quantized to Q8_0 for quantized files (K-quant blocks of 256 do
not fit typical n_embd such as 640, and Q8_0 adds almost no error: 8.5 bits per weight). Its cost: one
dequantize + transpose + quantize per layer at load (tens of ms for Gemma 3 270M) and the copy's memory
(Q8_0 is larger than Q4_K/Q6_K). Whether it pays depends on the bytes read per token:
(1 - sparsity) * bytes(down_t) against bytes(ffn_down). The AXPY streams its scattered rows less efficiently
than the mat-vec streams a whole matrix, so `down="auto"` takes the copy only when it reads at most
TRANSPOSED_MAX_RATIO of ffn_down's bytes. Measured per FFN layer, 1 thread, 2048 x 5632 synthetic llama, 50%
skipped (weights streamed from DRAM): Q8_0 file: off 2812 us, dense down 2445 us, transposed 1902 us (ratio 0.5:
copy wins); Q4_0 file: off 1091 us, dense down 987 us, transposed (Q8_0 copy, ratio 0.94) 1142 us (copy loses).
`down="dense"` / `"transposed"` force one (benchmarks/bench_threshold.py compares all three).
"""
from __future__ import annotations

import math

import numpy as np

from ..config import KEY_FFN_QUANTILES, KEY_FFN_THRESHOLDS, KEY_FFN_UP_QUANTILES, QUANTILE_STEPS, ModelConfig
from ..errors import ModelFileError, PowerInferError
from ..gguf.types import GGMLType, Tensor

THRESHOLD_VARIANTS = ("swiglu", "geglu")
DOWN_CHOICES = ("auto", "dense", "transposed")
_SAME_TYPE = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
QUANTILE_GRID = np.linspace(0.0, 1.0, QUANTILE_STEPS + 1)
TRANSPOSED_MAX_RATIO = 0.75  # auto: the transposed copy must read at most this fraction of ffn_down's bytes


def check_sparsity(sparsity: float) -> float:
    s = float(sparsity)
    if not 0.0 <= s < 1.0 or math.isnan(s):
        raise PowerInferError(f"--sparsity must be in [0, 1) (the fraction of FFN neurons to skip), got {sparsity}")
    return s


def layer_cuts(config: ModelConfig, sparsity: float | None,
               path: str = "MODEL") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(per-layer cut-offs, per-layer candidate cut-offs of two-stage files, else ()) for `sparsity` (None: the
    file's calibrated sparsity), from the file's calibration metadata: the stored cut-offs at the calibrated
    sparsity, else interpolated from its quantile tables (a two-stage file needs both). Sparsity 0 needs no
    calibration (nothing is skipped: the dense FFN)."""
    if sparsity is not None and check_sparsity(sparsity) == 0.0:
        return (0.0,) * config.n_layer, ()
    if config.calibrated_sparsity is None:
        raise PowerInferError(
            f"this model file has no threshold calibration ({KEY_FFN_THRESHOLDS}): run `powerinfer calibrate -m {path} "
            f"--sparsity {sparsity if sparsity is not None else 0.4} -o calibrated.gguf` once and run the calibrated file "
            "with --sparse threshold")
    if sparsity is None or abs(sparsity - config.calibrated_sparsity) < 1e-6:
        return config.ffn_thresholds, config.ffn_up_thresholds
    if not config.ffn_quantiles or (config.ffn_up_thresholds and not config.ffn_up_quantiles):
        missing = KEY_FFN_QUANTILES if not config.ffn_quantiles else KEY_FFN_UP_QUANTILES
        raise PowerInferError(f"this model file is calibrated for sparsity {config.calibrated_sparsity:g} only (no "
                              f"{missing}): calibrate it again, `powerinfer calibrate -m {path} "
                              f"--sparsity {sparsity:g} -o calibrated.gguf`")

    def interp(rows):
        return tuple(float(np.interp(sparsity, QUANTILE_GRID, q)) for q in rows)

    return interp(config.ffn_quantiles), interp(config.ffn_up_quantiles) if config.ffn_up_thresholds else ()


def quantile_rows(magnitudes: np.ndarray) -> np.ndarray:
    """f32 [QUANTILE_STEPS + 1] quantiles of score values (any shape) on QUANTILE_GRID."""
    return np.quantile(np.asarray(magnitudes, dtype=np.float64).reshape(-1), QUANTILE_GRID).astype(np.float32)


def transposed_type(down: Tensor) -> GGMLType | None:
    """The dtype of the transposed copy of `down` (n_embd, n_ff), or None when no kernel type fits."""
    if down.type in _SAME_TYPE:
        return down.type
    return GGMLType.Q8_0 if down.shape[0] % 32 == 0 else None


def _nbytes(ty: GGMLType, n_rows: int, n_cols: int) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[ty]
    return n_rows * (n_cols // block) * size


def use_transposed(down: Tensor, sparsity: float, choice: str = "auto") -> bool:
    """Whether threshold mode should make a transposed copy of `down` (see the module docstring)."""
    if choice not in DOWN_CHOICES:
        raise ValueError(f"down must be one of {DOWN_CHOICES}, got {choice!r}")
    ty = transposed_type(down)
    if choice == "dense" or ty is None:
        if choice == "transposed":
            raise PowerInferError(f"{down.name}: no kernel type fits a transposed copy of shape {down.shape}")
        return False
    if choice == "transposed":
        return True
    dense_bytes = np.asarray(down.data).nbytes
    return (1.0 - sparsity) * _nbytes(ty, down.shape[1], down.shape[0]) <= TRANSPOSED_MAX_RATIO * dense_bytes


def transposed_copy(down: Tensor) -> Tensor:
    """down (n_embd, n_ff) -> down_t (n_ff, n_embd) in transposed_type(down): dequantize, transpose, encode."""
    try:  # the C codecs and transpose when built (fast); the numpy ones otherwise (same values)
        from ..kernels.cpu import dequantize, quantize, transpose
    except ImportError:  # pragma: no cover - only without a built extension
        from ..kernels.ref import dequantize, quantize, transpose

    ty = transposed_type(down)
    t = transpose(np.asarray(dequantize(down), dtype=np.float32).reshape(down.shape))
    name = down.name.replace("ffn_down", "ffn_down_t")
    if ty == GGMLType.F32:
        return Tensor(name, ty, t.shape, t)
    return Tensor(name, ty, t.shape, quantize(t, ty))


class ThresholdPath:
    """One layer's threshold-mode forward; ffn.FFN holds one and calls it with the normed input x."""

    def __init__(self, ffn, cut: float, sparsity: float, down: str = "auto", scale=None, up_cut: float | None = None):
        if ffn.variant not in THRESHOLD_VARIANTS:
            raise ValueError(f"threshold mode needs a SwiGLU/GeGLU FFN, got {ffn.variant}")
        self.ffn, self.cut = ffn, np.float32(cut)
        self.scale = None  # f32 [n_ff]: the neurons' score factors c_i (None: the score is |a_i|)
        if scale is not None:
            self.scale = np.asarray(scale, dtype=np.float32).reshape(-1)
            if self.scale.shape != (ffn.n_ff,):
                raise ModelFileError(f"layer {ffn.layer}: {len(self.scale)} neuron scales for {ffn.n_ff} FFN "
                                     "neurons: calibrate the file again")
        # two-stage: candidates by score >= up_cut (their up rows are read), kept by |h| >= cut (None: one stage)
        self.up_cut = None if up_cut is None else np.float32(up_cut)
        self.down_t = None
        w = ffn.w
        if self.cut > 0 and w.down is not None and use_transposed(w.down, sparsity, down):
            self.down_t = transposed_copy(w.down)
        # tier 2 (kernels.steps; models/base.py): one token in one C call (FFNs without biases), same bits
        self.fused = None
        steps = ffn.k.steps
        if self.cut > 0 and steps is not None and w.b_up is None and w.b_down is None and \
                (self.down_t is not None or w.down is not None):
            down_w = self.down_t if self.down_t is not None else w.down
            self.fused = steps.threshold_ffn_plan("silu" if ffn.variant == "swiglu" else "gelu", w.gate, w.up,
                                                  down_w, self.down_t is not None, float(self.cut), self.scale,
                                                  None if self.up_cut is None else float(self.up_cut))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        f, k = self.ffn, self.ffn.k
        if self.cut <= 0:  # nothing to skip: the dense FFN, bit for bit
            if f.stats is not None:
                n = x.shape[0] * f.n_ff
                f.stats.record(f.layer, x.shape[0], n, n)
            return f._dense(x)
        n_tok = x.shape[0]
        two = self.up_cut is not None
        if n_tok == 1 and self.fused is not None:
            y, n_kept, nz = k.steps.threshold_ffn_decode(self.fused, np.ascontiguousarray(x[0]))
            return f._one_token(y, n_kept, nz, int(self.fused.up_read[0]) if two else None)
        pre = k.matmul(f.w.gate, x)
        a = k.silu(pre) if f.variant == "swiglu" else k.gelu(pre)  # [N, n_ff]
        score = np.abs(a)
        if self.scale is not None:
            score *= self.scale
        first = float(self.cut if self.up_cut is None else self.up_cut)
        if n_tok == 1:
            rows = k.select_active(score[0], first)
            mask, n_kept = None, len(rows)
        else:
            mask = score >= np.float32(first)
            rows = np.flatnonzero(mask.any(axis=0)).astype(np.int32)
            n_kept = int(np.count_nonzero(mask))
        n_up = n_kept if two else None  # the candidates (per token; a batch reads their union once)
        dense = n_tok > 1 and len(rows) > 0.5 * f.n_ff  # as ffn.DENSE_FALLBACK: contiguous reads win
        h = a[:, rows] * f._up_rows(x, rows, dense)
        if self.up_cut is not None and mask is None:  # second stage, one token: of the candidates, |h| >= cut
            keep = k.select_active(np.abs(h[0]), float(self.cut))
            rows, h, n_kept = rows[keep], h[:, keep], len(keep)
        elif mask is not None:  # each token keeps its own neurons (second stage: and |h| >= cut)
            mask = mask[:, rows]
            if self.up_cut is not None:
                mask &= np.abs(h) >= self.cut
                n_kept = int(np.count_nonzero(mask))
            h = np.where(mask, h, np.float32(0))
        if f.stats is not None:
            f.stats.record(f.layer, n_tok, n_kept, int(np.count_nonzero(h)), n_up)
        if self.down_t is not None:
            if len(rows) == 0:
                return np.zeros((n_tok, self.down_t.shape[1]), dtype=np.float32)
            return k.axpy_rows(self.down_t, rows, np.ascontiguousarray(h, dtype=np.float32))
        return f._down(h, rows)
