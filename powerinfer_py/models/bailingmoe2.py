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
"""
from __future__ import annotations

from typing import Mapping

from ..config import ModelConfig
from ..config_bailing import ling_trinity_keys
from ..moe import MoEFFN
from ..tensor import Tensor
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


def read_args(r, d: dict) -> None:
    """Routing and the shared expert (Ling and Trinity share the reader: config_bailing.py)."""
    d.update(ling_trinity_keys(r, d["n_layer"], d["n_embd"], d["n_head"], d["head_dim"]))


SPEC = ArchSpec("bailingmoe2", model=BailingMoe2Model, expected=expected_tensors, rope_neox=True, nextn=True,
                moe=True, moe_norm=False)
