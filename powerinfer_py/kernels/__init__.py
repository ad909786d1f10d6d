"""Kernels: the numpy specification (ref) and the C implementation reached through cffi (cpu), in two tiers.

Ops, the per-op interface, is what every kernels object offers and what a model's Python path is written in:
one call per matmul, norm, RoPE, attention... `ref.RefKernels` (numpy, the spec of each op) and
`cpu.CpuKernels` (C, tested against ref on odd shapes and every ISA build) both implement it, with the same
names and argument order:

    matmul(w: Tensor, x)            x f32 [K] or [N, K] -> f32 [M] or [N, M]   (w has shape (M, K))
    get_rows(w: Tensor, ids)        int32 [N] -> f32 [N, K]                    (embedding lookup)
    rmsnorm(x, w, eps)              x f32 [..., D], w f32 [D] or None
    layernorm(x, w, b, eps)
    rope(x, pos, n_rot, freq_base, freq_scale, neox, freq_factors=None)   x f32 [N, H, D], rotated in place
                                                       and returned (freq_factors: f32 [n_rot/2] or None)
    softmax(x)                      last dim, in place and returned
    attention(q, k, v, pos0, window, scale, softcap=0.0, sinks=None)   q f32 [N, H, D], k/v f16 [Hkv, n_ctx, D] -> f32 [N, H, D]
                                                       (softcap > 0: scores squashed to softcap * tanh(s / softcap))
    store_kv(dst, p0, x)            x f32 [N, Hkv, D] into the f16 cache plane dst [Hkv, n_ctx, D] at p0..p0+N-1
    relu(x), silu(x), gelu(x)       new arrays
    swiglu(g, u), geglu(g, u)       silu(g) * u, gelu(g) * u

plus module-level quantize(x, type) and dequantize(tensor). `ref` has them as module functions; `cpu` as methods
of CpuKernels, which owns a thread pool. `ref.RefKernels` wraps the module functions in the same class shape,
so a model can run on either.

Steps, the optional tier, is a kernels object's `steps` attribute: None where there are none (RefKernels), a
cpu_steps.CpuSteps on CpuKernels. Each step runs one decode token through a whole block (an attention block, an
FFN, a delta-net layer, the Mamba-2 scan) or through the whole stack of layers in one C call. The Python path
written in Ops is the specification: each step is an accelerator of it, tested bit-identical to it (equal to
float rounding for the delta net and the scan), and a model takes a step only where `kernels.steps is not None`
and the step covers the layer (the plan's own checks: variant, biases, down layout...). models/base.py names the
three ways a layer runs (tier 1: ops; tier 2: one C call per block; tier 3: one C call for the whole stack).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Steps(Protocol):
    """The one-call decode steps (cpu_steps.CpuSteps). A *_plan call checks one layer's weights once and returns
    an opaque plan; the matching decode call runs one token through it. Shapes and semantics: cpu_steps.py."""

    FUSED_VARIANTS: dict  # the gated ReLU variants sparse_ffn_plan takes (others keep the Python path)

    def attn_block_plan(self, wq, wk, wv, wo, attn_norm, ffn_norm, **shape) -> object:
        """One attention block (projections, norms, RoPE, attention, residual)."""

    def attn_block_decode(self, plan, x: np.ndarray, pos: int, k_cache, v_cache) -> np.ndarray:
        """x += the block's output (in place), K/V stored at pos; returns the FFN's normed input."""

    def dense_ffn_plan(self, act: str, gate, up, down) -> object:
        """A dense SwiGLU / GeGLU FFN."""

    def dense_ffn_decode(self, plan, x: np.ndarray) -> np.ndarray:
        """y f32 [n_embd] of one token's normed FFN input."""

    def sparse_ffn_plan(self, variant: str, fc1, fc2, gate, up, down_t, threshold: float, act_param: float = 0.0,
                        exact: bool = False, fc2_t=None) -> object:
        """A predictor-driven (or exact) sparse FFN of a gated ReLU variant."""

    def sparse_ffn_decode(self, plan, x: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, int, int]:
        """(y, predicted-active count, non-zero h count) of one token."""

    def threshold_ffn_plan(self, act: str, gate, up, down, down_transposed: bool, cut: float, scale=None,
                           up_cut: float | None = None) -> object:
        """A threshold-mode SwiGLU / GeGLU FFN (one or two stages)."""

    def threshold_ffn_decode(self, plan, x: np.ndarray) -> tuple[np.ndarray, int, int]:
        """(y, kept count, non-zero h count) of one token."""

    def decode_stack_plan(self, attn: list, ffn: list, post_norms: list, post_eps: float,
                          kinds: list | None = None) -> object:
        """Every layer's attention plan, FFN plan and post-FFN norm, for one call per token."""

    def decode_stack(self, plan, x: np.ndarray, pos: int, k_planes, v_planes) -> None:
        """One token through every layer, x updated in place."""

    def delta_net_plan(self, *args, **kw) -> object:
        """One gated delta-net layer's constants (kernels/delta_step.py)."""

    def delta_net_decode(self, plan, qkv, z, beta_raw, alpha_raw, conv_state, state) -> np.ndarray:
        """One token's gated delta-net output, the states updated in place."""

    def ssm_scan_step(self, S, x, dt, A, B, C) -> np.ndarray:
        """One token of the Mamba-2 selective scan, S updated in place (kernels/ssm_step.py)."""


@runtime_checkable
class Ops(Protocol):
    """The per-op kernels (table above) that every model's Python path is written in."""

    n_threads: int
    steps: Steps | None  # the optional one-call tier; None: every layer takes the Python path

    def matmul(self, w, x) -> np.ndarray: ...
    def matmul_rows(self, w, rows, x) -> np.ndarray: ...
    def matmul_experts(self, w, experts, tok_off, x) -> np.ndarray: ...
    def get_rows(self, w, ids) -> np.ndarray: ...
    def store_kv(self, dst, p0, x) -> None: ...
    def rmsnorm(self, x, w, eps) -> np.ndarray: ...
    def layernorm(self, x, w, b, eps) -> np.ndarray: ...
    def rope(self, x, pos, n_rot, freq_base, freq_scale, neox, freq_factors=None, mscale=1.0) -> np.ndarray: ...
    def softmax(self, x) -> np.ndarray: ...
    def attention(self, q, k, v, pos0, window, scale, softcap=0.0, sinks=None) -> np.ndarray: ...
    def relu(self, x) -> np.ndarray: ...
    def silu(self, x) -> np.ndarray: ...
    def gelu(self, x) -> np.ndarray: ...
    def swiglu(self, g, u) -> np.ndarray: ...
    def geglu(self, g, u) -> np.ndarray: ...
    def axpy_rows(self, w, rows, h) -> np.ndarray: ...
    def axpy_tiles(self, w, rows, h) -> np.ndarray: ...
    def select_active(self, logits, threshold) -> np.ndarray: ...
    def select_nonzero(self, x) -> np.ndarray: ...
    def fc2t_pack(self, fc2): ...
    def fc2t_logits(self, q, r) -> np.ndarray: ...
    def close(self) -> None: ...
