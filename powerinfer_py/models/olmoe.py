"""AllenAI OLMoE (GGUF arch "olmoe": OLMoE-1B-7B), as llama.cpp's olmoe graph computes it.

The pre-norm llama block (models/base.py) with olmo2's Q/K norms and experts in every layer:
    n = rmsnorm(x) * attn_norm
    q = rmsnorm(Wq·n) * q_norm      one RMSNorm over all n_head * head_dim values (blk.N.attn_q_norm.weight)
    k = rmsnorm(Wk·n) * k_norm      likewise over n_head_kv * head_dim (blk.N.attn_k_norm.weight)
    v = Wv·n;  q, k = rope_neox(q), rope_neox(k)                      (pairs i, i + n_rot/2; no factors)
    h = x + Wo · attn(q, k, v)                                          (scores x 1/sqrt(head_dim))
    x = h + moe(rmsnorm(h) * ffn_norm)
moe: moe.MoEFFN, a softmax router over expert_count experts, top expert_used_count, their softmax weights used
as they are (not renormalized, no scale), SwiGLU experts feed_forward_length wide (llama.cpp reads the experts'
width from that key for this arch). output.weight is required by llama.cpp (no tied head in the real files);
a file without it would use token_embd.weight here. One-token steps run each attention block as one C call
(step_attn.c with its whole-width Q/K norm switch), with the Python path's bits.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  olmoe   (OLMoE) the llama block with NeoX RoPE, RMSNorms over the whole Q and K projections (as olmo2) and
          experts in every layer (feed_forward_length wide, softmax router, weights not renormalized)
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from .base import Expected, Model, llama_like_expected
from .llama import LAYER_TENSORS
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    e = llama_like_expected(c)
    for il in range(c.n_layer):
        e[f"blk.{il}.attn_q_norm.weight"] = ((c.n_head * c.head_dim,), True)
        e[f"blk.{il}.attn_k_norm.weight"] = ((c.n_head_kv * c.head_dim,), True)
    return e


class OlmoeModel(Model):
    """base.Model's pre-norm forward with whole-width Q/K norms; the FFNs are experts (base.build_moe)."""

    LAYER_TENSORS = {**LAYER_TENSORS, "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}

    def _qkv(self, L, h: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q f32 [N, n_head, head_dim], k and v [N, n_head_kv, head_dim]: q and k normed over their whole width
        before they are split into heads."""
        c, k = self.config, self.kernels
        q = k.rmsnorm(k.matmul(L.wq, h), L.q_norm, c.norm_eps)
        kk = k.rmsnorm(k.matmul(L.wk, h), L.k_norm, c.norm_eps)
        v = k.matmul(L.wv, h)
        return (q.reshape(n, c.n_head, c.head_dim), kk.reshape(n, c.n_head_kv, c.head_dim),
                v.reshape(n, c.n_head_kv, c.head_dim))

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        return dict(super().attn_plan_kwargs(il, layer), q_norm=layer.q_norm, k_norm=layer.k_norm,
                    qk_norm_full=True)


SPEC = ArchSpec("olmoe", model=OlmoeModel, expected=expected_tensors, rope_neox=True, moe=True, moe_norm=False,
                expert_width_key="{arch}.feed_forward_length")
