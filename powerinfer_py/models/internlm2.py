"""Shanghai AI Lab InternLM2 / InternLM2.5 (GGUF arch "internlm2": 1.8B, 7B, 20B, base and chat).

The llama block under its own name. The checkpoint's fused, head-grouped wqkv is split by llama.cpp's converter
into attn_q / attn_k / attn_v, with the Q and K rows permuted as for llama, so the normal RoPE layout (pairs
2i, 2i + 1) applies:

Per layer:  n = rmsnorm(x) * attn_norm
            h = x + Wo · attn(rope(Wq · n), rope(Wk · n), Wv · n)     (GQA, scale 1/sqrt(head_dim))
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))             m = rmsnorm(h) * ffn_norm
Logits: rmsnorm(x) * output_norm, then output.weight, which llama.cpp requires for this arch (never tied).

llama.cpp passes no RoPE frequency factors here, so rope_freqs.weight is not read (YaRN or linear scaling from
the metadata still apply; InternLM2.5's "dynamic" NTK scaling is not written by the converter). Optional q/k/v
biases are added; there is no output bias. Whole heads rotate, as llama.cpp asserts.
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from .base import Expected
from .exaone import ExaoneModel
from .exaone import expected_tensors as exaone_expected
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    """exaone's tensors with output.weight required and no rope_freqs.weight."""
    e = exaone_expected(c)
    e.pop("rope_freqs.weight")
    e["output.weight"] = ((c.n_vocab, c.n_embd), True)
    return e


class InternLM2Model(ExaoneModel):
    """ExaoneModel's llama block (whole heads rotate, no output bias) with normal RoPE (config) and no RoPE
    factors tensor."""

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        self.rope_freqs = np.array(config.rope_factors, dtype=np.float32) if config.rope_factors else None


__all__ = ["InternLM2Model", "expected_tensors"]


SPEC = ArchSpec("internlm2", model=InternLM2Model, expected=expected_tensors, yarn=True)
