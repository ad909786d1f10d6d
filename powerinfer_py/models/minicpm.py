"""OpenBMB MiniCPM (GGUF arch "minicpm": MiniCPM 1B/2B, MiniCPM4/4.1, MiniCPM-MoE) and MiniCPM3 ("minicpm3").

minicpm runs llama.cpp's granite graph (models/granite.py): the llama block with scaled embeddings, residual
branches and logits; the metadata notes below say where the three scalars come from (keys, or MiniCPM's defaults):
    x = token_embd[ids] * embd_scale
    per layer: h = x + residual_scale * Wo · attn(rope(q), rope(k), v)      (scores x 1/sqrt(head_dim))
               x = h + residual_scale * ffn(rmsnorm(h) * ffn_norm)
    logits = (output · (rmsnorm(x) * output_norm)) / logit_scale
RoPE in the normal layout (pairs 2i, 2i+1). LongRoPE files (rope.scaling.type "longrope") divide the
frequencies by rope_factors_long.weight when the context (the cache's n_ctx) exceeds
rope.scaling.original_context_length and by rope_factors_short.weight otherwise, as llama.cpp picks them; the
one-call decode plans are kept per choice. MiniCPM-MoE: granitemoe's experts (moe.MoEFFN: softmax router,
top-k, weights renormalized), feed_forward_length wide, no shared expert (llama.cpp's minicpm reads none).

minicpm3 is deepseek2's multi-head latent attention (models/deepseek2.py: the absorbed form and the latent
cache) with a dense SwiGLU FFN, NeoX RoPE on the tail of each q/k head, the LongRoPE factors as above, and the
same three scalars fixed at embeddings x12, residual branches x1.4/sqrt(n_layer), logits x256/n_embd:
    x = 12 * token_embd[ids]
    per layer: x = x + s * mla_attention(rmsnorm(x) * attn_norm)      s = 1.4 / sqrt(n_layer)
               x = x + s * ffn(rmsnorm(x) * ffn_norm)
    logits = output · (rmsnorm(x) * output_norm) * (256 / n_embd)
Each scaled branch is rounded to f32 before its add, as llama.cpp's graph does.

Metadata keys (config.read with SPEC and read_args):
As llama.cpp reads it: read_args calls minicpm_keys for both archs, and minicpm3's mla hook minicpm3_mla for
its attention sizes.

minicpm (MiniCPM 1B/2B, MiniCPM4/4.1, MiniCPM-MoE): granite's four scalars (models/granite.py) with MiniCPM's
defaults when a key is absent (older files carry none of them):
    {arch}.embedding_scale   default 12                       the embeddings are multiplied by it
    {arch}.residual_scale    default 1.4 / sqrt(n_layer)      attention and FFN outputs, before each residual add
    {arch}.logit_scale       default 256 / n_embd             the logits are divided by it
A key that is present wins (llama.cpp's converter writes scale_emb, scale_depth / sqrt(n_layer) and
hidden_size / dim_model_base). Note the default logit scale is llama.cpp's, the inverse of the one its own
converter writes (n_embd / 256): a file without the key gets logits n_embd/256 times too large in llama.cpp,
and we do what llama.cpp does. embedding_scale or residual_scale 0 means unset (1), as in llama.cpp; a logit
scale of 0 is refused (llama.cpp would divide by it). attention.scale is not read (scores use 1/sqrt(head_dim))
and RoPE is always on (rope.scaling.finetuned is ignored), as llama.cpp's minicpm loader does.
LongRoPE (MiniCPM4): files with {arch}.rope.scaling.type = "longrope" may carry rope_factors_short/long.weight;
the long ones run when the context exceeds rope.scaling.original_context_length (default context_length), the
short ones otherwise (as phi3). Without that type, an optional rope_freqs.weight is used instead (llama's).
rope.scaling.attn_factor, when present, scales the rotated dims of q and k (llama.cpp multiplies cos and sin).

minicpm3 (MiniCPM3-4B): deepseek2's multi-head latent attention without experts (q_lora_rank, kv_lora_rank,
key_length = nope + rope dims, rope.dimension_count = rope dims, value_length default n_embd / n_head as
llama.cpp's), NeoX RoPE on the tail of each q/k head, optional rope_factors_short/long.weight picked as above;
the scalars are fixed in llama.cpp's graph whatever the file says: embeddings x12, residual branches
x1.4/sqrt(n_layer), and the final normed state x256/n_embd before the output matmul (here: logit_scale
n_embd/256, the same product).
"""
from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.cache import KVCache
from . import deepseek2, granite
from .phi3 import ROPE_FACTOR_TENSORS, rope_factor_table
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> dict:
    """minicpm: granite's table plus the optional LongRoPE factors."""
    e = granite.expected_tensors(c)
    for name in ROPE_FACTOR_TENSORS[1:]:
        e[name] = ((c.n_rot // 2,), False)
    return e


def expected_tensors_3(c: ModelConfig) -> dict:
    """minicpm3: deepseek2's table (one attn_kv_b, no experts) plus the optional LongRoPE factors."""
    e = deepseek2.expected_tensors(c)
    for name in ROPE_FACTOR_TENSORS[1:]:
        e[name] = ((c.n_rot // 2,), False)
    return e


class _LongRope:
    """The LongRoPE choice for a model whose RoPE factors (self.rope_freqs) are fixed per forward pass."""

    def _init_longrope(self, config: ModelConfig, tensors) -> None:
        self._rope_table = rope_factor_table(config, tensors) if config.rope_orig_ctx else None
        self._factor_key = ""
        self._plans_by_factors: dict[str, list | None] = {}

    def rope_factors_for(self, n_ctx: int) -> str:
        """"long" beyond rope.scaling.original_context_length, else "short" ("" for files without LongRoPE)."""
        if self._rope_table is None:
            return ""
        return "long" if n_ctx > self.config.rope_orig_ctx else "short"

    def _pick_factors(self, cache: KVCache) -> None:
        key = self.rope_factors_for(cache.n_ctx)
        if key and key != self._factor_key:
            self._plans_by_factors[self._factor_key] = self.__dict__.pop("_attn_plans", None)
            self._factor_key = key
            self.rope_freqs = self._rope_table[key]
            plans = self._plans_by_factors.get(key)
            if plans is not None:
                self._attn_plans = plans


class MiniCPMModel(_LongRope, granite.GraniteModel):
    """GraniteModel with the LongRoPE choice of the module docstring."""

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        self._init_longrope(config, tensors)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        self._pick_factors(cache)
        return super().forward(tokens, cache, all_logits)


class MiniCPM3Model(_LongRope, deepseek2.DeepSeek2Model):
    """DeepSeek2Model's attention with MiniCPM's scalars and LongRoPE (module docstring)."""

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        self._init_longrope(config, tensors)
        self._embd_scale = np.float32(config.embd_scale)
        self._res_scale = np.float32(config.residual_scale)
        self._logit_mul = np.float32(1.0) / np.float32(config.logit_scale)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        self._pick_factors(cache)
        ids, pos, p0 = self._begin(tokens, cache)
        x = self._embed(ids, pos)
        x *= self._embd_scale
        for il, L in enumerate(self.layers):
            x += self._attention(L, k.rmsnorm(x, L.attn_norm, c.norm_eps), pos, p0, cache, il) * self._res_scale
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, c.norm_eps), x) * self._res_scale
        cache.n_past = p0 + ids.shape[0]
        logits = self._head(x, all_logits)
        logits *= self._logit_mul
        return logits


EMBD_SCALE = 12.0  # MiniCPM's scale_emb
DEPTH_SCALE = 1.4  # MiniCPM's scale_depth: residual branches x DEPTH_SCALE / sqrt(n_layer)
DIM_MODEL_BASE = 256  # MiniCPM's dim_model_base


def _scale(r, suffix: str, default: float, allow_zero: bool) -> float:
    value = r.get(suffix, default, kind=float)
    if not (math.isfinite(value) and (value > 0 or (allow_zero and value == 0))):
        need = ">= 0 (0: unset)" if allow_zero else "> 0"
        raise ModelFileError(f"{r.f.path}: metadata key {r.key(suffix)!r} must be a finite number {need}, "
                             f"got {value}")
    return value if value else 1.0


def minicpm_keys(r, n_embd: int, n_layer: int, n_ctx_train: int) -> dict:
    """ModelConfig fields of a minicpm / minicpm3 file (module docstring): embd_scale, residual_scale,
    logit_scale, rope_orig_ctx (> 0: the file's LongRoPE factors are chosen by context size; 0: none) and
    rope_mscale (rope.scaling.attn_factor)."""
    depth = DEPTH_SCALE / math.sqrt(n_layer)
    if r.arch == "minicpm3":
        out = {"embd_scale": EMBD_SCALE, "residual_scale": depth, "logit_scale": n_embd / DIM_MODEL_BASE}
    else:
        out = {"embd_scale": _scale(r, "{arch}.embedding_scale", EMBD_SCALE, True),
               "residual_scale": _scale(r, "{arch}.residual_scale", depth, True),
               "logit_scale": _scale(r, "{arch}.logit_scale", DIM_MODEL_BASE / n_embd, False)}
    longrope = r.arch == "minicpm3" or r.get("{arch}.rope.scaling.type", "none", kind=str) == "longrope"
    out["rope_orig_ctx"] = r.positive("{arch}.rope.scaling.original_context_length", n_ctx_train) if longrope else 0
    out["rope_mscale"] = _scale(r, "{arch}.rope.scaling.attn_factor", 1.0, False)
    return out


def minicpm3_mla(r, n_embd: int, n_head: int) -> dict:
    """MiniCPM3's attention sizes as deepseek2's config fields, plus "head_dim" (the q/k head width)."""
    head_dim = r.positive("{arch}.attention.key_length")
    if r.key("{arch}.rope.dimension_count") not in r.meta:
        raise ModelFileError(f"{r.f.path}: missing required metadata key {r.key('{arch}.rope.dimension_count')!r}")
    if r.get("{arch}.expert_count", 0):
        raise UnsupportedError(f"{r.f.path}: minicpm3 files with experts are not supported (llama.cpp has none)")
    return {"head_dim": head_dim, "q_lora_rank": r.positive("{arch}.attention.q_lora_rank"),
            "kv_lora_rank": r.positive("{arch}.attention.kv_lora_rank"),
            "v_head_dim": r.positive("{arch}.attention.value_length", n_embd // n_head), "mla_kv_split": False}


def read_args(r, d: dict) -> None:
    m = minicpm_keys(r, d["n_embd"], d["n_layer"], d["n_ctx_train"])
    d["rope_mscale"] = m.pop("rope_mscale", d["rope_mscale"])
    d.update(m)


def describe(c: dict) -> list[tuple[str, str]]:
    return [("minicpm scales", f"embeddings x{c['embd_scale']:g}, residual branches x{c['residual_scale']:.4g}, "
             f"logits / {c['logit_scale']:g}" + (f"; latent attention (MLA): cache {c['kv_lora_rank']} + "
                                                f"{c['n_rot']} per token" if c["kv_lora_rank"] else ""))]


SPEC = ArchSpec("minicpm", model=MiniCPMModel, expected=expected_tensors, moe_norm=True, expert_width_key="{arch}.feed_forward_length",
                longrope=True, describe=describe)
VARIANTS = (ArchSpec("minicpm3", model=MiniCPM3Model, expected=expected_tensors_3, rope_neox=True, longrope=True,
                     mla=lambda r, d: minicpm3_mla(r, d["n_embd"], d["n_head"]), describe=describe),)
