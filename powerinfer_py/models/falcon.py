"""Falcon (GGUF arch "falcon"; ReluFalcon in PowerInfer files): a parallel attention + MLP block.

Per layer, with x the layer input:
    n = layernorm(x) * attn_norm + attn_norm_b
    m = n, or layernorm(x) * attn_norm_2 + attn_norm_2_b when the file has attn_norm_2 (Falcon-40B)
    q, k, v = split(Wqkv · n)     rows [all q heads | all k heads | all v heads] (the converter regroups 40B)
    a = attention(rope_neox(q), rope_neox(k), v)                  grouped-query, 1/sqrt(head_dim)
    x = x + Wo · a + ffn(m)       ffn: Wdown · act(Wup · m), act relu (ReluFalcon) or gelu (Falcon)
Logits: layernorm(x) * output_norm + output_norm_b, then output.weight (token_embd.weight when absent).
No biases on the projections. In PWRI files the predictor input is x, the layer input (docs/FORMATS.md section 2).

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  falcon  LayerNorm with biases, fused attn_qkv, NeoX RoPE, parallel attention + MLP, no ffn_norm
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from ..layers.cache import KVCache
from .base import Expected, Model, head_expected, sparsify_expected
from .spec import ArchSpec

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight", "attn_norm_b": "attn_norm.bias",
    "attn_norm_2": "attn_norm_2.weight", "attn_norm_2_b": "attn_norm_2.bias",
    "wqkv": "attn_qkv.weight", "wo": "attn_output.weight",
}
OPTIONAL = ("attn_norm_2", "attn_norm_2_b")


def expected_tensors(c: ModelConfig) -> Expected:
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    e = head_expected(c, layer_norm=True)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        for norm, required in (("attn_norm", True), ("attn_norm_2", False)):
            e[f"{p}{norm}.weight"] = ((c.n_embd,), required)
            e[f"{p}{norm}.bias"] = ((c.n_embd,), required)
        e[p + "attn_qkv.weight"] = ((q_dim + 2 * kv_dim, c.n_embd), True)
        e[p + "attn_output.weight"] = ((c.n_embd, q_dim), True)
        e[p + "ffn_up.weight"] = ((c.n_ff, c.n_embd), True)
        e[p + "ffn_down.weight"] = ((c.n_embd, c.n_ff), True)
    return sparsify_expected(c, e)


class FalconModel(Model):
    """Its own forward: attention and MLP read the same layer input (the parallel block above)."""

    LAYER_TENSORS = LAYER_TENSORS
    OPTIONAL_TENSORS = OPTIONAL
    LAYER_NORM = True

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, hd, eps = ids.shape[0], c.head_dim, c.norm_eps
        q_dim, kv_dim = c.n_head * hd, c.n_head_kv * hd
        rope = (c.n_rot, c.rope_freq_base, c.rope_freq_scale, c.rope_neox)

        x = k.get_rows(self.token_embd, ids)  # [N, n_embd]
        for il, L in enumerate(self.layers):
            h = k.layernorm(x, L.attn_norm, L.attn_norm_b, eps)
            m = h if L.attn_norm_2 is None else k.layernorm(x, L.attn_norm_2, L.attn_norm_2_b, eps)
            qkv = k.matmul(L.wqkv, h)  # [N, q_dim + 2 kv_dim]
            q = np.ascontiguousarray(qkv[:, :q_dim]).reshape(n, c.n_head, hd)
            kk = np.ascontiguousarray(qkv[:, q_dim:q_dim + kv_dim]).reshape(n, c.n_head_kv, hd)
            v = qkv[:, q_dim + kv_dim:].reshape(n, c.n_head_kv, hd)
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, n_head, hd]
            f = self.ffns[il](m, x)  # the predictor reads the layer input x, before it changes
            x += k.matmul(L.wo, a.reshape(n, q_dim))
            x += f

        cache.n_past = p0 + n
        return self._head(x, all_logits)


SPEC = ArchSpec("falcon", model=FalconModel, expected=expected_tensors, rope_neox=True, layer_norm=True,
                hidden_act="gelu", hidden_act_pwri="relu", ungated_ffn=True, pwri=True)  # PWRI: ReluFalcon
