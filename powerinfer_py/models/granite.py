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

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  granite, granitemoe  the llama block (normal RoPE) with four scalars: {arch}.embedding_scale multiplies the
          embeddings (embd_scale), {arch}.residual_scale the attention and FFN outputs before each residual add,
          {arch}.attention.scale replaces 1/sqrt(head_dim) (attn_scale), and the logits are divided by
          {arch}.logit_scale (required); 0 or absent means unset for the first three, as in llama.cpp.
          {arch}.rope.scaling.finetuned = false switches RoPE off (n_rot 0). granitemoe: experts
          feed_forward_length wide, renormalized router weights, an optional ungated shared expert
          ({arch}.expert_shared_feed_forward_length). granitehybrid (Granite 4.0-H) reads the same scalars, with
          logit_scale optional there (absent: 1), as llama.cpp; its layer kinds come from models/nemotron_h.py (mamba2_keys)
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from .base import Expected, llama_like_expected
from .llama import LlamaModel
from .spec import ArchSpec

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


def apply_scales(r, d: dict) -> None:
    """granite's four scalars into the draft (the family's reader: granite, granitemoe, granitehybrid)."""
    g = granite_scales(r)
    d["embd_scale"] = g.pop("embd_scale")
    d["attn_scale"] = g.pop("attn_scale") or d["attn_scale"]
    if not g.pop("rope"):
        d["n_rot"] = 0
    d.update(g)


def granite_scales(r) -> dict:
    """granite's scalars (module docstring) as ModelConfig fields, plus "rope" (False: no RoPE) and
    "attn_scale" (0: 1/sqrt(head_dim)). Unset (0 or absent) means 1."""
    out = {}
    for field, suffix in (("embd_scale", "{arch}.embedding_scale"), ("residual_scale", "{arch}.residual_scale"),
                          ("attn_scale", "{arch}.attention.scale"), ("logit_scale", "{arch}.logit_scale")):
        optional = field != "logit_scale" or r.arch == "granitehybrid"
        value = r.get(suffix, 0.0 if optional else None, kind=float)
        if not (math.isfinite(value) and value >= 0) or (field == "logit_scale" and value == 0 and not optional):
            need = ">= 0 (0: unset)" if optional else "> 0"
            raise ModelFileError(f"{r.f.path}: metadata key {r.key(suffix)!r} must be a finite number "
                                 f"{need}, got {value}")
        out[field] = value if value or field == "attn_scale" else 1.0
    rope = r.meta.get(r.key("{arch}.rope.scaling.finetuned"), True)
    if not isinstance(rope, bool):
        raise ModelFileError(f"{r.f.path}: metadata key {r.key('{arch}.rope.scaling.finetuned')!r} should "
                             f"be a bool, got {rope!r}")
    out["rope"] = rope
    return out


def read_args(r, d: dict) -> None:
    apply_scales(r, d)


def describe(c: dict) -> list[tuple[str, str]]:
    """`powerinfer info` rows of a granite-family config (cli/info.py)."""
    return [("granite scales", f"embeddings x{c['embd_scale']:g}, residual branches x{c['residual_scale']:g}, "
             f"attention scores x{c['attn_scale']:g}, logits / {c['logit_scale']:g}")]


SPEC = ArchSpec("granite", model=GraniteModel, expected=expected_tensors, describe=describe)
VARIANTS = (replace(SPEC, name="granitemoe", moe=True, moe_norm=True, expert_width_key="{arch}.feed_forward_length",
                    shared_expert="optional"),)  # with experts (GraniteModel.build_moe)
