"""Qwen2 / Qwen2.5 (GGUF arch "qwen2").

The llama block with two differences: the Q, K and V projections carry biases (blk.N.attn_q.bias etc.), and
RoPE uses the NeoX layout (pairs i, i + n_rot/2). The output head is tied to token_embd in the small models
(no output.weight) and separate in the large ones; both are handled by the base class.

Per layer:  h = x + Wo · attn(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)   n = rmsnorm(x) * attn_norm
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))                   m = rmsnorm(h) * ffn_norm
"""
from __future__ import annotations


import numpy as np

from ..config import ModelConfig
from ..kv_cache import KVCache
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
    LAYER_TENSORS = LAYER_TENSORS

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        return dict(super().attn_plan_kwargs(il, layer), bq=layer.bq, bk=layer.bk, bv=layer.bv)

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
            # attention; the biases broadcast over the N rows (matmul returns fresh arrays, so += is safe)
            h = k.rmsnorm(x, L.attn_norm, eps)
            q = k.matmul(L.wq, h)
            q += L.bq
            kk = k.matmul(L.wk, h)
            kk += L.bk
            v = k.matmul(L.wv, h)
            v += L.bv
            q = q.reshape(n, c.n_head, hd)
            kk = kk.reshape(n, c.n_head_kv, hd)
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v.reshape(n, c.n_head_kv, hd))
            a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, n_head, hd]
            x += k.matmul(L.wo, a.reshape(n, c.n_head * hd))
            # feed-forward (SwiGLU)
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)

        cache.n_past = p0 + n
        return self._head(x, all_logits)
