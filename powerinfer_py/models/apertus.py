"""Swiss AI Apertus (GGUF arch "apertus": Apertus 8B and 70B).

The llama block with NeoX RoPE (rope_freqs.weight divides the frequencies when the file has it: LLaMA 3
scaling), per-head RMSNorms of q and k before RoPE (as qwen3), and an ungated FFN with the xIELU activation,
whose four parameters are learned per layer (config.xielu, from the xielu.* keys):

Per layer:  n = rmsnorm(x) * attn_norm
            q = rope(rmsnorm_head(Wq·n) * q_norm);  k = rope(rmsnorm_head(Wk·n) * k_norm);  v = Wv·n
            h = x + Wo · attn(q, k, v) (+ attn_output.bias when present)   (GQA, scale 1/sqrt(head_dim))
            y = h + Wdown · xielu(Wup · m)                                  m = rmsnorm(h) * ffn_norm
Logits: rmsnorm(x) * output_norm, then output.weight (required, as llama.cpp's loader has it).

xIELU as ggml_xielu computes it from the stored raw parameters (softplus(z) = ln(1 + e^z), or z above 20):
    a_p = softplus(alpha_p),  a_n = beta + softplus(alpha_n)
    xielu(u) = a_p u^2 + beta u                             for u > 0
               (expm1(min(u, eps)) - u) a_n + beta u         otherwise
in f32, in that order. It is not ReLU-family (negative inputs give non-zero outputs) and the FFN has no gate, so
every sparse mode is refused (ffn.resolve_sparse: variant "xielu"); the FFN runs dense, with the FFN observer
hook (profile) seeing xielu(up·x). The optional attn_q_norm.bias / attn_k_norm.bias that llama.cpp loads it
does not use, and neither do we. One-token steps run the attention block as one C call (step_attn.c).

Metadata keys (config.read with SPEC and its hooks; defaults are llama.cpp's):
  apertus (Swiss AI Apertus 8B / 70B): NeoX RoPE (optional rope_freqs.weight: LLaMA 3 scaling); xIELU activation
          with learned per-layer parameters xielu.alpha_n, xielu.alpha_p, xielu.beta, xielu.eps (keys without
          the arch prefix, as llama.cpp names them; each an array of n_layer floats or one float for all
          layers, all required). They are stored raw: models/apertus.py applies the softplus as ggml_xielu does.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..gguf.types import Tensor
from .base import Expected, get_tensor
from .llama import ATTN_BIASES, LAYER_TENSORS, LlamaModel
from .llama import expected_tensors as llama_expected
from .spec import ArchSpec

_F32 = np.float32


def softplus_f32(z: float) -> np.float32:
    """ggml's softplus in f32: z above 20 as is, else ln(1 + e^z)."""
    z = _F32(z)
    return z if z > 20 else _F32(np.log(_F32(1) + np.exp(z)))


def xielu(u: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    """xIELU of u f32 (any shape) with a layer's raw parameters, as ggml_xielu (module docstring). New array."""
    a_p, b = softplus_f32(alpha_p), _F32(beta)
    a_n = _F32(b + softplus_f32(alpha_n))
    u = np.asarray(u, dtype=_F32)
    pos = a_p * u * u + b * u
    neg = (np.expm1(np.minimum(u, _F32(eps))) - u) * a_n + b * u
    return np.where(u > 0, pos, neg).astype(_F32, copy=False)


class XieluFFN:
    """One layer's dense FFN y = Wdown · xielu(Wup · x): ffn(x, p) -> f32 [N, n_embd] (p unused). observer: as
    ffn.FFN's (called with act = xielu(up·x) before the down projection)."""

    def __init__(self, kernels, up: Tensor, down: Tensor, params: tuple[float, float, float, float], layer: int):
        self.k, self.up, self.down, self.params, self.layer = kernels, up, down, params, layer
        self.n_ff = up.shape[0]
        self.observer = None
        self.split = None

    def __call__(self, x: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
        act = xielu(self.k.matmul(self.up, x), *self.params)
        if self.observer is not None:
            self.observer(self.layer, x, p, act)
        return self.k.matmul(self.down, act)


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors without ffn_gate, plus attn_q_norm / attn_k_norm (f32 [head_dim]; their optional biases
    are unused); output.weight required."""
    e = llama_expected(c)
    e["output.weight"] = ((c.n_vocab, c.n_embd), True)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        del e[p + "ffn_gate.weight"]
        for s in ("q", "k"):
            e[f"{p}attn_{s}_norm.weight"] = ((c.head_dim,), True)
            e[f"{p}attn_{s}_norm.bias"] = ((c.head_dim,), False)
    return e


class ApertusModel(LlamaModel):
    """LlamaModel with per-head Q/K norms (base.Model's QK_NORMS path) and XieluFFN layers."""

    LAYER_TENSORS = {**LAYER_TENSORS, **ATTN_BIASES, "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}
    QK_NORMS = True

    def build_ffns(self, tensors: Mapping[str, Tensor], biases: bool = False) -> list[XieluFFN]:
        c = self.config
        if len(c.xielu) != c.n_layer:
            raise ValueError(f"apertus: {len(c.xielu)} xIELU parameter sets for {c.n_layer} layers")
        return [XieluFFN(self.kernels, get_tensor(tensors, f"blk.{il}.ffn_up.weight"),
                         get_tensor(tensors, f"blk.{il}.ffn_down.weight"), c.xielu[il], il)
                for il in range(c.n_layer)]


__all__ = ["ApertusModel", "XieluFFN", "expected_tensors", "xielu"]


XIELU_KEYS = ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps")


def apertus_keys(r, n_layer: int) -> dict:
    """{"xielu": per layer (alpha_n, alpha_p, beta, eps)} from the four xielu.* keys."""
    columns = []
    for key in XIELU_KEYS:
        value = r.meta.get(key)
        if value is None:
            raise ModelFileError(f"{r.f.path}: missing required metadata key {key!r} (the xIELU activation's "
                                 "per-layer parameters)")
        values = value if isinstance(value, list) else [value] * n_layer
        if len(values) != n_layer or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             and math.isfinite(v) for v in values):
            raise ModelFileError(f"{r.f.path}: metadata key {key!r} must be one finite number or {n_layer} "
                                 f"(one per layer), got {value!r}")
        columns.append([float(v) for v in values])
    return {"xielu": tuple(zip(*columns))}


def read_args(r, d: dict) -> None:
    d.update(apertus_keys(r, d["n_layer"]))


SPEC = ArchSpec("apertus", model=ApertusModel, expected=expected_tensors, rope_neox=True, yarn=True,
                ffn_variant="xielu")  # xIELU: ungated and not ReLU-family, dense only
