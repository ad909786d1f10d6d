"""Qwen3 dense models (GGUF arch "qwen3": Qwen3-0.6B, 1.7B, 4B, 8B, ...).

The qwen2 block with two changes: the Q, K and V projections have no biases, and each head of Q and K goes
through its own RMSNorm (blk.N.attn_q_norm.weight, attn_k_norm.weight, f32 [head_dim]) after the projection
and before RoPE, as in llama.cpp. The norm is a plain multiply by the stored weight (Qwen3's HF norms are
ordinary RMSNorms; no "+1" as in Gemma). RoPE uses the NeoX layout (pairs i, i + n_rot/2).

head_dim comes from qwen3.attention.key_length and need not be n_embd / n_head (0.6B: 16 heads of 128 over
n_embd 1024), so the Q rows n_head * head_dim may differ from n_embd. The output head is tied to token_embd in
the small models (no output.weight) and separate in the large ones; the base class handles both.

Per layer:  n = rmsnorm(x) * attn_norm
            q = rope(rmsnorm_head(Wq·n) * q_norm);  k = rope(rmsnorm_head(Wk·n) * k_norm);  v = Wv·n
            h = x + Wo · attn(q, k, v)                               (scale 1/sqrt(head_dim))
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))            m = rmsnorm(h) * ffn_norm

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  qwen3   NeoX RoPE, no q/k/v biases, per-head RMSNorm of Q and K (tensors); head_dim is {arch}.attention.key_length
          (Qwen3-0.6B: 128, not n_embd / n_head = 64); rope base default llama.cpp's 10000 (real files carry it)
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
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "ffn_norm": "ffn_norm.weight",
}


def expected_tensors(c: ModelConfig) -> Expected:
    e = llama_like_expected(c)
    for il in range(c.n_layer):
        e[f"blk.{il}.attn_q_norm.weight"] = ((c.head_dim,), True)
        e[f"blk.{il}.attn_k_norm.weight"] = ((c.head_dim,), True)
    return sparsify_expected(c, e)  # PWRI files (trained predictors): ffn_down_t, fc1, fc2


class Qwen3Model(Model):
    """The pre-norm block of models/base.py with the per-head Q/K norms (rope_neox comes from the config)."""

    LAYER_TENSORS = LAYER_TENSORS
    QK_NORMS = True


SPEC = ArchSpec("qwen3", model=Qwen3Model, expected=expected_tensors, rope_neox=True, yarn=True, pwri=True,
                chat_format="chatml")
_MOE = replace(SPEC, name="qwen3moe", pwri=False, moe=True, moe_norm=True)
VARIANTS = (
    _MOE,
    # vision-language files' text models (as qwen2vl in models/qwen2.py), refused where the M-RoPE sections
    # leave rotated pairs out
    replace(SPEC, name="qwen3vl", text_of="qwen3", mrope_check=True),
    replace(_MOE, name="qwen3vlmoe", text_of="qwen3moe", mrope_check=True),
)
