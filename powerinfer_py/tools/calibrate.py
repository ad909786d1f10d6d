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

Two stages (the default: up_sparsity U = UP_RATIO * sparsity, or as given, below sparsity; threshold.py): the
candidate cut-off u_l is the U quantile of that score; the cut-off t_l is then the `sparsity` quantile of
|h| = |act_i * (up_i·x)| over all pairs, the non-candidates counting as below any cut-off, so the fraction
`sparsity` of neurons is skipped (down rows) and U of them are never read from ffn_up. Its quantile table holds,
for each grid sparsity s, the same two cut-offs for s and U * s / sparsity (two_stage_rows), so a run may ask for
another sparsity with the file's ratio of up rows to neurons skipped. one_stage=True keeps the single rule (the
score's own cut-off and quantile table). Why two stages by default: on Gemma 3 270M (docs/sparse.md) 40% of the neurons
skipped cost +3.8% perplexity with 20% of the up rows skipped, against +8.6% for the single rule, and at equal
bytes skipped (20% + 40% against 30% + 30% of up + down rows) +3.8% against +5.0%.

Without a text, calibration text is sampled from the model itself (temperature 0.8 from BOS, fixed seed):
the result says so. Memory: at most MAX_VALUES |act| samples per layer are kept (a uniform subsample when the
text has more), each with its neuron index and, for two stages, its |up·x|: 12 bytes (one stage: 8), so at most
48 MiB per layer whatever the text's length, 1.5 GiB for a 32-layer 7B model. The up values cost one more up
mat-vec per token during calibration (the observer sees act only).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..config import (
    KEY_FFN_NEURON_SCALES,
    KEY_FFN_QUANTILES,
    KEY_FFN_THRESHOLDS,
    KEY_FFN_UP_QUANTILES,
    KEY_FFN_UP_THRESHOLDS,
    KEY_SPARSITY,
    KEY_UP_SPARSITY,
)
from ..errors import PowerInferError, UnsupportedError
from ..layers.threshold import QUANTILE_GRID, THRESHOLD_VARIANTS, check_sparsity, quantile_rows
from .perplexity import DEFAULT_BATCH, windows

DEFAULT_TOKENS = 1024
DEFAULT_CTX = 256
MAX_VALUES = 1 << 22  # |act| samples kept per layer
UP_RATIO = 0.5  # two stages by default: the fraction of up rows skipped is this times the sparsity
TABLE_VALUES = 1 << 18  # samples per layer behind a two-stage quantile table (a uniform subsample)
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


