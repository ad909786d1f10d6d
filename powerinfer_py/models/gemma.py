"""Gemma (GGUF arch "gemma", Gemma 1: 2B, 7B) and Gemma 2 (arch "gemma2": 2B, 9B, 27B).

gemma, per layer (the pre-norm block of base.py, llama-shaped, with Gemma's embedding scale and GeGLU):
  x = token_embd[ids] * sqrt(n_embd)
  n = rmsnorm(x) * attn_norm;  q, k = rope_neox(Wq·n, Wk·n);  v = Wv·n
  x = x + Wo · attention(q, k, v)                                   (scale 1/sqrt(head_dim))
  m = rmsnorm(x) * ffn_norm;  x = x + Wdown · (gelu(Wgate·m) * (Wup·m))
  logits = token_embd · (rmsnorm(x) * output_norm)                  (tied head)

gemma2 adds, as gemma3 has them but without per-head Q/K norms and with one RoPE base for every layer (unless
the file says rope.freq_base_swa):
  x = x + rmsnorm(Wo · a) * post_attention_norm;  x = x + rmsnorm(ffn(m)) * post_ffw_norm
  sliding-window attention on the even layers (config.swa_layers; llama.cpp's pattern of period 2)
  attention logit soft-capping: scores s -> cap * tanh(s / cap) after the query scale, before the mask and
      softmax (config.attn_softcap; done inside kernels.attention, so the C decode block has it too)
  final logit soft-capping: logits -> cap * tanh(logits / cap) (config.final_softcap; base.Model._head)

head_dim is its own hparam (Gemma 7B: 256 with n_embd / n_head = 192). GGUF norm weights already include
Gemma's "+1" (llama.cpp's converter adds it), so every norm is a plain RMSNorm multiply.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  gemma   (Gemma 1) NeoX RoPE, embeddings scaled by sqrt(n_embd), GeGLU FFN, attn_scale 1/sqrt(head_dim) (head_dim
          is {arch}.attention.key_length: 256 on Gemma 7B with n_embd / n_head = 192), tied output head
  gemma2  gemma plus post-norms (as gemma3, without Q/K norms); layers with il % period < period - 1 (period
          {arch}.attention.sliding_window_pattern, default 2: the even layers) attend within
          {arch}.attention.sliding_window (default 4096) with RoPE base {arch}.rope.freq_base_swa (default: the
          global base); attention logit soft-capping ({arch}.attn_logit_softcapping, default 50) and final
          logit soft-capping ({arch}.final_logit_softcapping, default 30): x -> cap * tanh(x / cap);
          attn_scale 1/sqrt(head_dim) (27B, 46 layers: 1/sqrt(n_embd / n_head)). Defaults are llama.cpp's.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..layers.ffn import SparseSettings
from ..gguf.types import Tensor
from .base import Expected, Model, llama_like_expected, sparsify_expected
from .llama import LAYER_TENSORS as LLAMA_LAYER_TENSORS
from .spec import ArchSpec

GEMMA2_LAYER_TENSORS = {
    **LLAMA_LAYER_TENSORS,
    "post_attn_norm": "post_attention_norm.weight",
    "post_ffw_norm": "post_ffw_norm.weight",
}


def expected_tensors(c: ModelConfig) -> Expected:
    """gemma: the llama-shaped tensors; gemma2 also the two post-norms per layer."""
    e = llama_like_expected(c)
    if c.arch == "gemma2":
        for il in range(c.n_layer):
            e[f"blk.{il}.post_attention_norm.weight"] = ((c.n_embd,), True)
            e[f"blk.{il}.post_ffw_norm.weight"] = ((c.n_embd,), True)
    return sparsify_expected(c, e)


class GemmaModel(Model):
    """Gemma 1: the pre-norm block of models/base.py with embeddings scaled by sqrt(n_embd) (config.embd_scale)."""

    LAYER_TENSORS = LLAMA_LAYER_TENSORS

    def _embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        x = self.kernels.get_rows(self.token_embd, ids)
        x *= self.config.embd_scale
        return x


class Gemma2Model(GemmaModel):
    """Gemma 2: Gemma 1 plus the post-norms, the sliding-window layers and the two soft-caps (the attention one
    travels to the kernels through config.attn_softcap, the final one is applied by base.Model._head).
    Gemma 3 (models/gemma3.py) is this block with per-head Q/K norms and its own RoPE rule."""

    FFN_OUT_NORM = "post_ffw_norm"
    LAYER_TENSORS = GEMMA2_LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        super().__init__(config, tensors, kernels, sparse)
        c = config
        # per layer: (window, rope args after pos)
        self.layer_attn = [(c.sliding_window if swa else 0, (c.n_rot, *self._rope(swa), c.rope_neox))
                           for swa in c.swa_layers]

    def _rope(self, swa: bool) -> tuple[float, float]:
        """(RoPE base, frequency scale) of a sliding-window or global layer: the sliding layers may have their
        own base (rope.freq_base_swa), the scale is the same for all."""
        c = self.config
        return (c.rope_freq_base_swa if swa else c.rope_freq_base), c.rope_freq_scale

    def layer_attention(self) -> list[tuple[int, tuple]]:
        return self.layer_attn

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        window, (_, base, scale, _) = self.layer_attn[il]
        return dict(rope_base=base, rope_scale=scale, post_norm=layer.post_attn_norm, window=window)

    def _attn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        return self.kernels.rmsnorm(y, self.layers[il].post_attn_norm, self.config.norm_eps)


GEMMA2_SWA_PERIOD = 2  # layers il % 2 == 0 attend within the window, odd layers globally
GEMMA2_SLIDING_WINDOW = 4096
GEMMA2_ATTN_SOFTCAP = 50.0
GEMMA2_FINAL_SOFTCAP = 30.0
GEMMA2_27B_LAYERS = 46  # the 27B model scales scores by 1/sqrt(n_embd / n_head) instead of 1/sqrt(head_dim)


def window_layers(r, n_layer: int, window_default: int | None, period: int,
                  base_swa: float) -> tuple[int, tuple[bool, ...], float]:
    """(sliding_window, swa_layers, rope_freq_base_swa) of gemma2 and gemma3: the window
    {arch}.attention.sliding_window, the layers from attention.sliding_window_pattern (one flag per layer, or a
    period P: layers il % P != P - 1 slide; default `period`) and the window layers' RoPE base
    {arch}.rope.freq_base_swa (default base_swa)."""
    window = r.positive("{arch}.attention.sliding_window", window_default)
    pattern = r.meta.get(r.key("{arch}.attention.sliding_window_pattern"))
    if isinstance(pattern, list) and len(pattern) == n_layer:
        layers = tuple(bool(p) for p in pattern)
    else:
        period = pattern if isinstance(pattern, int) and pattern > 0 else period
        layers = tuple(il % period != period - 1 for il in range(n_layer))
    return window, layers, r.get("{arch}.rope.freq_base_swa", base_swa, kind=float)


def _gemma2_swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    return window_layers(r, n_layer, GEMMA2_SLIDING_WINDOW, GEMMA2_SWA_PERIOD, rope_freq_base)


def wide_attn_scale(d: dict) -> float:
    """The 27B models' score scale (gemma2, gemma3): 1/sqrt(n_embd / n_head)."""
    return 1.0 / math.sqrt(d["n_embd"] / d["n_head"])


def read_args(r, d: dict) -> None:
    """gemma2: the attention and final logit soft-caps ({arch}.attn_logit_softcapping, default 50, and
    final_logit_softcapping, default 30: llama.cpp's) and the 27B score scale."""
    if r.arch != "gemma2":
        return
    for field, suffix, default in (("attn_softcap", "{arch}.attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP),
                                   ("final_softcap", "{arch}.final_logit_softcapping", GEMMA2_FINAL_SOFTCAP)):
        cap = r.get(suffix, default, kind=float)
        if not (math.isfinite(cap) and cap > 0):
            raise ModelFileError(f"{r.f.path}: metadata key {r.key(suffix)!r} must be a finite number > 0, "
                                 f"got {cap}")
        d[field] = cap
    if d["n_layer"] == GEMMA2_27B_LAYERS:
        d["attn_scale"] = wide_attn_scale(d)


SPEC = ArchSpec("gemma", model=GemmaModel, expected=expected_tensors, rope_neox=True, sqrt_embd_scale=True,
                ffn_variant="geglu", pwri=True, chat_format="gemma")
VARIANTS = (replace(SPEC, name="gemma2", model=Gemma2Model, swa=_gemma2_swa),)
