"""Qwen2 / Qwen2.5 (GGUF arch "qwen2").

The llama block with two differences: the Q, K and V projections carry biases (blk.N.attn_q.bias etc.), and
RoPE uses the NeoX layout (pairs i, i + n_rot/2). The output head is tied to token_embd in the small models
(no output.weight) and separate in the large ones; both are handled by the base class.

Per layer:  h = x + Wo · attn(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)   n = rmsnorm(x) * attn_norm
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))                   m = rmsnorm(h) * ffn_norm

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  qwen2   NeoX RoPE, rope base default 1e6, q/k/v biases (tensors, not config)
  qwen3moe, qwen2moe  qwen3 / qwen2 with a mixture-of-experts FFN (below); qwen2moe adds a shared expert
"""
from __future__ import annotations

from dataclasses import replace

from ..config import ModelConfig
from .base import Expected, Model, llama_like_expected, sparsify_expected
from .spec import ArchSpec

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


SPEC = ArchSpec("qwen2", model=Qwen2Model, expected=expected_tensors, rope_neox=True, yarn=True, rope_base=1_000_000.0,
                pwri=True, chat_format="chatml")
VARIANTS = (
    replace(SPEC, name="qwen2moe", pwri=False, moe=True, moe_norm=False, shared_expert="required"),
    # a vision-language file's text model: with text-only input every M-RoPE section rotates by the same position,
    # which is qwen2's RoPE (checked against llama.cpp: tests/test_vl_text.py); keys stay qwen2vl.*
    replace(SPEC, name="qwen2vl", text_of="qwen2"),
)
