"""Tencent Hunyuan dense (GGUF arch "hunyuan-dense": Hunyuan 0.5B, 1.8B, 4B, 7B).

The llama block with NeoX RoPE and per-head RMSNorms of q and k that come AFTER RoPE (qwen3 and apertus norm
before it), as llama.cpp's graph for this arch (shared with hunyuan-vl) runs them:

Per layer:  n = rmsnorm(x) * attn_norm
            q = rmsnorm_head(rope(Wq·n)) * q_norm;  k = rmsnorm_head(rope(Wk·n)) * k_norm;  v = Wv·n
            h = x + Wo · attn(q, k, v)                               (GQA, scale 1/sqrt(head_dim))
            y = h + Wdown · (silu(Wgate · m) * (Wup · m))            m = rmsnorm(h) * ffn_norm
Logits: rmsnorm(x) * output_norm, then output.weight (or token_embd.weight when the file has none).

The norm weights differ per dim, so the order matters (measured in tests/test_hunyuan_dense.py). The RoPE base
may carry the NTK alpha (hunyuan_rope_base). Optional q/k/v biases are added as llama.cpp's loader takes them.
Its own forward pass moves the norms after RoPE (base.Model's come before it); one-token steps run each attention
block as one C call with the norms after RoPE too (step_attn.c's qk_norm_post_rope), with the same bits. The FFN
is ffn.FFN's SwiGLU (its one-call C step for single tokens, threshold mode after `powerinfer calibrate`).

Metadata keys (config.read with SPEC and its hooks; defaults are llama.cpp's):
  hunyuan-dense (Tencent Hunyuan 0.5B / 1.8B / 4B / 7B dense): NeoX RoPE. The NTK "alpha" scaling of the HF
          checkpoints is usually baked into {arch}.rope.freq_base by the converter; a file that stores
          {arch}.rope.scaling.alpha instead gets llama.cpp's base * alpha^(d / (d - 2)), d = head_dim. M-RoPE
          sections (the vision-language variant's XD-RoPE) are refused. An expert_count of 0 or 1 means dense.
"""
from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.cache import KVCache
from .base import Expected, llama_like_expected
from .llama import ATTN_BIASES, LAYER_TENSORS, LlamaModel, attn_bias_shapes
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors plus attn_q_norm / attn_k_norm (f32 [head_dim]); no rope_freqs.weight (llama.cpp's
    hunyuan-dense has none); optional q/k/v biases."""
    e = llama_like_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_q_norm.weight"] = ((c.head_dim,), True)
        e[p + "attn_k_norm.weight"] = ((c.head_dim,), True)
        e.update({p + s: ((n,), False) for s, n in attn_bias_shapes(c).items() if s != "attn_output.bias"})
    return e


class HunyuanDenseModel(LlamaModel):
    """llama's layers plus q_norm, k_norm applied after RoPE (its own forward; see the module docstring)."""

    LAYER_TENSORS = {**LAYER_TENSORS, **ATTN_BIASES, "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        # llama.cpp's hunyuan-dense reads no rope_freqs.weight; only YaRN's factors (config) apply
        self.rope_freqs = np.array(config.rope_factors, dtype=np.float32) if config.rope_factors else None

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        """The C step's extras: the per-head norms, applied after RoPE."""
        return dict(super().attn_plan_kwargs(il, layer), q_norm=layer.q_norm, k_norm=layer.k_norm,
                    qk_norm_post_rope=True)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        x = self._embed(ids, pos)
        plans = self.attn_plans() if n == 1 else None
        if plans is not None:  # one token: each attention block as one C call (same kernels, same order)
            return self._fused_decode(plans, x, p0, cache, all_logits)
        rope = self.rope_args()
        for il, L in enumerate(self.layers):
            q, kk, v = self._qkv(L, k.rmsnorm(x, L.attn_norm, eps), n)  # projections (+ biases), no norms yet
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            q, kk = k.rmsnorm(q, L.q_norm, eps), k.rmsnorm(kk, L.k_norm, eps)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale, c.attn_softcap)
            x += self._attn_out(il, k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim)))
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)
        cache.n_past = p0 + n
        return self._head(x, all_logits)


__all__ = ["HunyuanDenseModel", "expected_tensors"]


def hunyuan_rope_base(r, freq_base: float, head_dim: int) -> float:
    """hunyuan-dense's RoPE base: {arch}.rope.scaling.alpha (absent or <= 0: none) scales it by
    alpha^(head_dim / (head_dim - 2)), as llama.cpp's loader does; M-RoPE sections are refused."""
    sections = r.meta.get(r.key("{arch}.rope.dimension_sections"))
    if isinstance(sections, list) and len(sections) >= 2 and sections[0] > 0 and sections[1] > 0:
        raise UnsupportedError(f"{r.f.path}: a {r.arch} file with M-RoPE sections ({sections}, the "
                               "vision-language XD-RoPE) is not supported")
    alpha = r.get("{arch}.rope.scaling.alpha", 0.0, kind=float)
    if not math.isfinite(alpha):
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.rope.scaling.alpha')} must be finite, got {alpha}")
    if alpha <= 0:
        return freq_base
    if head_dim <= 2:
        raise ModelFileError(f"{r.f.path}: RoPE alpha scaling needs a head width above 2, got {head_dim}")
    return float(freq_base * alpha ** (head_dim / (head_dim - 2)))


SPEC = ArchSpec("hunyuan-dense", model=HunyuanDenseModel, expected=expected_tensors, rope_neox=True, yarn=True,
                dense_experts_max=1, rope_base_of=hunyuan_rope_base)  # an expert_count of 0 or 1 means dense
