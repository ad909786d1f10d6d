"""Gemma 3 (GGUF arch "gemma3"), text part.

  x = token_embd[ids] * sqrt(n_embd)
  per layer:
    n = rmsnorm(x) * attn_norm
    q, k = rmsnorm per head (q_norm, k_norm) of Wq·n, Wk·n;  v = Wv·n
    q, k = rope_neox(q, k) with the layer's base: 10000 on sliding-window layers, rope.freq_base on global ones
    a = attention(q, k, v) over the last `sliding_window` positions (sliding layers) or all of them (global)
    x = x + rmsnorm(Wo · a) * post_attention_norm
    m = rmsnorm(x) * ffn_norm
    x = x + rmsnorm(Wdown · (gelu(Wgate·m) * (Wup·m))) * post_ffw_norm
  logits = token_embd · (rmsnorm(x) * output_norm)        (tied head)

GGUF norm weights already include Gemma's "+1" (the converter added it), so every norm is a plain RMSNorm
multiply. Layers with il % 6 != 5 are sliding-window layers (config.swa_layers). head_dim is its own hparam
(256 on the 270M model, not n_embd / n_head). No logit soft-capping in Gemma 3.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  gemma3  NeoX RoPE; layers with il % 6 != 5 attend within a sliding window and use RoPE base 10000 and
          freq scale 1.0; the other (global) layers use {arch}.rope.freq_base and rope_freq_scale;
          embeddings scaled by sqrt(n_embd); attn_scale 1/sqrt(head_dim) (27B: 1/sqrt(n_embd/n_head))
"""
from __future__ import annotations

import math

from ..config import ModelConfig
from ..errors import ModelFileError
from .base import Expected, llama_like_expected, sparsify_expected
from .gemma import Gemma2Model
from .gemma import wide_attn_scale, window_layers
from .spec import ArchSpec

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "ffn_norm": "ffn_norm.weight",
    "post_ffw_norm": "post_ffw_norm.weight",
}


def expected_tensors(c: ModelConfig) -> Expected:
    e = llama_like_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_q_norm.weight"] = ((c.head_dim,), True)
        e[p + "attn_k_norm.weight"] = ((c.head_dim,), True)
        e[p + "post_attention_norm.weight"] = ((c.n_embd,), True)
        e[p + "post_ffw_norm.weight"] = ((c.n_embd,), True)
    return sparsify_expected(c, e)  # PWRI files (trained predictors): ffn_down_t, fc1, fc2


class Gemma3Model(Gemma2Model):
    """Gemma 2's block (scaled embeddings, post-norms, sliding-window layers) with per-head Q/K norms, the
    sliding layers' own RoPE base without frequency scaling, and no soft-caps (config leaves them at 0)."""

    LAYER_TENSORS = LAYER_TENSORS
    QK_NORMS = True

    def _rope(self, swa: bool) -> tuple[float, float]:
        c = self.config
        return (c.rope_freq_base_swa, 1.0) if swa else (c.rope_freq_base, c.rope_freq_scale)

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        return dict(super().attn_plan_kwargs(il, layer), q_norm=layer.q_norm, k_norm=layer.k_norm)


SWA_PERIOD = 6  # every 6th layer (il % 6 == 5) is global
FREQ_BASE_SWA = 10_000.0  # RoPE base of the sliding-window layers
WIDE_LAYERS = 62  # the 27B model: scores scaled by 1/sqrt(n_embd / n_head)


def _swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    if r.get("{arch}.attention.sliding_window", 0) <= 0:  # gemma3 without windows (as llama.cpp)
        return r.no_swa(n_layer, rope_freq_base)
    return window_layers(r, n_layer, None, SWA_PERIOD, FREQ_BASE_SWA)


def read_args(r, d: dict) -> None:
    """The optional final logit soft-cap (llama.cpp: absent or 0 = none; released files have none) and the 27B
    score scale."""
    cap = r.get("{arch}.final_logit_softcapping", 0.0, kind=float)
    if not (math.isfinite(cap) and cap >= 0):
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.final_logit_softcapping')} must be a finite "
                             f"number >= 0, got {cap}")
    if cap:
        d["final_softcap"] = cap
    if d["n_layer"] == WIDE_LAYERS:
        d["attn_scale"] = wide_attn_scale(d)


SPEC = ArchSpec("gemma3", model=Gemma3Model, expected=expected_tensors, rope_neox=True, sqrt_embd_scale=True,
                ffn_variant="geglu", pwri=True, chat_format="gemma", swa=_swa)
