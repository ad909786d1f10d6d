"""Phi-3 / Phi-3.5 / Phi-4-mini (GGUF arch "phi3"), as llama.cpp computes it.

Per layer:  h = x + Wo · attn(rope(q), rope(k), v)      q, k, v = split(Wqkv · n),  n = rmsnorm(x) * attn_norm
            y = h + Wdown · (silu(g) * u)               g, u = split(Wup · m),      m = rmsnorm(h) * ffn_norm
The llama block with two fused weights:
  attn_qkv  (q_dim + 2 kv_dim, n_embd): rows [q heads | k heads | v heads]; some files store attn_q/k/v instead
  ffn_up    (2 n_ff, n_embd):            rows [gate | up] (HF's gate_up_proj; llama.cpp's SwiGLU silus the first half)
Both are split here into row views of the same bytes (a row range of a quantized tensor is a run of whole
blocks), named attn_q/attn_k/attn_v and ffn_gate/ffn_up, so the kernels, the one-call attention block and the
FFN objects (every sparse mode) take them as they take llama's.

RoPE is NeoX-style over the first n_rot = rope.dimension_count dims of each head (Phi-4-mini: 96 of 128).
Long-context files (Phi-3.5-mini, Phi-4-mini, the 128k Phi-3s) carry rope_factors_short/long.weight, f32
[n_rot/2], per-pair divisors of the RoPE frequencies: llama.cpp uses the long ones when the context
(n_ctx) exceeds rope.scaling.original_context_length and the short ones otherwise (a rope_freqs.weight, if a
file has one, wins over both). Such files also store rope.scaling.attn_factor (sqrt(1 + ln(s)/ln(orig)) for
LongRoPE), by which llama.cpp multiplies cos and sin: the rotated dims of q and k (not the others) grow by
it (the RoPE kernels' mscale, in the one-call decode block too).
phi3.attention.sliding_window is ignored: llama.cpp switches sliding-window attention off for phi3.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  phi3    the llama block with fused attn_qkv and gate+up, NeoX RoPE (partial: n_rot < head_dim on Phi-4-mini);
          long-context files carry rope_factors_long/short (used when n_ctx > rope.scaling.original_context_length
          / otherwise) and rope.scaling.attn_factor, which scales the rotated dims of q and k (llama.cpp's
          mscale); phi3.attention.sliding_window is ignored, as llama.cpp does
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..gguf.types import Tensor
from ..layers.cache import KVCache
from .base import Expected, Model, get_tensor, llama_like_expected, norm_weight
from .llama import LAYER_TENSORS
from .spec import ArchSpec

ROPE_FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's table with attn_qkv instead of attn_q/k/v (either form may be present; the model checks that
    one is) and ffn_up holding gate and up."""
    e = llama_like_expected(c)
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    for il in range(c.n_layer):
        p = f"blk.{il}."
        for x in "qkv":
            e[f"{p}attn_{x}.weight"] = (e[f"{p}attn_{x}.weight"][0], False)
        e[p + "attn_qkv.weight"] = ((q_dim + 2 * kv_dim, c.n_embd), False)
        del e[p + "ffn_gate.weight"]
        e[p + "ffn_up.weight"] = ((2 * c.n_ff, c.n_embd), True)
    for name in ROPE_FACTOR_TENSORS:
        e[name] = ((c.n_rot // 2,), False)
    return e


def row_views(t: Tensor, parts: Mapping[str, int]) -> dict[str, Tensor]:
    """Split t (2-D) by rows into consecutive parts {name: n_rows}, each a Tensor viewing t's bytes (no copy).
    The part sizes must add up to t's rows: anything else is a ModelFileError naming t and the expected split."""
    total = sum(parts.values())
    if len(t.shape) != 2 or t.shape[0] != total:
        split = " + ".join(f"{n} ({name.rsplit('.', 2)[-2]})" for name, n in parts.items())
        raise ModelFileError(f"tensor {t.name!r} has shape {t.shape}: expected {total} rows = {split}")
    out, r0 = {}, 0
    for name, n in parts.items():
        out[name] = Tensor(name, t.type, (n, t.shape[1]), t.data[r0:r0 + n])
        r0 += n
    return out


def split_fused(c: ModelConfig, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """tensors plus, per layer, attn_q/k/v views of attn_qkv (when the file fuses them) and ffn_gate/ffn_up
    views of the fused ffn_up."""
    out = dict(tensors)
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    for il in range(c.n_layer):
        p = f"blk.{il}."
        qkv = tensors.get(p + "attn_qkv.weight")
        if qkv is not None:
            out.update(row_views(qkv, {p + "attn_q.weight": q_dim, p + "attn_k.weight": kv_dim,
                                       p + "attn_v.weight": kv_dim}))
        elif not all(p + f"attn_{x}.weight" in tensors for x in "qkv"):
            raise ModelFileError(f"missing required tensor {p + 'attn_qkv.weight'!r} (or {p}attn_q/k/v.weight)")
        up = get_tensor(tensors, p + "ffn_up.weight")
        out.update(row_views(up, {p + "ffn_gate.weight": c.n_ff, p + "ffn_up.weight": c.n_ff}))
    return out


def rope_factor_table(c: ModelConfig, tensors: Mapping[str, Tensor]) -> dict[str, np.ndarray | None]:
    """{"freqs", "short", "long"}: the file's RoPE frequency factors, f32 [n_rot/2] each, or None if absent."""
    out = {}
    for key, name in zip(("freqs", "short", "long"), ROPE_FACTOR_TENSORS):
        ff = norm_weight(get_tensor(tensors, name, required=False))
        if ff is not None and (ff.shape != (c.n_rot // 2,) or not (np.isfinite(ff).all() and (ff > 0).all())):
            raise ModelFileError(f"tensor {name!r} must hold n_rot/2 = {c.n_rot // 2} finite values > 0 (RoPE "
                                 f"frequency factors); it has shape {ff.shape}")
        out[key] = ff
    return out


class Phi3Model(Model):
    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, split_fused(config, tensors), kernels, sparse)
        self.rope_table = rope_factor_table(config, tensors)
        self._factor_key = "short"  # which factors the current forward uses (forward sets it)
        self.rope_freqs = self.rope_table["short"]
        self.rope_mscale = config.rope_attn_factor  # llama.cpp's attn_factor scales cos and sin: rotated dims only
        self._plans_by_factors: dict[str, list | None] = {}

    def rope_factors_for(self, n_ctx: int) -> str:
        """Which factors a context of n_ctx positions uses, as llama.cpp picks them: "freqs" if the file has
        rope_freqs.weight, else "long" beyond rope.scaling.original_context_length, else "short"."""
        if self.rope_table["freqs"] is not None:
            return "freqs"
        return "long" if n_ctx > self.config.rope_orig_ctx else "short"

    def attn_plans(self) -> list | None:
        """One plan list per factor choice (the factors are baked into the plans; base.attn_plan_kwargs passes
        self.rope_freqs and the attn_factor as rope_mscale)."""
        key = self._factor_key
        if key not in self._plans_by_factors:
            self.__dict__.pop("_attn_plans", None)
            self._plans_by_factors[key] = super().attn_plans()
        return self._plans_by_factors[key]

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """The pre-norm block of models/base.py with the RoPE factors the cache's context size selects."""
        self._factor_key = self.rope_factors_for(cache.n_ctx)
        self.rope_freqs = self.rope_table[self._factor_key]
        return super().forward(tokens, cache, all_logits)


def phi3_rope(r) -> dict:
    """phi3's long-context RoPE keys (see the module docstring)."""
    orig = r.positive("{arch}.rope.scaling.original_context_length", r.positive("{arch}.context_length"))
    factor = r.get("{arch}.rope.scaling.attn_factor", 1.0, kind=float)
    if not (math.isfinite(factor) and factor > 0):
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.rope.scaling.attn_factor')} must be a "
                             f"finite number > 0, got {factor}")
    return {"rope_orig_ctx": orig, "rope_attn_factor": factor}


def read_args(r, d: dict) -> None:
    d.update(phi3_rope(r))


SPEC = ArchSpec("phi3", model=Phi3Model, expected=expected_tensors, rope_neox=True, chat_format="phi-3")
