"""Cohere's metadata (GGUF archs "command-r": Command R / R+, Aya 23, Aya Expanse; "cohere2": Command R7B,
Command A, the text part of Aya Vision), read for config.ModelConfig.

Both archs (llama.cpp's loaders, src/models/command-r.cpp and cohere2.cpp):
  attention.layer_norm_epsilon  LayerNorm eps (no biases anywhere), read through config's LayerNorm arch list
  logit_scale                   the logits are MULTIPLIED by it (0 or absent: unscaled); optional for command-r,
                                required for cohere2, as llama.cpp's get_key calls say
  RoPE is the normal layout (pairs 2i, 2i+1; llama.cpp's rope type NORM for both; the converter permutes nothing
  because the HF model rotates interleaved pairs too); rope.dimension_count may be < head_dim (cohere2's
  rotary_pct).
cohere2 only:
  attention.sliding_window          window of the sliding layers (required)
  attention.sliding_window_pattern  one bool per layer (True = sliding) or a period n (default 4): layer il
                                    slides when il % n < n - 1, every layer when n is 0 (llama.cpp's
                                    set_swa_pattern without dense_first)
  the sliding layers rotate q and k; the global ones use no RoPE at all (no_rope_layers). rope.freq_base_swa is
  read by llama.cpp but its graph never uses it (every sliding layer rotates with rope.freq_base): ignored here.
command-r's optional per-head Q/K LayerNorms (Command R+) are tensors: models/command_r.py.
"""
from __future__ import annotations

import math

from .errors import ModelFileError

COHERE_ARCHS = ("command-r", "cohere2")
COHERE2_SWA_PERIOD = 4  # llama.cpp's default pattern for cohere2: 3 sliding layers, then a global one


def cohere2_swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    """(sliding_window, swa_layers, RoPE base of the sliding layers) of a cohere2 file; r: config._Reader."""
    window = r.positive("{arch}.attention.sliding_window")
    key = r.key("{arch}.attention.sliding_window_pattern")
    pattern = r.meta.get(key, COHERE2_SWA_PERIOD)
    if isinstance(pattern, list):
        if len(pattern) != n_layer or not all(isinstance(v, (bool, int)) for v in pattern):
            raise ModelFileError(f"{r.f.path}: {key} must hold one flag per layer ({n_layer}), got {pattern!r:.80}")
        layers = tuple(bool(v) for v in pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 0:
        layers = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{r.f.path}: {key} must be a period >= 0 or one flag per layer, got {pattern!r:.80}")
    return window, layers, rope_freq_base


def cohere_keys(r, n_layer: int) -> dict:
    """ModelConfig fields of a command-r / cohere2 file (logit_mul; cohere2's RoPE-less global layers); {} for the
    other architectures. r: config._Reader."""
    if r.arch not in COHERE_ARCHS:
        return {}
    scale = r.get("{arch}.logit_scale", 0.0 if r.arch == "command-r" else None, kind=float)
    if not math.isfinite(scale):
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.logit_scale')} must be finite, got {scale}")
    out = {"logit_mul": scale if scale else 1.0}
    if r.arch == "cohere2":
        _, layers, _ = cohere2_swa(r, n_layer, 0.0)
        out["no_rope_layers"] = tuple(not swa for swa in layers)
    return out
