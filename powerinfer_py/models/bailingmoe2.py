"""Ling / Ring mini 2.0 and flash 2.0 (GGUF arch "bailingmoe2", inclusionAI), as llama.cpp's graph computes them.

Per layer il (pre-norm, llama-shaped):
    n  = rmsnorm(x) * attn_norm
    q, k, v = split(Wqkv · n)                       one fused attn_qkv: rows [q (n_embd) | k | v], no biases
    q, k = rmsnorm per head (attn_q_norm, attn_k_norm), then NeoX RoPE over the first n_rot dims of each head
                                                    (rope.dimension_count: half the head in the real files)
    x  = x + Wo · attention(q, k, v)                 (scale 1/sqrt(head_dim))
    m  = rmsnorm(x) * ffn_norm
    x  = x + ffn_il(m)
    logits = output · (rmsnorm(x_last) * output_norm)
ffn_il: SwiGLU (ffn_gate / ffn_up / ffn_down) on the first leading_dense_block_count layers; then experts
(moe.MoEFFN) plus a shared expert:
    s      = sigmoid(router · m) (expert_gating_func 2; softmax when 1)
    chosen = the n_used experts with the largest s + b  (b = exp_probs_b.bias when the file has it), within the
             expert_group_used_count best groups when the file has groups (Ling mini 2.0: 8 groups, 4 used)
    w      = s[chosen], divided by their sum (clamped at 6.1e-5) with expert_weights_norm, times
             expert_weights_scale (Ling mini 2.0: 2.5)
    y      = sum_r w_r * expert_{chosen_r}(m)  +  shared(m)      shared: ffn_*_shexp, SwiGLU, added ungated
The trailing nextn_predict_layers blocks (multi-token prediction) are not run (config.n_layer leaves them out).
The fused attn_qkv is split into row views of the same bytes, so the one-call decode step takes it as llama's.

Metadata keys (config.read with SPEC and read_args), as llama.cpp reads them for bailingmoe2 and for afmoe
(Arcee's Trinity Nano / Mini), which shares ling_trinity_keys below (its windows: models/afmoe.py).

Both (keys under {arch}.):
  leading_dense_block_count (default 0) dense SwiGLU layers feed_forward_length wide, then experts
  expert_feed_forward_length wide (one value for all layers); expert_gating_func 1 softmax, 2 sigmoid (required
  by bailingmoe2; afmoe: absent or 0 means sigmoid); the selection bias exp_probs_b.bias (a tensor: optional in
  bailingmoe2, required in afmoe); expert_weights_norm (default off); expert_weights_scale (absent / 0: 1);
  group-limited routing by expert_group_count / expert_group_used_count (llama.cpp reads them for every arch);
  a shared SwiGLU expert added ungated.
bailingmoe2: the shared expert is (expert_shared_feed_forward_length, or the expert width when absent or 0) x
  expert_shared_count wide, as llama.cpp sizes it (expert_shared_count required, >= 1: every MoE layer has one);
  nextn_predict_layers trailing multi-token-prediction blocks are in the file but not run; the fused attn_qkv
  has n_embd query rows, so n_head x head_dim must equal n_embd.
afmoe: expert_shared_count (required; 0: no shared expert) x the expert width; the embeddings are multiplied by
  sqrt(n_embd) (mu-P); layers with (il + 1) % 4 == 0 use no RoPE (llama.cpp's n_no_rope_layer_step, which no key
  sets for this arch); attention.sliding_window must be > 0 (without it llama.cpp's afmoe graph crashes: measured),
  and layers are windowed per attention.sliding_window_pattern (an array of per-layer flags, or a period P,
  default 4: layers il % P < P - 1), with RoPE base rope.freq_base_swa (default: the global base) on them.
"""
from __future__ import annotations

import math
from typing import Mapping

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.moe import MoEFFN
from ..gguf.types import Tensor
from .base import Expected, Model, ffn_expected, get_tensor, head_expected, norm_weight
from .glm4 import split_fused
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    """The tensors of the layers that run; the output head is required, as llama.cpp's loader has it."""
    E, hd = c.n_embd, c.head_dim
    kv_dim = c.n_head_kv * hd
    e = head_expected(c)
    e["output.weight"] = ((c.n_vocab, E), True)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((E,), True)
        e[p + "attn_qkv.weight"] = ((E + 2 * kv_dim, E), True)
        e[p + "attn_output.weight"] = ((E, c.n_head * hd), True)
        e[p + "attn_q_norm.weight"] = ((hd,), True)
        e[p + "attn_k_norm.weight"] = ((hd,), True)
        e[p + "ffn_norm.weight"] = ((E,), True)
        e.update(ffn_expected(c, il, shared_gate=False, select_bias=False))
    return e


