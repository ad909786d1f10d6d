"""IBM Granite 3.x (GGUF archs "granite", dense, and "granitemoe", mixture of experts).

The llama block (models/llama.py: RMSNorm, normal-layout RoPE, grouped-query attention, SwiGLU) with four
scalars from the metadata (config.py reads them; unset ones are 1 and change nothing):
    x = token_embd[ids] * embd_scale                                  {arch}.embedding_scale
    per layer:
        h = x + residual_scale * Wo · attn(q, k, v)                   {arch}.residual_scale
            with scores q·k * attn_scale instead of 1/sqrt(head_dim)  {arch}.attention.scale
        x = h + residual_scale * ffn(rmsnorm(h) * ffn_norm)
    logits = (output · (rmsnorm(x) * output_norm)) * (1 / logit_scale)   {arch}.logit_scale
Each product is rounded to f32 before its add, as llama.cpp's graph does (a scale node, then the add), and the
one-call decode step (step_attn.c) scales its output the same way, so the two paths give the same bits.

granitemoe's FFN is moe.MoEFFN: softmax router, top-k, the chosen experts' weights renormalized (llama.cpp's
granite graph asks for that), experts {arch}.feed_forward_length wide. Files converted from
GraniteMoeShared add a shared expert ({arch}.expert_shared_feed_forward_length wide; ffn_{gate,up,down}_shexp)
whose SwiGLU output is added to the experts' sum with no gate, unlike qwen2moe's sigmoid-gated one.

llama.cpp also accepts biases on the attention output and the dense FFN (absent from the Granite 3.x
checkpoints); a file that has any is refused rather than run without them. {arch}.rope.scaling.finetuned =
false (RoPE off) reaches here as n_rot 0.
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from ..errors import UnsupportedError
from .base import Expected, llama_like_expected
from .llama import LlamaModel

_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors; granitemoe's shared expert has no gate vector (ffn_gate_inp_shexp)."""
    e = llama_like_expected(c, shared_gate=False)
    e["rope_freqs.weight"] = ((c.n_rot // 2,), False)
    return e


class GraniteModel(LlamaModel):
    """LlamaModel with the scaled embeddings, residual branches and logits of the module docstring."""

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        biases = [n for n in tensors if n.startswith("blk.") and n.endswith(".bias")
                  and n.split(".")[2] in _BIASES]
        if biases:
            raise UnsupportedError(f"{config.arch} files with biases are not supported (found {biases[0]!r} and "
                                   f"{len(biases) - 1} more)")
        super().__init__(config, tensors, kernels, sparse)
        self._embd_scale = np.float32(config.embd_scale)
        self._res_scale = np.float32(config.residual_scale)
        self._logit_mul = np.float32(1.0) / np.float32(config.logit_scale)  # a float division, as llama.cpp

    def _embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        x = super()._embed(ids, pos)
        x *= self._embd_scale
        return x

    def _attn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        y *= self._res_scale
        return y

    def _ffn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        return y * self._res_scale  # a new array: some FFN paths return their own buffers

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        return dict(super().attn_plan_kwargs(il, layer), residual_scale=float(self._res_scale))

    def _head(self, x: np.ndarray, all_logits: bool) -> np.ndarray:
        logits = super()._head(x, all_logits)
        logits *= self._logit_mul
        return logits
