"""Qwen2 / Qwen2.5 (GGUF arch "qwen2").

The llama block with two differences: the Q, K and V projections carry biases (blk.N.attn_q.bias etc.), and
RoPE uses the NeoX layout (pairs i, i + n_rot/2). The output head is tied to token_embd in the small models
(no output.weight) and separate in the large ones; both are handled by the base class.

Per layer:  h = x + Wo · attn(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)   n = rmsnorm(x) * attn_norm
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))                   m = rmsnorm(h) * ffn_norm
"""
from __future__ import annotations

from ..config import ModelConfig
from .base import Expected, Model, llama_like_expected, sparsify_expected

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias",
    "ffn_norm": "ffn_norm.weight",
}


def expected_tensors(c: ModelConfig) -> Expected:
    e = llama_like_expected(c)
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    for il in range(c.n_layer):
        e[f"blk.{il}.attn_q.bias"] = ((q_dim,), True)
        e[f"blk.{il}.attn_k.bias"] = ((kv_dim,), True)
        e[f"blk.{il}.attn_v.bias"] = ((kv_dim,), True)
    return sparsify_expected(c, e)  # PWRI files (trained predictors): ffn_down_t, fc1, fc2


class Qwen2Model(Model):
    """The pre-norm block of models/base.py with the Q, K, V biases (rope_neox comes from the config)."""

    LAYER_TENSORS = LAYER_TENSORS
    QKV_BIASES = True