def two_stage_rows(score: np.ndarray, h: np.ndarray, ratio: float, max_values: int = TABLE_VALUES,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A two-stage quantile table's rows for one layer: (|h| cut-offs, candidate cut-offs), f32 [len(QUANTILE_GRID)]
    each. For grid sparsity s the candidate cut-off u is the (ratio * s) quantile of the score, and the cut-off is
    the s quantile of m = |h| where score >= u, else -1 (below every cut-off), interpolated as np.quantile does:
    what collect_thresholds computes for the calibrated sparsity, here from at most max_values samples. Sparsity
    0 is (0, 0): dense. A cut-off that would not be positive (the s quantile among the non-candidates, possible
    only when many scores tie) becomes the smallest positive float: every candidate kept, not a dense layer. Both
    rows are made non-decreasing."""
    score = np.asarray(score, dtype=np.float64).reshape(-1)
    h = np.asarray(h, dtype=np.float64).reshape(-1)
    if len(score) > max_values:
        pick = np.random.default_rng(seed).choice(len(score), max_values, replace=False)
        score, h = score[pick], h[pick]
    n = len(score)
    order = np.argsort(score, kind="stable")
    s_sorted, h_by = score[order], h[order]

    def at(sorted_values: np.ndarray, q: float) -> float:  # np.quantile's linear interpolation on sorted data
        pos = q * (len(sorted_values) - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, len(sorted_values) - 1)
        return float(sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo]))

    cut_row = np.zeros(len(QUANTILE_GRID))
    up_row = np.zeros(len(QUANTILE_GRID))
    tiny = float(np.nextafter(np.float32(0), np.float32(1)))
    for k, s in enumerate(QUANTILE_GRID):
        if s == 0.0:
            continue
        u = np.float32(at(s_sorted, ratio * s))
        i0 = int(np.searchsorted(s_sorted, u, side="left"))  # candidates: score >= u, as the run compares
        pos = s * (n - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n - 1)
        ranks = [r - i0 for r in (lo, hi) if r >= i0]
        cand = np.partition(h_by[i0:], ranks) if ranks else None
        v_lo = -1.0 if lo < i0 else float(cand[lo - i0])
        v_hi = -1.0 if hi < i0 else float(cand[hi - i0])
        up_row[k] = float(u)
        cut_row[k] = max(v_lo + (pos - lo) * (v_hi - v_lo), tiny)
    return (np.maximum.accumulate(cut_row).astype(np.float32), np.maximum.accumulate(up_row).astype(np.float32))


def collect_thresholds(llm, ids: list[int], sparsity: float, ctx: int = DEFAULT_CTX, batch: int = DEFAULT_BATCH,
                       on_window: Callable[[int], None] | None = None, scales: bool = True,
                       up_sparsity: float | None = None
                       ) -> tuple[list[float], np.ndarray, list[float], list[np.ndarray] | None,
                                  tuple[list[float], list[float], np.ndarray] | None]:
    """(per-layer cut-offs, quantile table f32 [n_layer, 101], per-layer skipped fraction on ids, per-layer
    neuron scales f32 [n_ff] or None when scales=False, and for two stages (per-layer candidate cut-offs,
    per-layer fraction of up rows skipped on ids, candidate cut-off table f32 [n_layer, 101]), else None) from a
    dense run of `llm` over the token ids (no BOS; windows as in perplexity.py). Two stages: the cut-offs apply
    to |h| among the candidates, and the tables are two_stage_rows' for the ratio up_sparsity / sparsity."""
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
    thresholds, table, skipped, layer_scales, up_cuts, up_skipped, up_table = [], [], [], [], [], [], []
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
            cut_row, up_row = two_stage_rows(mags, h, up_sparsity / sparsity, seed=il)
            table.append(cut_row)
            up_table.append(up_row)
            mags = np.where(mags >= u_cut, h, np.float32(-1))
            col.up_values[il] = []
        else:
            table.append(quantile_rows(mags))
        t = float(np.quantile(mags.astype(np.float64), sparsity)) if sparsity > 0 else 0.0
        thresholds.append(t)
        skipped.append(float(np.mean(mags < np.float32(t))) if sparsity > 0 else 0.0)
        col.values[il], col.neurons[il] = [], []
    two_stage = (up_cuts, up_skipped, np.stack(up_table)) if up_sparsity is not None else None
    return thresholds, np.stack(table), skipped, (layer_scales if scales else None), two_stage


def calibrate(model: str | os.PathLike, out: str | os.PathLike, sparsity: float, text: str | None = None,
              n_tokens: int = DEFAULT_TOKENS, ctx: int = DEFAULT_CTX, threads: int | None = None,
              on_progress: Callable[[str], None] | None = None, scales: bool = True,
              up_sparsity: float | None = None, one_stage: bool = False) -> CalibrationResult:
    """Calibrate `model` for `sparsity` on `text` (None: text sampled from the model) and write the copy `out`
    (atomically: a temporary file in out's folder, renamed when complete). scales=False: the plain |act|
    score, no neuron scales. Two stages (the module docstring) with up_sparsity (< sparsity; None: UP_RATIO *
    sparsity); one_stage=True: the single score rule. Sparsity 0 skips nothing and is one stage."""
    from ..gguf import open_gguf
    from ..gguf.writer import check_free_space, write_gguf
    from ..llm import load

    sparsity = check_sparsity(sparsity)
    if one_stage and up_sparsity is not None:
        raise PowerInferError("--up-sparsity sets the first of two stages: it does not go with --one-stage")
    if up_sparsity is None and not one_stage and sparsity > 0:
        up_sparsity = UP_RATIO * sparsity
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
        from ..layers.ffn import ffn_variant
        from ..layers.moe import require_dense_ffn

        require_dense_ffn(llm.config, "calibrate")
        plain = [il for il, f in enumerate(llm.model.ffns) if f is None]
        if plain:  # (mamba2: mixer-only layers; gemma3n: its own top-k FFN) no FFN object to calibrate there
            raise UnsupportedError(f"calibrate needs a plain SwiGLU/GeGLU FFN in every layer; this "
                                   f"{llm.config.arch} model has none in {len(plain)} of its {len(llm.model.ffns)} "
                                   f"layers (e.g. layer {plain[0]})")
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
        up_cuts, up_skipped, up_table = two if two is not None else (None, None, None)
    with open_gguf(model) as src:
        meta = dict(src.metadata)
        types = dict(src.metadata_types)
        stale = [k for k in meta if k.startswith(KEY_FFN_NEURON_SCALES)]  # a file calibrated before
        for key in (KEY_SPARSITY, KEY_FFN_THRESHOLDS, KEY_FFN_QUANTILES, KEY_UP_SPARSITY, KEY_FFN_UP_THRESHOLDS,
                    KEY_FFN_UP_QUANTILES, *stale):
            meta.pop(key, None)
            types.pop(key, None)
        meta[KEY_SPARSITY] = np.float32(sparsity)
        meta[KEY_FFN_THRESHOLDS] = np.asarray(thresholds, dtype=np.float32)
        meta[KEY_FFN_QUANTILES] = table.astype(np.float32).reshape(-1)  # two stages: the |h| cut-offs
        if up_cuts is not None:
            meta[KEY_UP_SPARSITY] = np.float32(up_sparsity)
            meta[KEY_FFN_UP_THRESHOLDS] = np.asarray(up_cuts, dtype=np.float32)
            meta[KEY_FFN_UP_QUANTILES] = up_table.astype(np.float32).reshape(-1)
        for il, scale in enumerate(layer_scales or ()):
            meta[f"{KEY_FFN_NEURON_SCALES}{il}"] = scale
        write_gguf(out, meta, src.tensors, types=types, magic=src.magic, alignment=src.alignment)
    say(f"wrote {out}")
    return CalibrationResult(out, sparsity, thresholds, len(ids), source, skipped, layer_scales is not None,
                             up_sparsity, up_cuts, up_skipped)
