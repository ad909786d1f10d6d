"""Gemma 3n (GGUF arch "gemma3n", the on-device E2B / E4B models) metadata, held by config.ModelConfig as one
Gemma3nLayout.

Keys (arch = "gemma3n"); llama.cpp fixes several of these in its code rather than reading them, so each one's
default here is llama.cpp's fixed value, which real E2B / E4B files also carry:
  attention.sliding_window           window of the sliding layers (required)
  attention.sliding_window_pattern   one bool per layer (True = sliding) or a period; default period 5
                                     (layers il % 5 != 4 slide)
  rope.freq_base(_swa)               RoPE base of the full / sliding layers (_swa default 10000)
  attention.shared_kv_layers         the last N layers compute no K/V: a sliding one attends over layer
                                     n_kv - 2's cache, a full one over layer n_kv - 1's (n_kv = block_count - N;
                                     llama.cpp: n_kv = 20 always, so the default N is block_count - 20)
  activation_sparsity_scale          per layer the std multiplier k of the Gaussian top-k FFN (the converter
                                     writes Normal.icdf(p): 1.6449 for p = 0.95, -inf for p = 0, a dense layer);
                                     default llama.cpp's: the first 10 layers at 1.6448533535003662
  altup.num_inputs, altup.active_idx AltUp streams (default 4) and the one that is computed (default 0; only 0
                                     is run here)
  embedding_length_per_layer_input   width of the per-layer embeddings (default 256)
  final_logit_softcapping            logits -> cap * tanh(logits / cap) (default 30)
The LAuReL rank is the width of blk.0.laurel_l.weight. The attention scale is 1 (the Q norm scales).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config_gemma4 import kv_sources
from .errors import ModelFileError, UnsupportedError

SWA_PERIOD = 5
FREQ_BASE_SWA = 10_000.0
N_LAYER_KV = 20  # llama.cpp: layers from 20 on share K/V
N_SPARSE_LAYERS = 10  # llama.cpp: the first 10 layers run the Gaussian top-k
SPARSITY_STD_MUL = 1.6448533535003662  # Normal(0, 1).icdf(0.95)
N_ALTUP = 4
N_EMBD_PER_LAYER = 256
FINAL_SOFTCAP = 30.0


@dataclass(frozen=True)
class Gemma3nLayout:
    """kv_source: per layer the layer whose K/V cache it attends over (itself for layers that compute K/V);
    std_mul: per layer the Gaussian top-k multiplier k, None for a dense FFN; n_altup: AltUp streams;
    n_embd_per_layer: per-layer embedding width; laurel_rank: LAuReL's low rank."""

    kv_source: tuple[int, ...]
    std_mul: tuple[float | None, ...]
    n_altup: int = N_ALTUP
    n_embd_per_layer: int = N_EMBD_PER_LAYER
    laurel_rank: int = 64

    def has_kv(self, il: int) -> bool:
        return self.kv_source[il] == il


def _sparsity(reader, n_layer: int) -> tuple[float | None, ...]:
    key = reader.key("{arch}.activation_sparsity_scale")
    value = reader.meta.get(key)
    if value is None:
        return tuple(SPARSITY_STD_MUL if il < N_SPARSE_LAYERS else None for il in range(n_layer))
    if (not isinstance(value, list) or len(value) != n_layer
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ModelFileError(f"{reader.f.path}: {key} must be {n_layer} numbers (one per layer), got {value!r}")
    if any(math.isnan(v) or v == math.inf for v in value):
        raise ModelFileError(f"{reader.f.path}: {key} holds NaN or +inf")
    return tuple(None if v == -math.inf else float(v) for v in value)


def gemma3n_keys(reader, n_layer: int) -> dict:
    """ModelConfig fields of a gemma3n file (module docstring): "gemma3n" (a Gemma3nLayout) and the final
    soft-cap, plus what config() pops: "sliding_window", "swa_layers", "base_swa"."""
    path = reader.f.path
    window = reader.positive("{arch}.attention.sliding_window")
    key = reader.key("{arch}.attention.sliding_window_pattern")
    pattern = reader.meta.get(key, SWA_PERIOD)
    if isinstance(pattern, list) and len(pattern) == n_layer and all(isinstance(p, bool) for p in pattern):
        swa = tuple(pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        swa = tuple(il % pattern != pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{path}: {key} must be {n_layer} bools (one per layer) or a period, got {pattern!r}")
    source = kv_sources(path, reader.get("{arch}.attention.shared_kv_layers", max(0, n_layer - N_LAYER_KV)), swa)
    n_altup = reader.positive("{arch}.altup.num_inputs", N_ALTUP)
    if n_altup < 2:
        raise ModelFileError(f"{path}: altup.num_inputs must be >= 2, got {n_altup}")
    if reader.get("{arch}.altup.active_idx", 0) != 0:
        raise UnsupportedError(f"{path}: gemma3n files whose active AltUp stream is not 0 are not supported")
    per_layer = reader.positive("{arch}.embedding_length_per_layer_input", N_EMBD_PER_LAYER)
    laurel = reader.f.tensors.get("blk.0.laurel_l.weight")
    if laurel is None:
        raise ModelFileError(f"{path}: missing required tensor 'blk.0.laurel_l.weight'")
    cap = reader.get("{arch}.final_logit_softcapping", FINAL_SOFTCAP, kind=float)
    if not (math.isfinite(cap) and cap > 0):
        raise ModelFileError(f"{path}: final_logit_softcapping must be a finite number > 0, got {cap}")
    layout = Gemma3nLayout(kv_source=tuple(source), std_mul=_sparsity(reader, n_layer), n_altup=n_altup,
                           n_embd_per_layer=per_layer, laurel_rank=int(laurel.shape[0]))
    return {"gemma3n": layout, "final_softcap": cap, "sliding_window": window, "swa_layers": swa,
            "base_swa": reader.get("{arch}.rope.freq_base_swa", FREQ_BASE_SWA, kind=float)}
