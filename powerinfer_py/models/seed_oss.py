"""ByteDance Seed-OSS (GGUF arch "seed_oss": Seed-OSS-36B Base / Instruct).

The llama block with NeoX RoPE and Q/K/V biases (the checkpoint's attention_bias; no output bias), whose FFN
pre-norm is stored as blk.N.post_attention_norm.weight (the HF post_attention_layernorm, llama.cpp's ATTN_POST_NORM for
this arch) instead of ffn_norm.weight:

Per layer:  n = rmsnorm(x) * attn_norm
            h = x + Wo · attn(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)   (GQA, scale 1/sqrt(head_dim))
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))                   m = rmsnorm(h) * post_attention_norm
Logits: rmsnorm(x) * output_norm, then output.weight (or token_embd.weight when the file has none).

llama.cpp passes no RoPE frequency factors for this arch, so rope_freqs.weight is not read (YaRN from the
metadata still applies). Everything else is LlamaModel: the biases are optional per layer, one-token steps run
the attention block as one C call, the FFN is ffn.FFN's SwiGLU (threshold mode after `powerinfer calibrate`).

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  seed_oss (ByteDance Seed-OSS-36B): NeoX RoPE; nothing beyond the shared keys.
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from .base import Expected
from .llama import ATTN_BIASES, LAYER_TENSORS, LlamaModel
from .llama import expected_tensors as llama_expected
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors with ffn_norm renamed post_attention_norm; optional q/k/v biases, no rope_freqs.weight."""
    e = llama_expected(c)
    e.pop("rope_freqs.weight")
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "post_attention_norm.weight"] = e.pop(p + "ffn_norm.weight")
    return e


class SeedOssModel(LlamaModel):
    """LlamaModel reading the FFN norm from post_attention_norm.weight and no RoPE factors tensor."""

    LAYER_TENSORS = {**LAYER_TENSORS, "ffn_norm": "post_attention_norm.weight", **ATTN_BIASES}

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        self.rope_freqs = np.array(config.rope_factors, dtype=np.float32) if config.rope_factors else None


__all__ = ["SeedOssModel", "expected_tensors"]


SPEC = ArchSpec("seed_oss", model=SeedOssModel, expected=expected_tensors, rope_neox=True, yarn=True)
