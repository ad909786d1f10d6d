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
    """The pre-norm block of models/base.py as it is; only the RoPE factors of rope_freqs.weight are llama's."""

    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        ff = rope_factors(tensors)
        if ff is not None:  # divides the angle before any YaRN blend, so the two multiply
            self.rope_freqs = ff if self.rope_freqs is None else (ff * self.rope_freqs).astype(np.float32)
