"""Phi3ForCausalLM (Phi-3/3.5-mini, Phi-3-medium, Phi-4-mini) -> GGUF architecture "phi3", in llama.cpp's naming.

The HF model is the llama block with two fused projections, which llama.cpp keeps fused:
  self_attn.qkv_proj.weight  (q_dim + 2 kv_dim, n_embd)  rows [q | k | v]  -> blk.N.attn_qkv.weight
  mlp.gate_up_proj.weight    (2 n_ff, n_embd)            rows [gate | up]  -> blk.N.ffn_up.weight
Both are copied row for row: HF's order is llama.cpp's (llama.cpp silus the first half of ffn_up). RoPE is
NeoX-style (HF's rotate-half), so no Q/K permutation either; it covers the first
rope.dimension_count = int(partial_rotary_factor * n_embd) // n_head dims of each head (Phi-4-mini: 0.75).

Long-context checkpoints have rope_scaling {"type": "longrope" (older: "su"), "short_factor", "long_factor"}:
the factors become the f32 tensors rope_factors_short/long.weight [n_rot/2] (per-pair divisors of the RoPE
frequencies), with rope.scaling.original_context_length = original_max_position_embeddings (llama.cpp uses the
long factors when its context exceeds it) and rope.scaling.attn_factor, the factor by which cos and sin grow:
config's rope_scaling.attention_factor if given, else sqrt(1 + ln(s) / ln(orig)) with
s = max_position_embeddings / original_max_position_embeddings (1 when s <= 1), as HF and llama.cpp compute it.
Anything this cannot express (other rope_scaling types, separate short/long mscales, attention biases,
Phi3Small's block-sparse attention) is refused with UnsupportedError.

phi3.attention.sliding_window is written as llama.cpp's converter writes it (0 when config.json has none);
llama.cpp (and our loader) then run full attention, which equals HF's sliding-window attention only for
contexts within the window (Phi-3-mini: 2047 tokens).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import GGMLType
from .checkpoint import Checkpoint
from .common import Dims, LayerHook, activation_meta, common_meta, output_head
from .output import TensorPlan
from .plan import Builder, cfg_value

LONGROPE_TYPES = ("longrope", "su")


def _scaling(ckpt: Checkpoint) -> dict | None:
    """config.json's rope_scaling when it is LongRoPE, None when there is none; anything else is refused."""
    s = ckpt.config.get("rope_scaling")
    where = ckpt.folder / "config.json"
    if not s:
        return None
    if not isinstance(s, dict):
        raise ModelFileError(f"{where}: rope_scaling must be an object, got {s!r}")
    kind = str(s.get("rope_type", s.get("type")) or "").lower()
    if kind == "default":
        return None
    if kind not in LONGROPE_TYPES:
        raise UnsupportedError(f"{where}: rope_scaling type {kind or None!r} is not supported for Phi-3 "
                               f"({', '.join(LONGROPE_TYPES)})")
    if s.get("short_mscale") is not None or s.get("long_mscale") is not None:
        raise UnsupportedError(f"{where}: rope_scaling with separate short_mscale/long_mscale is not supported "
                               "(llama.cpp's phi3 has one attn_factor)")
    return s


def _n_rot(ckpt: Checkpoint, n_embd: int, n_head: int, head_dim: int) -> int:
    pct = float(ckpt.config.get("partial_rotary_factor") or 1.0)
    n_rot = int(pct * n_embd) // n_head if head_dim == n_embd // n_head else int(pct * head_dim)
    if not (0 < n_rot <= head_dim and n_rot % 2 == 0):
        raise ModelFileError(f"{ckpt.folder / 'config.json'}: partial_rotary_factor {pct} gives {n_rot} rotary "
                             f"dims of head_dim {head_dim}: need an even number in 2..{head_dim}")
    return n_rot


def longrope_attn_factor(max_pos: int, orig_ctx: int) -> float:
    """LongRoPE's attention scaling: sqrt(1 + ln(s) / ln(orig_ctx)), s = max_pos / orig_ctx; 1 when s <= 1."""
    scale = max_pos / orig_ctx
    return math.sqrt(1.0 + math.log(scale) / math.log(orig_ctx)) if scale > 1.0 else 1.0


