"""IBM Granite 4.0-H (GGUF arch "granitehybrid"): Mamba-2 mixer layers and attention layers, each followed by
Granite's FFN, with Granite's four scalars (models/granite.py):

  x = token_embd[ids] * embd_scale                                   {arch}.embedding_scale (unset: 1)
  per layer (config.mamba_layers: head_count_kv[il] == 0 marks a mixer):
    n = rmsnorm(x) * attn_norm
    mixer layer:      y = mamba2(n)                                  (mamba2_mixer.py, as nemotron_h)
    attention layer:  y = Wo · attention(rope(Wq·n), rope(Wk·n), Wv·n)   scores scaled by attention.scale
                      (normal-layout RoPE only when {arch}.rope.scaling.finetuned is true or absent: Granite
                      4.0-H files say false and attend without positions; Bamba-style files rotate)
    x = x + y * residual_scale                                       {arch}.residual_scale (unset: 1)
    m = rmsnorm(x) * ffn_norm
    x = x + ffn(m) * residual_scale      dense SwiGLU (H-Micro), or experts (H-Tiny, H-Small): softmax router,
                                         top-k renormalized, plus an ungated SwiGLU shared expert (moe.py)
  logits = output · (rmsnorm(x) * output_norm) / logit_scale         {arch}.logit_scale (optional here: 1)

Every product is rounded to f32 before its add (GraniteModel's hooks). A one-token step runs each attention
layer as one C call (kernels.steps.attn_block_decode with the residual scale, as granite), the same bits as the
Python path. The cache is mamba2_cache.Mamba2KVCache: K/V on the attention layers, conv and SSM states on the
mixers. Biases on the attention or FFN (llama.cpp accepts optional ones; no Granite 4.0 checkpoint has them)
are refused by GraniteModel rather than run without.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..gguf.types import Tensor
from ..layers.cache import Mamba2KVCache
from ..layers.ffn import SparseSettings
from .base import Expected, ffn_expected, head_expected, layer_tensors
from .granite import GraniteModel
from .granite import apply_scales, describe
from ..layers.mamba2_mixer import Mamba2Mixer, mamba2_dims, mamba2_expected, mamba2_tensors
from .nemotron_h import mamba2_layout
from .spec import ArchSpec

SHARED = {"attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight"}
ATTENTION = {"wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight"}


def expected_tensors(c: ModelConfig) -> Expected:
    E, hd = c.n_embd, c.head_dim
    q_dim, kv_dim = c.n_head * hd, c.n_head_kv * hd
    e = head_expected(c)
    e["rope_freqs.weight"] = ((c.n_rot // 2,), False)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((E,), True)
        e[p + "ffn_norm.weight"] = ((E,), True)
        if c.mamba_layers[il]:
            e.update(mamba2_expected(c, p))
        else:
            e.update({p + "attn_q.weight": ((q_dim, E), True), p + "attn_k.weight": ((kv_dim, E), True),
                      p + "attn_v.weight": ((kv_dim, E), True), p + "attn_output.weight": ((E, q_dim), True)})
        e.update(ffn_expected(c, il, shared_gate=False))
    return e


class GraniteHybridModel(Mamba2Mixer, GraniteModel):
    """The granitehybrid stack (module docstring): `layers[il]` holds the two norms plus the mixer's tensors or
    the attention projections; `ffns[il]` every layer's FFN (dense or experts, built by base.Model)."""

    LAYER_TENSORS = SHARED

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        super().__init__(config, tensors, kernels, sparse)
        for il, L in enumerate(self.layers):
            if config.mamba_layers[il]:
                vars(L).update(vars(mamba2_tensors(config, tensors, il)))
            else:
                vars(L).update(vars(layer_tensors(tensors, il, ATTENTION)))

    def new_cache(self, n_ctx: int | None = None) -> Mamba2KVCache:
        c = self.config
        H, P, _, N, conv_dim = mamba2_dims(c)
        attn = tuple(not m for m in c.mamba_layers)
        return Mamba2KVCache(attn, c.mamba_layers, c.n_head_kv, n_ctx or c.n_ctx_train, c.head_dim, conv_dim,
                             c.conv_kernel, H, P, N)

    def has_attention(self, il: int) -> bool:
        return not self.config.mamba_layers[il]

    def forward(self, tokens, cache: Mamba2KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits of tokens (the last, or all rows with all_logits), continuing the cache's K/V and mixer states."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        x = self._embed(ids, pos)  # [N, n_embd], times embd_scale
        plans = self.attn_plans() if n == 1 else None
        cache.begin(p0)
        for il, L in enumerate(self.layers):
            if plans is not None and plans[il] is not None:  # adds the scaled attention to x, returns the FFN input
                m = k.steps.attn_block_decode(plans[il], x[0], p0, cache.k[il], cache.v[il])[None, :]
            else:
                h = k.rmsnorm(x, L.attn_norm, eps)
                y = self._mamba2(il, L, h, cache, p0) if c.mamba_layers[il] else self._attend(il, L, h, pos, cache, p0)
                x += self._attn_out(il, y)  # times residual_scale
                m = k.rmsnorm(x, L.ffn_norm, eps)
            x += self._ffn_out(il, self.ffns[il](m, x))  # times residual_scale
        cache.end(p0 + n)
        return self._head(x, all_logits)  # divided by logit_scale


def read_args(r, d: dict) -> None:
    apply_scales(r, d)


SPEC = ArchSpec("granitehybrid", model=GraniteHybridModel, expected=expected_tensors, moe_norm=True,
                expert_width_key="{arch}.feed_forward_length", shared_expert="optional", layout=mamba2_layout, describe=describe)
