"""GLM-4-0414 / GLM-Z1 (GGUF arch "glm4") and GLM-4.5 / 4.6 / 4.5-Air (arch "glm4moe"), as llama.cpp computes them.

glm4, per layer il (a "sandwich" block: each branch is normed on the way in and on the way out):
    n  = rmsnorm(x) * attn_norm
    q, k, v = Wq·n + bq, Wk·n + bk, Wv·n + bv        (one fused attn_qkv, rows [q | k | v], or attn_q/k/v;
                                                      biases optional, attn_qkv.bias split the same way)
    q, k = rope(q), rope(k)                           the first n_rot dims of each head (rope.dimension_count:
                                                      head_dim / 2 in the real files), normal layout (2i, 2i+1)
    x  = x + rmsnorm(Wo · attention(q, k, v)) * post_attention_norm      (scale 1/sqrt(head_dim))
    m  = rmsnorm(x) * ffn_norm
    g, u = split(Wup · m)                             ffn_up (2 n_ff, n_embd): rows [gate | up]
    x  = x + rmsnorm(Wdown · (silu(g) * u)) * post_ffw_norm
    logits = output · (rmsnorm(x_last) * output_norm)                    (tied to token_embd when absent)

glm4moe, per layer il (pre-norm, llama-shaped; note the names: its pre-FFN norm is called post_attention_norm):
    n  = rmsnorm(x) * attn_norm
    q, k, v as above (GLM-4.5 has the biases); per-head RMSNorms of q and k by attn_q_norm / attn_k_norm where
        the file has them (the 355B model), before RoPE
    q, k = rope(q), rope(k)                           NeoX layout (i, i + n_rot/2) over the first n_rot dims
    x  = x + Wo · attention(q, k, v)
    m  = rmsnorm(x) * post_attention_norm
    x  = x + ffn_il(m)
ffn_il: SwiGLU with separate ffn_gate / ffn_up on the first leading_dense_block_count layers; then experts
(moe.MoEFFN):
    s      = sigmoid(router · m)                     (softmax when expert_gating_func says 1)
    chosen = the n_used experts with the largest s + b      b = exp_probs_b.bias (steers the choice only)
    w      = s[chosen], divided by their sum (clamped at 6.1e-5) when expert_weights_norm, times
             expert_weights_scale (GLM-4.5: 2.5)
    y      = sum_r w_r * expert_{chosen_r}(m)  +  shared(m)        shared: ffn_*_shexp, added ungated

Both: the last {arch}.nextn_predict_layers blocks of the file (blk.N, N >= n_layer; multi-token prediction, with
extra nextn.* tensors) are not run, as llama.cpp skips them; config.n_layer already leaves them out.
The fused attn_qkv and ffn_up are split into row views of the same bytes (phi3.row_views), so the kernels, the
one-call attention step (with biases, Q/K norms and glm4's post-attention norm) and every dense-FFN sparse mode
take them as they take llama's.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  glm4, glm4moe  (GLM-4-0414 / GLM-Z1; GLM-4.5 / 4.6 / 4.5-Air) RoPE over the first rope.dimension_count dims of
          each head (half of them in the real files): normal layout (pairs 2i, 2i+1) for glm4, NeoX for glm4moe, as
          llama.cpp's rope types; {arch}.nextn_predict_layers trailing blocks (multi-token prediction) are in the
          file and in block_count but not run: n_layer = block_count - nextn_predict_layers (n_nextn holds the
          count); files with rope.dimension_sections (M-RoPE, the vision variants) are refused. glm4moe:
          leading_dense_block_count dense layers (feed_forward_length wide), then experts
          (expert_feed_forward_length wide) with expert_gating_func (absent/0: sigmoid, 1 softmax, 2 sigmoid), the
          selection bias exp_probs_b.bias, expert_weights_norm (default off), expert_weights_scale (absent/0: 1) and
          an ungated shared expert expert_shared_count x expert_feed_forward_length wide; groups are refused
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.moe import MoEFFN
from ..gguf.types import GGMLType, Tensor
from .base import Expected, Model, ffn_expected, get_tensor, head_expected, norm_weight
from .phi3 import row_views
from .spec import ArchSpec

_QKV = ("attn_q", "attn_k", "attn_v")


def expected_tensors(c: ModelConfig) -> Expected:
    """The tensors of the layers that run (the next-token-prediction blocks after them are not looked at).
    attn_qkv or attn_q/k/v may be present (the model checks one form is); biases are optional."""
    E, hd = c.n_embd, c.head_dim
    q_dim, kv_dim = c.n_head * hd, c.n_head_kv * hd
    e = head_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((E,), True)
        e[p + "attn_qkv.weight"] = ((q_dim + 2 * kv_dim, E), False)
        e[p + "attn_qkv.bias"] = ((q_dim + 2 * kv_dim,), False)
        for name, rows in zip(_QKV, (q_dim, kv_dim, kv_dim)):
            e[f"{p}{name}.weight"] = ((rows, E), False)
            e[f"{p}{name}.bias"] = ((rows,), False)
        e[p + "attn_output.weight"] = ((E, q_dim), True)
        e[p + "post_attention_norm.weight"] = ((E,), True)
        if c.arch == "glm4":
            e[p + "ffn_norm.weight"] = ((E,), True)
            e[p + "ffn_up.weight"] = ((2 * c.n_ff, E), True)
            e[p + "ffn_down.weight"] = ((E, c.n_ff), True)
            e[p + "post_ffw_norm.weight"] = ((E,), True)
            continue
        e[p + "attn_q_norm.weight"] = ((hd,), False)
        e[p + "attn_k_norm.weight"] = ((hd,), False)
        e.update(ffn_expected(c, il, shared_gate=False, select_bias=True))
    return e


def split_fused(c: ModelConfig, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """tensors plus, per layer that runs, attn_q/k/v views (and bias slices) of a fused attn_qkv, and for glm4
    ffn_gate / ffn_up views of the fused ffn_up."""
    out = dict(tensors)
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    for il in range(c.n_layer):
        p = f"blk.{il}."
        qkv = tensors.get(p + "attn_qkv.weight")
        if qkv is not None:
            out.update(row_views(qkv, {f"{p}{x}.weight": n for x, n in zip(_QKV, (q_dim, kv_dim, kv_dim))}))
            b = norm_weight(tensors.get(p + "attn_qkv.bias"))
            if b is not None:
                cuts = np.cumsum([0, q_dim, kv_dim, kv_dim])
                out.update({f"{p}{x}.bias": Tensor(f"{p}{x}.bias", GGMLType.F32, (int(b1 - b0),),
                                                   np.ascontiguousarray(b[b0:b1]))
                            for x, b0, b1 in zip(_QKV, cuts[:-1], cuts[1:])})
        elif not all(f"{p}{x}.weight" in tensors for x in _QKV):
            raise ModelFileError(f"missing required tensor {p + 'attn_qkv.weight'!r} (or {p}attn_q/k/v.weight)")
        if c.arch == "glm4":
            up = get_tensor(tensors, p + "ffn_up.weight")
            out.update(row_views(up, {p + "ffn_gate.weight": c.n_ff, p + "ffn_up.weight": c.n_ff}))
    return out


class Glm4Model(Model):
    """Both archs on the pre-norm forward of models/base.py: glm4 adds the two output norms through the
    _attn_out / _ffn_out hooks (and the one-call step's post_norm); glm4moe names its pre-FFN norm
    post_attention_norm. Biases and Q/K norms are switched on per file (QKV_BIASES, QK_NORMS)."""

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        glm4 = config.arch == "glm4"
        names = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
                 "wv": "attn_v.weight", "wo": "attn_output.weight", "bq": "attn_q.bias", "bk": "attn_k.bias",
                 "bv": "attn_v.bias"}
        if glm4:
            names.update(post_attn_norm="post_attention_norm.weight", ffn_norm="ffn_norm.weight",
                         post_ffw_norm="post_ffw_norm.weight")
        else:
            names.update(ffn_norm="post_attention_norm.weight", q_norm="attn_q_norm.weight",
                         k_norm="attn_k_norm.weight")
        self.LAYER_TENSORS = names
        self.OPTIONAL_TENSORS = ("bq", "bk", "bv", "q_norm", "k_norm")
        super().__init__(config, split_fused(config, tensors), kernels, sparse)
        self.post_norms = glm4  # tests switch it off to see it matter
        self.QKV_BIASES = any(b is not None for L in self.layers for b in (L.bq, L.bk, L.bv))
        if self.QKV_BIASES:  # a missing bias of a file that has others adds nothing
            dims = {"bq": config.n_head * config.head_dim, "bk": config.n_head_kv * config.head_dim}
            dims["bv"] = dims["bk"]
            for L in self.layers:
                for attr, n in dims.items():
                    if getattr(L, attr) is None:
                        setattr(L, attr, np.zeros(n, np.float32))
        if not glm4:
            norms = [(L.q_norm is not None, L.k_norm is not None) for L in self.layers]
            if len(set(norms)) > 1 or norms[0][0] != norms[0][1]:
                raise ModelFileError(f"{config.arch}: attn_q_norm / attn_k_norm must be in every layer or in none")
            self.QK_NORMS = norms[0][0]

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        c = self.config
        moe = super().build_moe(tensors, il)
        return MoEFFN(self.kernels, moe.router, moe.gate, moe.up, moe.down, c.n_expert_used, c.expert_weights_norm,
                      layer=il, shared=moe.shared, shared_gate=None,
                      select_bias=norm_weight(get_tensor(tensors, f"blk.{il}.exp_probs_b.bias")),
                      gating=c.expert_gating, weights_scale=c.expert_weights_scale)

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        kw = super().attn_plan_kwargs(il, layer)
        if self.post_norms:
            kw["post_norm"] = layer.post_attn_norm
        return kw

    def _attn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        if not self.post_norms:
            return y
        return self.kernels.rmsnorm(y, self.layers[il].post_attn_norm, self.config.norm_eps)

    def _ffn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        if not self.post_norms:
            return y
        return self.kernels.rmsnorm(y, self.layers[il].post_ffw_norm, self.config.norm_eps)


def _layout(r, d: dict) -> None:
    """M-RoPE files (the vision variants) are refused; glm4moe's per-layer FFN kinds and routing (the
    renormalization and the shared experts wait in "_norm" / "_n_shared" for read_args)."""
    sections = r.meta.get(r.key("{arch}.rope.dimension_sections"))
    if isinstance(sections, list) and any(sections):
        raise UnsupportedError(f"{r.f.path}: {r.arch} files with rope.dimension_sections (multimodal "
                               "M-RoPE) are not supported")
    if r.arch == "glm4":
        return
    n_layer = d["n_layer"]
    lead = r.get("{arch}.leading_dense_block_count", 0)
    if not 0 <= lead <= n_layer:
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.leading_dense_block_count')} {lead} is outside "
                             f"0..{n_layer} (the layers that run)")
    gating = r.get("{arch}.expert_gating_func", 0)
    if gating not in (0, 1, 2):
        raise UnsupportedError(f"{r.f.path}: {r.key('{arch}.expert_gating_func')} {gating} is not "
                               "supported (1 softmax, 2 sigmoid)")
    if r.get("{arch}.expert_group_count", 0) > 1:
        raise UnsupportedError(f"{r.f.path}: glm4moe files with expert groups are not supported")
    norm, scale = r.expert_weights()
    d.update(moe_layers=tuple(il >= lead for il in range(n_layer)),
             expert_gating="softmax" if gating == 1 else "sigmoid", expert_weights_scale=scale or 1.0,
             _norm=norm, _n_shared=r.get("{arch}.expert_shared_count", 0))


def read_args(r, d: dict) -> None:
    if r.arch == "glm4moe":  # shared experts of the routed width
        d.update(expert_weights_norm=d.pop("_norm"), n_ff_shexp=d["n_ff_exp"] * d.pop("_n_shared"))


def describe(c: dict) -> list[tuple[str, str]]:
    return [(c["arch"], "post-attention and post-FFN norms; fused gate+up" if c["arch"] == "glm4" else
             f"router {c['expert_gating']}, x{c['expert_weights_scale']:g}")]


SPEC = ArchSpec("glm4", model=Glm4Model, expected=expected_tensors, nextn=True, layout=_layout, describe=describe)
VARIANTS = (replace(SPEC, name="glm4moe", rope_neox=True, moe=True, moe_norm=False),)  # leading dense layers, sigmoid experts
