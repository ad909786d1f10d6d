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
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..gguf.types import Tensor
from ..layers.ffn import SparseSettings
from .base import Expected, Model, llama_like_expected, sparsify_expected
from .llama import LAYER_TENSORS as LLAMA_LAYER_TENSORS

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
