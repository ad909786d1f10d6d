"""LLaMA-2/3 and Mistral (GGUF arch "llama").

Per layer:  h = x + Wo · attn(rope(Wq · n), rope(Wk · n), Wv · n)   with n = rmsnorm(x) * attn_norm
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))          with m = rmsnorm(h) * ffn_norm
RoPE is the "normal" layout (pairs 2i, 2i+1): the GGUF converter already permuted the Q/K rows of the
HF checkpoint so that this layout gives the HF model's results. Grouped-query attention: n_head_kv <= n_head.
Logits: rmsnorm(x) * output_norm, then output.weight (or token_embd.weight when the file has no output).

The FFN is ffn.FFN: SwiGLU for ordinary files; ReGLU relu(Wgate·m) * (Wup·m) (ReluLLaMA) or FATReLU (ProSparse)
when powerinfer.hidden_act says so or the file is a PowerInfer (PWRI) file, which also brings ffn_down_t and
the per-layer predictor fc1/fc2. The predictor input is h, the residual after attention, before ffn_norm.

LLaMA 3.1+ files carry rope_freqs.weight, f32 [n_rot/2]: per-pair divisors of the RoPE frequencies (the
long-context scaling, baked in by the converter; 1 for the fast pairs, up to the scaling factor for the slow
ones). Every layer's RoPE divides its angles by them, as llama.cpp does; files without the tensor rotate as
before.
"""
from __future__ import annotations


import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..kv_cache import KVCache
from .base import Expected, Model, get_tensor, llama_like_expected, norm_weight, sparsify_expected

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "ffn_norm": "ffn_norm.weight",
}


def expected_tensors(c: ModelConfig) -> Expected:
    e = llama_like_expected(c)
    e["rope_freqs.weight"] = ((c.n_rot // 2,), False)
    return sparsify_expected(c, e)


def rope_factors(tensors) -> np.ndarray | None:
    """The file's RoPE frequency factors (rope_freqs.weight) as f32 [n_rot/2], or None when it has none."""
    ff = norm_weight(get_tensor(tensors, "rope_freqs.weight", required=False))
    if ff is not None and not (np.isfinite(ff).all() and (ff > 0).all()):
        bad = ff[~(np.isfinite(ff) & (ff > 0))]
        raise ModelFileError(f"tensor 'rope_freqs.weight' must hold finite values > 0 (RoPE frequency factors); "
                             f"it has {bad.size} others, e.g. {float(bad[0])}")
    return ff


class LlamaModel(Model):
    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        ff = rope_factors(tensors)
        if ff is not None:  # divides the angle before any YaRN blend, so the two multiply
            self.rope_freqs = ff if self.rope_freqs is None else (ff * self.rope_freqs).astype(np.float32)

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
            # attention
            h = k.rmsnorm(x, L.attn_norm, eps)
            q = k.matmul(L.wq, h).reshape(n, c.n_head, hd)
            kk = k.matmul(L.wk, h).reshape(n, c.n_head_kv, hd)
            v = k.matmul(L.wv, h).reshape(n, c.n_head_kv, hd)
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, n_head, hd]
            x += k.matmul(L.wo, a.reshape(n, c.n_head * hd))
            # feed-forward; the predictor (sparse files) reads the residual x, the FFN its normed copy
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)

        cache.n_past = p0 + n
        return self._head(x, all_logits)
