"""Activation profiling: how often each FFN neuron fires, and how large |act| is, per layer, over a text.

profile_model() runs the model densely over calibration tokens (observe.py) and accumulates, per layer:

  counts  int64 [n_ff]  tokens on which neuron i was active. ReLU-family FFNs (reglu, fatreglu, dreglu, relu):
                        act != 0, the definition the sparse engine skips on. Other FFNs (swiglu, geglu, gelu)
                        have no exact zeros: a neuron counts as active where |act| > count_threshold, the
                        layer's |act| quantile at `count_sparsity` measured on the first batch of tokens, so
                        the counts say which neurons a threshold at that sparsity would keep.
  abs histogram         of |act| over every (token, neuron) of the layer: exact zeros, values below 1e-8,
                        HIST_BINS log-spaced bins of 1/BINS_PER_DECADE decade from 1e-8 to 1e4, values above.

write_profile() writes, under OUT:
  activation/activation_N.pt   PowerInfer's statistics files: a 1-D int64 tensor of n_ff counts per layer N,
                               written as torch zip checkpoints without torch (convert/torch_pt.save_pt).
  profile.json                 the summary below; load_profile() reads it back.
  calibration.txt              the calibration text when it was sampled from the model (no --text).

profile.json (all fractions in [0, 1]):
  version, model, arch, ffn_variant, relu_family (bool), n_layer, n_ff, tokens (text tokens profiled; BOS
  tokens are run but not counted), ctx (tokens per chunk), source ("text", "sampled" or "ids": token ids given by a caller),
  active_definition ("act != 0" or "|act| > count_threshold"), count_sparsity (non-ReLU only),
  mean_active_fraction, and layers: one object per layer with
    layer, active_fraction (mean over tokens and neurons), dead_fraction (neurons never active),
    hot_fraction_80 (smallest fraction of neurons holding 80% of all activations), count_threshold,
    abs_quantiles {"0.05": t, ..., "0.95": t, "0.99": t}: the fraction q of all |act| values lies below t,
    abs_hist {log10_min, bins_per_decade, zeros, below, above, counts [HIST_BINS]}.
  abs_threshold(layer_entry, s) turns a layer's histogram into the threshold t below which a fraction s of
  the |act| values lies (log-linear inside a bin): what threshold calibration needs for a skipped fraction s.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import PowerInferError
from ..layers.ffn import RELU_FAMILY, ffn_variant

LOG10_MIN, LOG10_MAX, BINS_PER_DECADE = -8, 4, 32
HIST_BINS = (LOG10_MAX - LOG10_MIN) * BINS_PER_DECADE
QUANTILES = tuple(round(0.05 * i, 2) for i in range(1, 20)) + (0.99,)
JSON_NAME, ACT_DIR, TEXT_NAME = "profile.json", "activation", "calibration.txt"
VERSION = 1
_ACT_FILE = re.compile(r"activation_(\d+)\.pt")


@dataclass
class ActivationProfile:
    """Per-layer activation counts and |act| histograms; add(layer, act) accumulates one batch."""
    n_layer: int
    n_ff: int
    relu_family: bool
    count_sparsity: float = 0.5  # non-ReLU: the quantile of |act| a neuron must exceed to count as active
    tokens: np.ndarray = field(init=False)  # int64 [n_layer]
    counts: np.ndarray = field(init=False)  # int64 [n_layer, n_ff]
    hist: np.ndarray = field(init=False)  # int64 [n_layer, HIST_BINS + 3]: zeros, below, bins..., above
    count_threshold: np.ndarray = field(init=False)  # f32 [n_layer]; 0 for ReLU families, NaN until set

    def __post_init__(self):
        if not 0.0 <= self.count_sparsity < 1.0:
            raise PowerInferError(f"count sparsity must lie in [0, 1), got {self.count_sparsity}")
        self.tokens = np.zeros(self.n_layer, dtype=np.int64)
        self.counts = np.zeros((self.n_layer, self.n_ff), dtype=np.int64)
        self.hist = np.zeros((self.n_layer, HIST_BINS + 3), dtype=np.int64)
        self.count_threshold = np.full(self.n_layer, 0.0 if self.relu_family else np.nan, dtype=np.float32)

    def add(self, layer: int, act: np.ndarray) -> None:
        """Accumulate act f32 [n_tok, n_ff] (the activated gating values of n_tok tokens)."""
        a = np.abs(act)
        if self.relu_family:
            active = act != 0
        else:
            if np.isnan(self.count_threshold[layer]):
                self.count_threshold[layer] = np.quantile(a, self.count_sparsity)
            active = a > self.count_threshold[layer]
        self.counts[layer, :act.shape[1]] += active.sum(axis=0)  # narrower layers (gemma4): the leading entries
        self.tokens[layer] += act.shape[0]
        self.hist[layer] += abs_histogram(a)

    def fractions(self, layer: int) -> np.ndarray:
        """f64 [n_ff]: per-neuron activation frequency."""
        return self.counts[layer] / max(1, int(self.tokens[layer]))


def abs_histogram(a: np.ndarray) -> np.ndarray:
    """int64 [HIST_BINS + 3] of the values |a| >= 0: zeros, below 1e-8, the log-spaced bins, above 1e4."""
    v = a.reshape(-1)
    nz = v[v > 0]
    idx = np.floor((np.log10(nz) - LOG10_MIN) * BINS_PER_DECADE)
    idx = np.clip(idx, -1, HIST_BINS).astype(np.int64) + 2  # -1 -> 1 (below), HIST_BINS -> last (above)
    out = np.bincount(idx, minlength=HIST_BINS + 3).astype(np.int64)
    out[0] = v.size - nz.size  # exact zeros (and NaN, which is no activity either)
    return out


def abs_threshold(layer_entry: dict, fraction: float) -> float:
    """The |act| value below which `fraction` of a layer's values lie, from its profile.json entry
    (abs_hist): 0 if the zeros alone make up that fraction; log-linear interpolation inside a bin."""
    h = layer_entry["abs_hist"]
    return _threshold(np.asarray(h["counts"], dtype=np.float64), h["zeros"], h["below"], h["above"],
                      h["log10_min"], h["bins_per_decade"], fraction)


def _threshold(counts: np.ndarray, zeros: int, below: int, above: int, lo: float, bpd: int,
               fraction: float) -> float:
    if not 0.0 <= fraction <= 1.0:
        raise PowerInferError(f"fraction must lie in [0, 1], got {fraction}")
    total = zeros + below + counts.sum() + above
    if total == 0:
        return float("nan")
    target = fraction * total
    if target <= zeros:
        return 0.0
    if target <= zeros + below:
        return float(10.0 ** lo)
    cum = zeros + below + np.cumsum(counts)
    i = int(np.searchsorted(cum, target))
    if i >= len(counts):
        return float(10.0 ** (lo + len(counts) / bpd))
    before = cum[i] - counts[i]
    t = (target - before) / counts[i] if counts[i] else 1.0
    return float(10.0 ** (lo + (i + t) / bpd))


def _hot_fraction(counts: np.ndarray, share: float = 0.8) -> float:
    """Smallest fraction of neurons that together hold `share` of the layer's activations."""
    total = counts.sum()
    if total == 0:
        return 0.0
    cum = np.cumsum(np.sort(counts)[::-1])
    return float((np.searchsorted(cum, share * total) + 1) / len(counts))


