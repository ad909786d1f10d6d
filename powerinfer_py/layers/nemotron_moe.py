"""The expert layers of nemotron_h_moe (NVIDIA Nemotron 3 Nano 30B-A3B and kin; the rest of the stack is
models/nemotron_h.py). An FFN layer of such a file computes, on its normed input n [N, n_embd]:

    logits = ffn_gate_inp · n                                   (the router always reads n, never the latent)
    l      = ffn_latent_down · n    when the layer has latent projections, else n
    moe    = experts(l; logits)                                 (moe.py: sigmoid scores, top-k picked by scores
                                                                 + exp_probs_b, weights the unbiased scores,
                                                                 renormalized / scaled per the file; each expert
                                                                 down_e · relu(up_e · l)^2, no gate)
    moe    = ffn_latent_up · moe    when latent
    y      = moe + ffn_down_shexp · relu(ffn_up_shexp · n)^2    (the shared expert, always present)

The experts are a ReLU family, but `--sparse exact` on them saves nothing (moe.py says why) and is refused; the
shared expert is ffn.py's dense "relu2" FFN, which `exact` does run sparsely (bit for bit `off`).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..gguf.types import Tensor
from .ffn import FFN, FFNWeights, SparseSettings
from .moe import MoEFFN
from .weights import Expected, get_tensor, norm_weight


def moe_width(c: ModelConfig) -> int:
    """The experts' input/output width: the latent size, or n_embd."""
    return c.moe_latent_size or c.n_embd


def nemotron_moe_expected(c: ModelConfig, p: str) -> Expected:
    """One expert layer's tensors (prefix p = "blk.N.")."""
    E, X, F, S, M = c.n_embd, c.n_expert, c.n_ff_exp, c.n_ff_shexp, moe_width(c)
    return {p + "ffn_gate_inp.weight": ((X, E), True), p + "exp_probs_b.bias": ((X,), True),
            p + "ffn_up_exps.weight": ((X, F, M), True), p + "ffn_down_exps.weight": ((X, M, F), True),
            p + "ffn_up_shexp.weight": ((S, E), True), p + "ffn_down_shexp.weight": ((E, S), True),
            p + "ffn_latent_down.weight": ((M, E), False), p + "ffn_latent_up.weight": ((E, M), False)}


class NemotronMoE:
    """One expert layer (module docstring): moe(n, x=None) -> y f32 [N, n_embd]. `experts` is the moe.MoEFFN
    (its counts and stats feed `run -v`), `shared` the shared expert's ffn.FFN."""

    def __init__(self, kernels, c: ModelConfig, tensors: Mapping[str, Tensor], il: int, sparse: SparseSettings):
        p = f"blk.{il}."
        self.k, self.layer = kernels, il
        self.router = get_tensor(tensors, p + "ffn_gate_inp.weight")
        self.latent_down = get_tensor(tensors, p + "ffn_latent_down.weight", required=False)
        self.latent_up = get_tensor(tensors, p + "ffn_latent_up.weight", required=False)
        if (self.latent_down is None) != (self.latent_up is None):
            raise ModelFileError(f"layer {il}: ffn_latent_down and ffn_latent_up come together (one is missing)")
        # the router reads n, not the latent: MoEFFN gets its logits (router None)
        self.experts = MoEFFN(kernels, None, None, get_tensor(tensors, p + "ffn_up_exps.weight"),
                              get_tensor(tensors, p + "ffn_down_exps.weight"), c.n_expert_used,
                              c.expert_weights_norm, layer=il, act="relu2",
                              select_bias=norm_weight(get_tensor(tensors, p + "exp_probs_b.bias")),
                              gating="sigmoid", weights_scale=c.expert_weights_scale, n_groups=c.n_expert_groups,
                              n_group_used=c.n_expert_group_used)
        w = FFNWeights(up=get_tensor(tensors, p + "ffn_up_shexp.weight"),
                       down=get_tensor(tensors, p + "ffn_down_shexp.weight"))
        self.shared = FFN(kernels, w, "relu2", sparse, layer=il)

    # the activation tools refuse expert layers (moe.MoEFFN.observer)
    observer = property(lambda self: None, lambda self, fn: setattr(self.experts, "observer", fn))
    counts = property(lambda self: self.experts.counts)
    stats = property(lambda self: self.experts.stats)
    split = None

    def __call__(self, n: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
        k = self.k
        n = np.ascontiguousarray(n, dtype=np.float32)
        logits = k.matmul(self.router, n)
        lat = n if self.latent_down is None else k.matmul(self.latent_down, n)
        y = self.experts(lat, router_logits=logits)
        if self.latent_up is not None:
            y = k.matmul(self.latent_up, np.ascontiguousarray(y))
        return y + self.shared(n)
