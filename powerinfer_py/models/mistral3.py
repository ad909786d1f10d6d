"""Ministral 3 and the Mistral models stored as GGUF arch "mistral3".

The llama block of models/llama.py (normal RoPE, GQA, SwiGLU FFN or llama's experts, rope_freqs.weight when the
file has it) with two additions, both read by mistral3_keys below:
  - attention temperature: with {arch}.attention.temperature_scale b > 0, q is multiplied after RoPE by
        t(pos) = 1 + b * ln(floor(pos / L) + 1),   L = rope.scaling.original_context_length
    so t = 1 for the first L positions (16384 on Ministral 3) and grows slowly past them, keeping attention
    sharp at long range. Scaling q scales every score of that query, so K and V in the cache are untouched.
  - YaRN files with rope.scaling.yarn_log_multiplier: their own scale of the rotated dims (config).
Both were checked against llama.cpp's results on synthetic files (tests/test_mistral3.py), which is how the
position without a +1 offset was settled.

One token takes the one-call C decode step while t(pos) = 1; past L it takes the Python path, which applies t.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  mistral3 (Ministral 3, Mistral Small 3.x files of that arch) the llama block (normal RoPE; experts as llama's,
          their width feed_forward_length) plus two things: {arch}.attention.temperature_scale b (optional) scales q
          after RoPE by 1 + b * ln(floor(pos / L) + 1), L = rope.scaling.original_context_length (default
          context_length): 1 below position L; and with YaRN and rope.scaling.yarn_log_multiplier m the rotated dims
          are scaled by (1 + 0.1 ln F) / (1 + 0.1 m ln F) (F the YaRN factor; without m, by 1 + 0.1 ln F as for
          llama). Both checked against llama.cpp's results on synthetic files (tests/test_mistral3.py): the position
          has no +1 offset, and the YaRN scale is not multiplied by 1 + 0.1 ln F again.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelFileError
from .llama import LlamaModel, expected_tensors  # noqa: F401  (the tensors are llama's)
from .spec import ArchSpec


class Mistral3Model(LlamaModel):
    def q_temperature(self, pos: np.ndarray) -> np.ndarray | None:
        c = self.config
        if not c.attn_temp_scale or int(pos[-1]) < c.attn_temp_floor:
            return None
        steps = np.floor(pos.astype(np.float64) / c.attn_temp_floor)
        return (1.0 + c.attn_temp_scale * np.log(steps + 1.0)).astype(np.float32)


def mistral3_keys(r, n_ctx_train: int, yarn: bool) -> dict:
    """mistral3's attention temperature (attn_temp_scale, attn_temp_floor) and, for YaRN files with
    rope.scaling.yarn_log_multiplier L, the scale of the rotated dims (module docstring)."""
    out: dict = {}
    orig = r.positive("{arch}.rope.scaling.original_context_length", n_ctx_train)
    beta = r.get("{arch}.attention.temperature_scale", 0.0, kind=float)
    if not math.isfinite(beta) or beta < 0:
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.attention.temperature_scale')} must be >= 0, "
                             f"got {beta}")
    if beta:
        out.update(attn_temp_scale=beta, attn_temp_floor=orig)
    log_mul = r.get("{arch}.rope.scaling.yarn_log_multiplier", 0.0, kind=float)
    if yarn and log_mul:
        factor = r.get("{arch}.rope.scaling.factor", kind=float)

        def mscale(m: float) -> float:
            return 1.0 if factor <= 1 else 1.0 + 0.1 * m * math.log(factor)
        out["rope_mscale"] = mscale(1.0) / mscale(log_mul)
    return out


def read_args(r, d: dict) -> None:
    m3 = mistral3_keys(r, d["n_ctx_train"], bool(d["rope_factors"]))
    d["rope_mscale"] = m3.pop("rope_mscale", d["rope_mscale"])
    d.update(m3)


SPEC = ArchSpec("mistral3", model=Mistral3Model, expected=expected_tensors, yarn=True, moe_norm=True,
                expert_width_key="{arch}.feed_forward_length", chat_format="mistral")