def summary(prof: ActivationProfile, meta: dict) -> dict:
    """The profile.json object (see the module docstring); meta adds model, arch, ... at the top."""
    layers = []
    for il in range(prof.n_layer):
        h = prof.hist[il]
        counts = h[2:-1].astype(np.float64)
        entry = {
            "layer": il,
            "active_fraction": float(prof.fractions(il).mean()),
            "dead_fraction": float(np.mean(prof.counts[il] == 0)),
            "hot_fraction_80": _hot_fraction(prof.counts[il]),
            "count_threshold": float(prof.count_threshold[il]),
            "abs_quantiles": {f"{q:g}": _threshold(counts, int(h[0]), int(h[1]), int(h[-1]), LOG10_MIN,
                                                   BINS_PER_DECADE, q) for q in QUANTILES},
            "abs_hist": {"log10_min": LOG10_MIN, "bins_per_decade": BINS_PER_DECADE, "zeros": int(h[0]),
                         "below": int(h[1]), "above": int(h[-1]), "counts": [int(c) for c in h[2:-1]]},
        }
        layers.append(entry)
    total = prof.tokens.sum() * prof.n_ff
    out = {"version": VERSION, **meta, "n_layer": prof.n_layer, "n_ff": prof.n_ff,
           "relu_family": prof.relu_family, "tokens": int(prof.tokens[0]) if prof.n_layer else 0,
           "active_definition": "act != 0" if prof.relu_family else "|act| > count_threshold"}
    if not prof.relu_family:
        out["count_sparsity"] = prof.count_sparsity
    out["mean_active_fraction"] = float(prof.counts.sum() / total) if total else float("nan")
    out["layers"] = layers
    return out


