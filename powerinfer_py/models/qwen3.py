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
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from ..kv_cache import KVCache
from .base import Expected, Model, llama_like_expected, sparsify_expected

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
    LAYER_TENSORS = LAYER_TENSORS

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        return dict(super().attn_plan_kwargs(il, layer), q_norm=layer.q_norm, k_norm=layer.k_norm)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, hd, eps = ids.shape[0], c.head_dim, c.norm_eps
        rope = self.rope_args()

        x = k.get_rows(self.token_embd, ids)  # [N, n_embd]
        plans = self.attn_plans() if n == 1 else None
        if plans is not None:  # one token: each attention block in one C call (kernels/cpu.py), same bits
            return self._fused_decode(plans, x, p0, cache, all_logits)
        for il, L in enumerate(self.layers):
            # attention with per-head Q/K norms before RoPE
            h = k.rmsnorm(x, L.attn_norm, eps)
            q = k.rmsnorm(k.matmul(L.wq, h).reshape(n, c.n_head, hd), L.q_norm, eps)
            kk = k.rmsnorm(k.matmul(L.wk, h).reshape(n, c.n_head_kv, hd), L.k_norm, eps)
            v = k.matmul(L.wv, h).reshape(n, c.n_head_kv, hd)
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, n_head, hd]
            x += k.matmul(L.wo, a.reshape(n, c.n_head * hd))
            # feed-forward (SwiGLU); the predictor (PWRI files) reads the residual x, the FFN its normed copy
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)

        cache.n_past = p0 + n
        return self._head(x, all_logits)
