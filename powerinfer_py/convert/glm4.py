"""Glm4ForCausalLM (GLM-4-9B/32B-0414, GLM-Z1-9B/32B) -> GGUF architecture "glm4", in llama.cpp's naming.

The HF block normalizes each branch twice; the names map as llama.cpp's converter maps them:
  input_layernorm            -> attn_norm             (before attention)
  post_self_attn_layernorm   -> post_attention_norm   (on the attention's output)
  post_attention_layernorm   -> ffn_norm              (before the MLP)
  post_mlp_layernorm         -> post_ffw_norm         (on the MLP's output)
  self_attn.{q,k,v}_proj (+ .bias, GLM-4-0414 has them) -> attn_q/k/v, o_proj -> attn_output
  mlp.gate_up_proj  (2 n_ff, n_embd) rows [gate | up]  -> ffn_up, kept fused (llama.cpp silus the first half)
RoPE: HF's Glm4 rotates interleaved pairs (2i, 2i+1) of the first int(head_dim * partial_rotary_factor) dims of
each head (partial_rotary_factor 0.5 on the released models) with frequencies theta^(-2i / that width): llama.cpp's
normal layout with rope.dimension_count = that width, so the Q/K rows are copied as they are (no permutation).
Refused: rope_scaling, an activation other than silu, a PowerInfer predictor (no PWRI glm4 files).
"""
from __future__ import annotations

from typing import Any

from ..errors import ModelFileError, UnsupportedError
from .checkpoint import Checkpoint
from .common import Dims, LayerHook, common_meta, output_head
from .plan import Builder, cfg_value


def glm4_hparams(ckpt: Checkpoint, arch: str) -> tuple[Dims, dict[str, Any]]:
    cfg, where = ckpt.config, ckpt.folder / "config.json"
    scaling = cfg.get("rope_scaling")
    if scaling and (scaling.get("rope_type", scaling.get("type")) or "default") != "default":
        raise UnsupportedError(f"{where}: GLM-4 with rope_scaling {scaling!r} is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedError(f"{where}: GLM-4 hidden_act {cfg.get('hidden_act')!r} is not supported (silu)")
    d = Dims.from_config(ckpt)
    n_embd, n_head = d.n_embd, d.n_head
    factor = float(cfg.get("partial_rotary_factor", 0.5))
    n_rot = int(d.head_dim * factor)
    if not (0 < n_rot <= d.head_dim and n_rot % 2 == 0):
        raise ModelFileError(f"{where}: partial_rotary_factor {factor} gives {n_rot} rotary dims of head_dim "
                             f"{d.head_dim}: need an even number in 2..{d.head_dim}")
    meta = common_meta(arch, d, cfg_value(ckpt, "max_position_embeddings", default=32768),
                        "layer_norm_rms_epsilon", cfg_value(ckpt, "rms_norm_eps", default=1e-5))
    meta[f"{arch}.rope.dimension_count"] = n_rot
    meta[f"{arch}.rope.freq_base"] = float(cfg_value(ckpt, "rope_theta", default=10000.0))
    if d.head_dim != n_embd // n_head:
        meta[f"{arch}.attention.key_length"] = meta[f"{arch}.attention.value_length"] = d.head_dim
    return d, meta


def glm4_tensors(b: Builder, ckpt: Checkpoint, arch: str, d: Dims, sparse: bool, hook: LayerHook) -> None:
    if sparse:
        raise UnsupportedError(f"{ckpt.folder}: GLM-4 with a PowerInfer predictor is not supported")
    q_dim, kv_dim = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    b.add("token_embd.weight", "model.embed_tokens.weight", (d.n_vocab, d.n_embd))
    for il in range(d.n_layer):
        hf, blk = f"model.layers.{il}.", f"blk.{il}."
        b.add(blk + "attn_norm.weight", hf + "input_layernorm.weight", (d.n_embd,))
        for name, proj, rows in (("attn_q", "q_proj", q_dim), ("attn_k", "k_proj", kv_dim), ("attn_v", "v_proj", kv_dim)):
            b.add(f"{blk}{name}.weight", f"{hf}self_attn.{proj}.weight", (rows, d.n_embd))
            if ckpt.has(f"{hf}self_attn.{proj}.bias"):
                b.add(f"{blk}{name}.bias", f"{hf}self_attn.{proj}.bias", (rows,))
        b.add(blk + "attn_output.weight", hf + "self_attn.o_proj.weight", (d.n_embd, q_dim))
        b.add(blk + "post_attention_norm.weight", hf + "post_self_attn_layernorm.weight", (d.n_embd,))
        b.add(blk + "ffn_norm.weight", hf + "post_attention_layernorm.weight", (d.n_embd,))
        b.add(blk + "ffn_up.weight", hf + "mlp.gate_up_proj.weight", (2 * d.n_ff, d.n_embd))
        b.add(blk + "ffn_down.weight", hf + "mlp.down_proj.weight", (d.n_embd, d.n_ff))
        b.add(blk + "post_ffw_norm.weight", hf + "post_mlp_layernorm.weight", (d.n_embd,))
        hook(il)
    b.add("output_norm.weight", "model.norm.weight", (d.n_embd,))
    output_head(b, ckpt, "lm_head.weight", d, tied_default=False)
