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

Biases: llama.cpp's converter writes blk.N.attn_q/k/v.bias and attn_output.bias when the checkpoint has them
(attention_bias: true, e.g. "llamafied" Qwen models), and llama.cpp adds each one it finds. We add them too
(q, k, v before RoPE, the output one before the residual add); FFN biases (mlp_bias) are refused, never ignored.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  llama   (LLaMA-2/3, Mistral): normal (interleaved-pair) RoPE, attn_scale 1/sqrt(head_dim), rope base 10000
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from .base import Expected, Model, get_tensor, llama_like_expected, norm_weight, sparsify_expected
from .spec import ArchSpec

LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "ffn_norm": "ffn_norm.weight",
}
ATTN_BIASES = {"bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias"}
FFN_BIASES = ("ffn_gate.bias", "ffn_up.bias", "ffn_down.bias")  # llama.cpp adds them; we refuse them


def attn_bias_shapes(c: ModelConfig) -> dict[str, int]:
    """The length of each optional attention bias (ATTN_BIASES suffix -> values)."""
    q, kv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    return {"attn_q.bias": q, "attn_k.bias": kv, "attn_v.bias": kv, "attn_output.bias": c.n_embd}


def expected_tensors(c: ModelConfig) -> Expected:
    e = llama_like_expected(c)
    e["rope_freqs.weight"] = ((c.n_rot // 2,), False)
    for il in range(c.n_layer):  # optional attention biases: their shapes are checked when present
        e.update({f"blk.{il}.{s}": ((n,), False) for s, n in attn_bias_shapes(c).items()})
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
    """The pre-norm block of models/base.py plus llama's extras: the RoPE factors of rope_freqs.weight and the
    optional attention biases (module docstring)."""

    LAYER_TENSORS = {**LAYER_TENSORS, **ATTN_BIASES}
    OPTIONAL_TENSORS = tuple(ATTN_BIASES)

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        ffn_biases = [n for n in tensors if n.startswith("blk.") and n.split(".", 2)[2] in FFN_BIASES]
        if ffn_biases:
            raise UnsupportedError(f"{config.arch} files with FFN biases are not supported (found {ffn_biases[0]!r} "
                                   f"and {len(ffn_biases) - 1} more)")
        super().__init__(config, tensors, kernels, sparse)
        # q/k/v biases on when the file has any (a layer without one adds zeros), as llama.cpp takes each it finds
        self.QKV_BIASES = any(getattr(L, b, None) is not None for L in self.layers for b in ("bq", "bk", "bv"))
        lengths = dict(zip(ATTN_BIASES, attn_bias_shapes(config).values()))
        for L in self.layers:
            for attr in ("bq", "bk", "bv") if self.QKV_BIASES else ():
                if getattr(L, attr, None) is None:
                    setattr(L, attr, np.zeros(lengths[attr], np.float32))
        ff = rope_factors(tensors)
        if ff is not None:  # divides the angle before any YaRN blend, so the two multiply
            self.rope_freqs = ff if self.rope_freqs is None else (ff * self.rope_freqs).astype(np.float32)

    def _attn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        bo = getattr(self.layers[il], "bo", None)  # subclasses with their own LAYER_TENSORS have none
        if bo is not None:  # the output projection's bias, before the residual add
            y += bo
        return y

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        kw = super().attn_plan_kwargs(il, layer)
        if getattr(layer, "bo", None) is not None:
            kw["bo"] = layer.bo
        return kw


SPEC = ArchSpec("llama", model=LlamaModel, expected=expected_tensors, yarn=True, hidden_act_pwri="relu", pwri=True,
                moe_norm=True, expert_width_key="{arch}.feed_forward_length", chat_format="mistral")
