"""The metadata of MiniCPM files (GGUF archs "minicpm" and "minicpm3") as llama.cpp reads it: config.py calls
minicpm_keys for both and minicpm3_mla for MiniCPM3's attention sizes.

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

from .errors import ModelFileError, UnsupportedError

MINICPM_ARCHS = ("minicpm", "minicpm3")
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
    rope_mscale (rope.scaling.attn_factor). {} for the other architectures."""
    if r.arch not in MINICPM_ARCHS:
        return {}
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