def _factors(ckpt: Checkpoint, s: dict, n_rot: int) -> dict[str, np.ndarray]:
    """{"short", "long"}: the two factor lists as f32 [n_rot/2], checked."""
    where = ckpt.folder / "config.json"
    out = {}
    for key in ("short", "long"):
        values = s.get(f"{key}_factor")
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            arr = np.empty(0)
        if values is None or arr.shape != (n_rot // 2,):
            raise ModelFileError(f"{where}: rope_scaling.{key}_factor must list n_rot/2 = {n_rot // 2} numbers "
                                 f"(rope dims {n_rot}); got {None if values is None else len(np.ravel(arr))}")
        if not (np.isfinite(arr).all() and (arr > 0).all()):
            raise ModelFileError(f"{where}: rope_scaling.{key}_factor must hold finite numbers > 0")
        out[key] = arr.astype(np.float32)
    return out


def phi3_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    cfg, where = ckpt.config, ckpt.folder / "config.json"
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise UnsupportedError(f"{where}: Phi-3 with attention/MLP biases is not supported")
    d = Dims.from_config(ckpt)
    n_embd, n_head = d.n_embd, d.n_head
    max_pos = int(cfg_value(ckpt, "max_position_embeddings", default=4096))
    orig_ctx = int(cfg_value(ckpt, "original_max_position_embeddings", default=max_pos))
    n_rot = _n_rot(ckpt, n_embd, n_head, d.head_dim)
    meta = common_meta(arch, d, max_pos, "layer_norm_rms_epsilon", cfg_value(ckpt, "rms_norm_eps", default=1e-5))
    meta[f"{arch}.rope.dimension_count"] = n_rot
    meta[f"{arch}.rope.freq_base"] = float(cfg_value(ckpt, "rope_theta", default=10000.0))
    meta[f"{arch}.rope.scaling.original_context_length"] = orig_ctx
    meta[f"{arch}.attention.sliding_window"] = int(cfg.get("sliding_window") or 0)
    if d.head_dim != n_embd // n_head:
        meta[f"{arch}.attention.key_length"] = meta[f"{arch}.attention.value_length"] = d.head_dim
    s = _scaling(ckpt)
    if s is not None:
        given = s.get("attention_factor")
        factor = float(given) if given is not None else longrope_attn_factor(max_pos, orig_ctx)
        if not (math.isfinite(factor) and factor > 0):
            raise ModelFileError(f"{where}: rope_scaling.attention_factor must be a number > 0, got {given!r}")
        meta[f"{arch}.rope.scaling.attn_factor"] = factor
    meta.update(activation_meta(ckpt))
    return d, meta


def phi3_tensors(b: Builder, ckpt: Checkpoint, arch: str, d: Dims, sparse: bool, hook: LayerHook) -> None:
    q_dim, kv_dim = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    b.add("token_embd.weight", "model.embed_tokens.weight", (d.n_vocab, d.n_embd))
    s = _scaling(ckpt)
    if s is not None:
        n_rot = _n_rot(ckpt, d.n_embd, d.n_head, d.head_dim)
        for key, values in _factors(ckpt, s, n_rot).items():
            b.add_plain(TensorPlan(f"rope_factors_{key}.weight", GGMLType.F32, values.shape,
                                   lambda v=values: iter([(v, "F32")])))
    for il in range(d.n_layer):
        hf, blk = f"model.layers.{il}.", f"blk.{il}."
        b.add(blk + "attn_norm.weight", hf + "input_layernorm.weight", (d.n_embd,))
        b.add(blk + "attn_qkv.weight", hf + "self_attn.qkv_proj.weight", (q_dim + 2 * kv_dim, d.n_embd))
        b.add(blk + "attn_output.weight", hf + "self_attn.o_proj.weight", (d.n_embd, q_dim))
        b.add(blk + "ffn_norm.weight", hf + "post_attention_layernorm.weight", (d.n_embd,))
        b.add(blk + "ffn_up.weight", hf + "mlp.gate_up_proj.weight", (2 * d.n_ff, d.n_embd))
        b.add(blk + "ffn_down.weight", hf + "mlp.down_proj.weight", (d.n_embd, d.n_ff))
        hook(il)
    b.add("output_norm.weight", "model.norm.weight", (d.n_embd,))
    output_head(b, ckpt, "lm_head.weight", d, tied_default=False)
