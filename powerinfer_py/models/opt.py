"""OPT (GGUF arch "opt"; ReLU OPT in PowerInfer files): pre-LayerNorm blocks, biases everywhere, learned
absolute positions, no RoPE.

    x = token_embd[ids] + position_embd[pos]      row p of position_embd is position p (the converter dropped
                                                   HF's two offset rows)
    per layer:
      n = layernorm(x) * attn_norm + attn_norm_b
      q, k, v = Wq·n + bq, Wk·n + bk, Wv·n + bv;   a = attention(q, k, v), scale 1/sqrt(head_dim)
      x = x + Wo · a + bo
      m = layernorm(x) * ffn_norm + ffn_norm_b
      x = x + ffn(m)                               ffn: Wdown · relu(Wup · m + b_up) + b_down
  logits = output (tied to token_embd) · (layernorm(x) * output_norm + output_norm_b)
In PWRI files the predictor input is x after attention, before ffn_norm; the down projection is ffn_down_t
with its bias ffn_down_t.bias.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  opt     LayerNorm with biases, biases on every projection, learned positions (no RoPE), ReLU FFN
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ContextFullError
from ..gguf.types import Tensor
from ..layers.cache import KVCache
from ..layers.ffn import SparseSettings
from .base import Expected, Model, get_tensor, head_expected, sparsify_expected
from .spec import ArchSpec

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight", "attn_norm_b": "attn_norm.bias",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias",
    "ffn_norm": "ffn_norm.weight", "ffn_norm_b": "ffn_norm.bias",
}


def expected_tensors(c: ModelConfig) -> Expected:
    q_dim = c.n_head * c.head_dim
    e = head_expected(c, layer_norm=True)
    e["position_embd.weight"] = ((c.n_ctx_train, c.n_embd), True)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        for name, shape in (("attn_norm", (c.n_embd,)), ("attn_q", (q_dim, c.n_embd)), ("attn_k", (q_dim, c.n_embd)),
                            ("attn_v", (q_dim, c.n_embd)), ("attn_output", (c.n_embd, q_dim)),
                            ("ffn_norm", (c.n_embd,)), ("ffn_up", (c.n_ff, c.n_embd)),
                            ("ffn_down", (c.n_embd, c.n_ff))):
            e[f"{p}{name}.weight"] = (shape, True)
            e[f"{p}{name}.bias"] = ((shape[0],), True)
    return sparsify_expected(c, e)


class OptModel(Model):
    """Its own forward: learned positions, no RoPE, LayerNorms with biases (the projections share _qkv)."""

    LAYER_TENSORS = LAYER_TENSORS
    FFN_BIASES = True
    QKV_BIASES = True
    LAYER_NORM = True

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        super().__init__(config, tensors, kernels, sparse)
        self.position_embd = get_tensor(tensors, "position_embd.weight")
        self.n_positions = self.position_embd.shape[0]

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        n_ctx = n_ctx or self.n_positions
        if n_ctx > self.n_positions:
            raise ContextFullError(f"OPT has learned positions for {self.n_positions} tokens; a context of "
                                   f"{n_ctx} does not fit: use at most {self.n_positions}")
        return super().new_cache(n_ctx)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, hd, eps = ids.shape[0], c.head_dim, c.norm_eps

        x = k.get_rows(self.token_embd, ids)  # [N, n_embd]
        x += k.get_rows(self.position_embd, pos)
        for il, L in enumerate(self.layers):
            q, kk, v = self._qkv(L, k.layernorm(x, L.attn_norm, L.attn_norm_b, eps), n)  # with the biases
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, n_head, hd]
            x += k.matmul(L.wo, a.reshape(n, c.n_head * hd))
            x += L.bo
            # feed-forward; the predictor (sparse files) reads the residual x, the FFN its normed copy
            x += self.ffns[il](k.layernorm(x, L.ffn_norm, L.ffn_norm_b, eps), x)

        cache.n_past = p0 + n
        return self._head(x, all_logits)


SPEC = ArchSpec("opt", model=OptModel, expected=expected_tensors, rope=False, layer_norm=True, hidden_act="relu",
                ungated_ffn=True, pwri=True)