@dataclass
class ProfileResult:
    profile: ActivationProfile
    summary: dict
    calibration_text: str | None  # the sampled text (source "sampled"), else None


def profile_model(llm, text: str | None, n_tokens: int | None = None, *, ids: Sequence[int] | None = None,
                  ctx: int = 512, batch: int = 256, add_bos: bool = True, count_sparsity: float = 0.5,
                  seed: int = 0, progress: Callable[[int, int], None] | None = None) -> ProfileResult:
    """Profile a loaded model (powerinfer_py.load) over `text`, or over tokens sampled from it when text is
    None, or over the token `ids` given. n_tokens: at most this many tokens (None: the whole text; sampled:
    1024). add_bos=False runs the chunks without a BOS token (observe.observe)."""
    from .observe import CalibrationTokens, calibration_tokens, observe

    c = llm.config
    variant = ffn_variant(c)
    prof = ActivationProfile(c.n_layer, c.n_ff, variant in RELU_FAMILY, count_sparsity)
    if ids is not None:
        cal = CalibrationTokens([int(i) for i in ids][:n_tokens], "ids", "")
    else:
        cal = calibration_tokens(llm, text, n_tokens, seed=seed)
    n = observe(llm, cal.ids, lambda il, p, act: prof.add(il, act), ctx=ctx, batch=batch, add_bos=add_bos,
                progress=progress)
    meta = {"model": str(llm.path), "arch": c.arch, "ffn_variant": variant, "ctx": min(ctx, llm.n_ctx),
            "source": cal.source}
    result = summary(prof, meta)
    assert result["tokens"] == n
    return ProfileResult(prof, result, cal.text if cal.source == "sampled" else None)


def write_profile(out: str | os.PathLike, result: ProfileResult) -> Path:
    """Write activation/activation_N.pt, profile.json (and calibration.txt for sampled text) under out."""
    from ..convert.output import atomic_output
    from ..convert.torch_pt import save_pt

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PowerInferError(f"{out}: exists and is not a folder")
    (out / ACT_DIR).mkdir(parents=True, exist_ok=True)
    for il in range(result.profile.n_layer):
        save_pt(out / ACT_DIR / f"activation_{il}.pt", result.profile.counts[il])
    if result.calibration_text is not None:
        with atomic_output(out / TEXT_NAME) as tmp:
            tmp.write_text(result.calibration_text, encoding="utf-8")
    with atomic_output(out / JSON_NAME) as tmp:
        tmp.write_text(json.dumps(result.summary, indent=1) + "\n", encoding="utf-8")
    return out


def load_profile(folder: str | os.PathLike) -> dict:
    """profile.json of a profile folder (see the module docstring)."""
    path = Path(folder) / JSON_NAME
    if not path.is_file():
        raise PowerInferError(f"{folder}: no {JSON_NAME} (not a folder written by `powerinfer profile`)")
    from ..convert.safetensors import parse_json

    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # parse_json: deep nesting and huge integers too
        raise PowerInferError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise PowerInferError(f"{path}: not a profile summary (no 'layers' list)")
    return data


def read_activation_counts(folder: str | os.PathLike) -> list[np.ndarray]:
    """The per-layer counts of a folder of activation_N.pt files (ours or PowerInfer's), in numeric layer
    order (activation_2 before activation_10), read with the restricted .pt reader."""
    from ..convert.source import SourceTensor
    from ..convert.torch_pt import read_pt

    folder = Path(folder)
    if (folder / ACT_DIR).is_dir():
        folder = folder / ACT_DIR
    files = {int(m.group(1)): p for p in folder.glob("activation_*.pt") if (m := _ACT_FILE.fullmatch(p.name))}
    if not files:
        raise PowerInferError(f"{folder}: no activation_N.pt files")
    if sorted(files) != list(range(len(files))):
        missing = min(set(range(len(files))) - set(files))
        raise PowerInferError(f"{folder}: activation_{missing}.pt is missing")
    out = []
    for il in range(len(files)):
        t = read_pt(files[il])
        if not isinstance(t, SourceTensor) or len(t.shape) != 1:
            raise PowerInferError(f"{files[il]}: expected a 1-D tensor of activation counts")
        out.append(np.asarray(t.read()))
    return out
