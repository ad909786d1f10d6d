"""Baidu ERNIE 4.5 (GGUF archs "ernie4_5": ERNIE-4.5-0.3B, dense; "ernie4_5-moe": ERNIE-4.5-21B-A3B, 300B-A47B).

The llama block, as llama.cpp builds it for these archs:
    n = rmsnorm(x) * attn_norm
    q = rope(Wq·n), k = rope(Wk·n), v = Wv·n       normal RoPE layout (pairs 2i, 2i+1) over the whole head
    h = x + Wo · attn(q, k, v)                       scale 1/sqrt(head_dim), grouped-query attention
    m = rmsnorm(h) * ffn_norm
    y = h + ffn_il(m)
    logits = output · (rmsnorm(y_last) * output_norm)            (output tied to token_embd when absent)
ffn_il is a SwiGLU FFN, Wdown · (silu(Wgate·m) * (Wup·m)), on every layer of ernie4_5 and on the first
{arch}.leading_dense_block_count layers of ernie4_5-moe (config.moe_layers). The other ernie4_5-moe layers
run moe.MoEFFN:
    probs  = softmax(router · m)                     router = ffn_gate_inp (n_expert, n_embd)
    chosen = the n_used experts with the largest probs + b  b = blk.N.exp_probs_b.bias (optional; 0 when absent)
    w      = probs[chosen] / sum(probs[chosen])      (the bias steers the choice only, not the weights)
    y      = sum_r w_r * expert_{chosen_r}(m)  +  shared(m)
where shared is a SwiGLU FFN ({arch}.expert_shared_feed_forward_length wide; ffn_{gate,up,down}_shexp) added
with no gate, present when that key is > 0.

llama.cpp also adds optional Q/K/V biases (ERNIE 4.5 checkpoints have none) and drops an output bias; a file that
carries any attention bias is refused rather than run differently. An interleave step other than 1 and RoPE
on part of a head are refused in config.py.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  ernie4_5, ernie4_5-moe  (Baidu ERNIE 4.5) the llama block (normal RoPE over the whole head: rope.dimension_count
          must equal head_dim, as llama.cpp asserts); ernie4_5-moe: {arch}.leading_dense_block_count dense layers
          (feed_forward_length wide), then experts (expert_feed_forward_length wide; softmax router, top-k chosen
          on probs + the optional blk.N.exp_probs_b.bias, weights renormalized) with an optional ungated shared
          expert ({arch}.expert_shared_feed_forward_length); {arch}.interleave_moe_layer_step must be 1 (the
          published checkpoints' value; llama.cpp's loader knows no other)
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import Tensor
from ..layers.moe import MoEFFN
from .base import Expected, Model, get_tensor, llama_like_expected, norm_weight
from .llama import LAYER_TENSORS
from .spec import ArchSpec

_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output")


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors with experts on the MoE layers; the shared expert has no gate vector, and each MoE layer may
    have its selection bias exp_probs_b.bias (n_expert,)."""
    return llama_like_expected(c, shared_gate=False, select_bias=False)


class ErnieModel(Model):
    """The pre-norm block of models/base.py with llama's tensors; MoE layers route with the selection bias."""

    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        biases = [n for n in tensors if n.startswith("blk.") and n.endswith(".bias") and n.split(".")[2] in _BIASES]
        if biases:
            raise UnsupportedError(f"{config.arch} files with attention biases are not supported (found "
                                   f"{biases[0]!r} and {len(biases) - 1} more)")
        super().__init__(config, tensors, kernels, sparse)

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        moe = super().build_moe(tensors, il)
        moe.shared_gate = None  # llama.cpp adds ernie's shared expert ungated, whatever the file holds
        bias = norm_weight(get_tensor(tensors, f"blk.{il}.exp_probs_b.bias", required=False))
        if bias is not None:
            if bias.shape != (moe.n_expert,):
                raise ModelFileError(f"blk.{il}.exp_probs_b.bias has {bias.size} values, expected {moe.n_expert}")
            moe.select_bias = bias
        return moe


def ernie(r, n_layer: int, n_rot: int, head_dim: int) -> dict:
    """ernie4_5(-moe): RoPE over whole heads only; the MoE model's per-layer FFN kinds (moe_layers): dense below
    {arch}.leading_dense_block_count, experts from there on, with an interleave step of 1 only."""
    if n_rot != head_dim:
        raise UnsupportedError(f"{r.f.path}: {r.arch} rotates whole heads; rope.dimension_count {n_rot} "
                               f"!= head_dim {head_dim} is not supported (llama.cpp refuses it too)")
    if r.arch == "ernie4_5":
        return {}
    step = r.positive("{arch}.interleave_moe_layer_step")
    if step != 1:
        raise UnsupportedError(f"{r.f.path}: {r.key('{arch}.interleave_moe_layer_step')} {step} is not "
                               "supported (only 1: every layer past the leading dense ones has experts)")
    lead = r.get("{arch}.leading_dense_block_count")
    if not 0 <= lead <= n_layer:
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.leading_dense_block_count')} {lead} is outside "
                             f"0..{n_layer} (block_count)")
    return {"moe_layers": tuple(il >= lead for il in range(n_layer))}


def read_args(r, d: dict) -> None:
    d.update(ernie(r, d["n_layer"], d["n_rot"], d["head_dim"]))


SPEC = ArchSpec("ernie4_5", model=ErnieModel, expected=expected_tensors)
VARIANTS = (replace(SPEC, name="ernie4_5-moe", moe=True, moe_norm=True, shared_expert="optional"),)
