"""Bamboo (GGUF arch "bamboo"): PowerInfer's Mistral-shaped model (GQA, normal RoPE, RMSNorm) with a dReLU FFN.

Per layer exactly the llama block (models/llama.py) except the FFN:
    y = h + Wdown · (relu(Wgate · m) * relu(Wup · m))        m = rmsnorm(h) * ffn_norm
Both factors are ReLUs, so a neuron is zero as soon as either pre-activation is <= 0. ffn.py picks the
dReLU variant from the architecture (whatever powerinfer.hidden_act says); PWRI files bring ffn_down_t and
the per-layer predictor fc1/fc2, whose input is h, the residual after attention, before ffn_norm.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  bamboo  the llama block (Mistral shape, GQA, normal RoPE) with a dReLU FFN
"""
from __future__ import annotations

from .llama import LlamaModel, expected_tensors
from .spec import ArchSpec


class BambooModel(LlamaModel):
    """The llama forward pass; the dReLU lives in the FFN objects (ffn.ffn_variant)."""


__all__ = ["BambooModel", "expected_tensors"]


SPEC = ArchSpec("bamboo", model=BambooModel, expected=expected_tensors, hidden_act="relu", ffn_variant="dreglu",
                pwri=True)