class BailingMoe2Model(Model):
    """The pre-norm forward of models/base.py with per-head Q/K norms; attn_qkv split into q/k/v views."""

    LAYER_TENSORS = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
                     "wv": "attn_v.weight", "wo": "attn_output.weight", "q_norm": "attn_q_norm.weight",
                     "k_norm": "attn_k_norm.weight", "ffn_norm": "ffn_norm.weight"}
    QK_NORMS = True

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        super().__init__(config, split_fused(config, tensors), kernels, sparse)

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        c = self.config
        moe = super().build_moe(tensors, il)  # router, expert stacks and the (ungated) shared expert
        bias = norm_weight(get_tensor(tensors, f"blk.{il}.exp_probs_b.bias", required=False))
        return MoEFFN(self.kernels, moe.router, moe.gate, moe.up, moe.down, c.n_expert_used, c.expert_weights_norm,
                      layer=il, shared=moe.shared, shared_gate=None, select_bias=bias, gating=c.expert_gating,
                      weights_scale=c.expert_weights_scale, n_groups=c.n_expert_groups,
                      n_group_used=c.n_expert_group_used)


AFMOE_NO_ROPE_STEP = 4  # afmoe: layers with (il + 1) % 4 == 0 skip RoPE (llama.cpp's default step; no key)


def ling_trinity_keys(r, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> dict:
    """The ModelConfig fields of a bailingmoe2 or afmoe file beyond the shared ones (module docstring); r: the
    config.MetaReader, n_layer the layers that run."""
    path, a = r.f.path, r.arch
    lead = r.get("{arch}.leading_dense_block_count", 0)
    if not 0 <= lead <= n_layer:
        raise ModelFileError(f"{path}: {r.key('{arch}.leading_dense_block_count')} {lead} is outside 0..{n_layer}")
    gating = r.get("{arch}.expert_gating_func", None if a == "bailingmoe2" else 0)
    if gating not in ((1, 2) if a == "bailingmoe2" else (0, 1, 2)):
        raise UnsupportedError(f"{path}: {r.key('{arch}.expert_gating_func')} {gating} is not supported "
                               "(1 softmax, 2 sigmoid)")
    norm, scale = r.expert_weights()
    groups, used = r.get("{arch}.expert_group_count", 0), r.get("{arch}.expert_group_used_count", 0)
    n_exp = r.positive("{arch}.expert_count")
    if groups > 1 and (n_exp % groups or not 0 < used < groups):
        raise ModelFileError(f"{path}: {n_exp} experts in {groups} groups of which {used} are used: the groups must "
                             "divide the experts and 1 <= used < groups (llama.cpp's rule)")
    n_ff_exp = r.positive("{arch}.expert_feed_forward_length")
    n_shared = r.get("{arch}.expert_shared_count")
    out = {"moe_layers": tuple(il >= lead for il in range(n_layer)), "expert_weights_norm": norm,
           "expert_gating": "softmax" if gating == 1 else "sigmoid", "expert_weights_scale": scale or 1.0,
           "n_expert_groups": groups if groups > 1 else 0, "n_expert_group_used": used if groups > 1 else 0}
    if a == "bailingmoe2":
        if n_shared < 1:
            raise ModelFileError(f"{path}: {r.key('{arch}.expert_shared_count')} must be >= 1, got {n_shared}")
        if n_head * head_dim != n_embd:
            raise UnsupportedError(f"{path}: bailingmoe2 needs head_count x key_length = embedding_length "
                                   f"({n_head} x {head_dim} != {n_embd}), as llama.cpp's fused attn_qkv does")
        out["n_ff_shexp"] = (r.get("{arch}.expert_shared_feed_forward_length", 0) or n_ff_exp) * n_shared
        return out
    if n_shared < 0:
        raise ModelFileError(f"{path}: {r.key('{arch}.expert_shared_count')} must be >= 0, got {n_shared}")
    out.update(n_ff_shexp=n_ff_exp * n_shared, embd_scale=math.sqrt(n_embd),
               no_rope_layers=tuple((il + 1) % AFMOE_NO_ROPE_STEP == 0 for il in range(n_layer)))
    return out



def read_args(r, d: dict) -> None:
    """Routing and the shared expert (ling_trinity_keys: Ling and Trinity share it)."""
    d.update(ling_trinity_keys(r, d["n_layer"], d["n_embd"], d["n_head"], d["head_dim"]))


SPEC = ArchSpec("bailingmoe2", model=BailingMoe2Model, expected=expected_tensors, rope_neox=True, nextn=True,
                moe=True, moe_norm=False)
