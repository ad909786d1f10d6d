"""Ministral 3 and the Mistral models stored as GGUF arch "mistral3".

The llama block of models/llama.py (normal RoPE, GQA, SwiGLU FFN or llama's experts, rope_freqs.weight when the
file has it) with two additions, both read by config_archs.ArchKeys.mistral3:
  - attention temperature: with {arch}.attention.temperature_scale b > 0, q is multiplied after RoPE by
        t(pos) = 1 + b * ln(floor(pos / L) + 1),   L = rope.scaling.original_context_length
    so t = 1 for the first L positions (16384 on Ministral 3) and grows slowly past them, keeping attention
    sharp at long range. Scaling q scales every score of that query, so K and V in the cache are untouched.
  - YaRN files with rope.scaling.yarn_log_multiplier: their own scale of the rotated dims (config).
Both were checked against llama.cpp's results on synthetic files (tests/test_mistral3.py), which is how the
position without a +1 offset was settled.

One token takes the one-call C decode step while t(pos) = 1; past L it takes the Python path, which applies t.
"""
from __future__ import annotations

import numpy as np

from .llama import LlamaModel, expected_tensors  # noqa: F401  (the tensors are llama's)
from .spec import ArchSpec


class Mistral3Model(LlamaModel):
    def q_temperature(self, pos: np.ndarray) -> np.ndarray | None:
        c = self.config
        if not c.attn_temp_scale or int(pos[-1]) < c.attn_temp_floor:
            return None
        steps = np.floor(pos.astype(np.float64) / c.attn_temp_floor)
        return (1.0 + c.attn_temp_scale * np.log(steps + 1.0)).astype(np.float32)


def read_args(r, d: dict) -> None:
    m3 = r.mistral3(d["n_ctx_train"], bool(d["rope_factors"]))
    d["rope_mscale"] = m3.pop("rope_mscale", d["rope_mscale"])
    d.update(m3)


SPEC = ArchSpec("mistral3", model=Mistral3Model, expected=expected_tensors, yarn=True, moe_norm=True,
                expert_width_key="{arch}.feed_forward_length", chat_format="mistral")
