"""Metadata of three llama-style architectures, read for ModelConfig (config.py calls these with its _Reader).

  hunyuan-dense (Tencent Hunyuan 0.5B / 1.8B / 4B / 7B dense): NeoX RoPE. The NTK "alpha" scaling of the HF
          checkpoints is usually baked into {arch}.rope.freq_base by the converter; a file that stores
          {arch}.rope.scaling.alpha instead gets llama.cpp's base * alpha^(d / (d - 2)), d = head_dim. M-RoPE
          sections (the vision-language variant's XD-RoPE) are refused. An expert_count of 0 or 1 means dense.
  apertus (Swiss AI Apertus 8B / 70B): NeoX RoPE (optional rope_freqs.weight: LLaMA 3 scaling); xIELU activation
          with learned per-layer parameters xielu.alpha_n, xielu.alpha_p, xielu.beta, xielu.eps (keys without
          the arch prefix, as llama.cpp names them; each an array of n_layer floats or one float for all
          layers, all required). They are stored raw: models/apertus.py applies the softplus as ggml_xielu does.
  seed_oss (ByteDance Seed-OSS-36B): NeoX RoPE; nothing beyond the shared keys.
"""
from __future__ import annotations

import math

from .errors import ModelFileError, UnsupportedError

XIELU_KEYS = ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps")


def hunyuan_rope_base(r, freq_base: float, head_dim: int) -> float:
    """hunyuan-dense's RoPE base: {arch}.rope.scaling.alpha (absent or <= 0: none) scales it by
    alpha^(head_dim / (head_dim - 2)), as llama.cpp's loader does; M-RoPE sections are refused."""
    sections = r.meta.get(r.key("{arch}.rope.dimension_sections"))
    if isinstance(sections, list) and len(sections) >= 2 and sections[0] > 0 and sections[1] > 0:
        raise UnsupportedError(f"{r.f.path}: a {r.arch} file with M-RoPE sections ({sections}, the "
                               "vision-language XD-RoPE) is not supported")
    alpha = r.get("{arch}.rope.scaling.alpha", 0.0, kind=float)
    if not math.isfinite(alpha):
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.rope.scaling.alpha')} must be finite, got {alpha}")
    if alpha <= 0:
        return freq_base
    if head_dim <= 2:
        raise ModelFileError(f"{r.f.path}: RoPE alpha scaling needs a head width above 2, got {head_dim}")
    return float(freq_base * alpha ** (head_dim / (head_dim - 2)))


def apertus_keys(r, n_layer: int) -> dict:
    """{"xielu": per layer (alpha_n, alpha_p, beta, eps)} from the four xielu.* keys."""
    columns = []
    for key in XIELU_KEYS:
        value = r.meta.get(key)
        if value is None:
            raise ModelFileError(f"{r.f.path}: missing required metadata key {key!r} (the xIELU activation's "
                                 "per-layer parameters)")
        values = value if isinstance(value, list) else [value] * n_layer
        if len(values) != n_layer or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             and math.isfinite(v) for v in values):
            raise ModelFileError(f"{r.f.path}: metadata key {key!r} must be one finite number or {n_layer} "
                                 f"(one per layer), got {value!r}")
        columns.append([float(v) for v in values])
    return {"xielu": tuple(zip(*columns))}
