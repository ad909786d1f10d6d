"""One decode token of a gated delta-net layer (Qwen3.5) in one C call: csrc/step_delta_net.c, pi_delta_net_decode.

The numpy path of qwen35.py (_conv, _delta_qkv, _recur, the gated norm) is the specification; for one token it
spends more time in temporaries and in copying the layer's state S in and out of the cache than in arithmetic.
The C step updates the cache's conv state and S in place and returns the gated output, the same values to float
rounding (tests/test_kernels_delta.py). Used through CpuKernels.steps.delta_net_plan / delta_net_decode (cpu_steps.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._pi import ffi, lib

_F32 = np.dtype(np.float32)
_FA = "float[]"


@dataclass(frozen=True)
class DeltaNetPlan:
    """One layer's constants described to C, with the arrays its pointers point into (kept alive here)."""
    desc: object  # cdata pi_delta_net *
    buffers: tuple
    d: int
    n_k_heads: int
    n_v_heads: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return (2 * self.n_k_heads + self.n_v_heads) * self.d

    @property
    def work_floats(self) -> int:
        return self.conv_dim + 2 * self.n_v_heads + self.n_v_heads * self.d


def _const_f32(name: str, a, shape: tuple) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.shape != shape:
        raise ValueError(f"delta_net_plan: {name} must have shape {shape}, got {a.shape}")
    return a


def delta_net_plan(d: int, n_k_heads: int, n_v_heads: int, conv_w, ssm_a, dt_bias, ssm_norm, eps: float,
                   split_heads: bool = True) -> DeltaNetPlan:
    """Checks one layer's constants once: conv_w f32 [conv_dim, K] (K >= 2), ssm_a and dt_bias f32 [Hv], ssm_norm
    f32 [d]; Hv a multiple of Hk. split_heads: run the value heads on all of the pool's threads (the same result;
    False: all on the calling thread; see csrc/step_delta_net.c for what each costs)."""
    if min(d, n_k_heads, n_v_heads) < 1 or n_v_heads % n_k_heads:
        raise ValueError(f"delta_net_plan: {n_v_heads} value heads cannot share {n_k_heads} key heads of width {d}")
    conv_dim = (2 * n_k_heads + n_v_heads) * d
    conv_w = np.ascontiguousarray(conv_w, dtype=np.float32)
    if conv_w.ndim != 2 or conv_w.shape[0] != conv_dim or conv_w.shape[1] < 2:
        raise ValueError(f"delta_net_plan: conv_w must be [{conv_dim}, K >= 2], got {conv_w.shape}")
    arrays = (conv_w, _const_f32("ssm_a", ssm_a, (n_v_heads,)), _const_f32("dt_bias", dt_bias, (n_v_heads,)),
              _const_f32("ssm_norm", ssm_norm, (d,)))
    desc = ffi.new("pi_delta_net *")
    desc.d, desc.n_k_heads, desc.n_v_heads, desc.conv_kernel = d, n_k_heads, n_v_heads, conv_w.shape[1]
    desc.eps, desc.split_heads = float(eps), int(bool(split_heads))
    ptrs = tuple(ffi.from_buffer(_FA, a) for a in arrays)
    desc.conv_w, desc.ssm_a, desc.dt_bias, desc.ssm_norm = ptrs
    return DeltaNetPlan(desc, arrays + ptrs, d, n_k_heads, n_v_heads, conv_w.shape[1])


def _check(name: str, a, shape: tuple, writable: bool = False) -> None:
    if not (type(a) is np.ndarray and a.dtype is _F32 and a.flags.c_contiguous and a.shape == shape
            and (a.flags.writeable or not writable)):
        raise ValueError(f"delta_net_decode: {name} must be a{' writable' if writable else ''} C-contiguous float32 "
                         f"array of shape {shape}, got {getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")


def delta_net_decode(pool, work, plan: DeltaNetPlan, qkv, z, beta_raw, alpha_raw, conv_state, state) -> np.ndarray:
    """One token: qkv f32 [conv_dim], z f32 [Hv * d], beta_raw and alpha_raw f32 [Hv] (the layer's projections);
    conv_state f32 [K-1, conv_dim] and state f32 [Hv, d, d] updated in place; returns the gated output f32
    [Hv * d]. pool: a live pi_pool; work: a cdata float pointer to at least plan.work_floats floats."""
    hv, d = plan.n_v_heads, plan.d
    for name, a, shape in (("qkv", qkv, (plan.conv_dim,)), ("z", z, (hv * d,)), ("beta_raw", beta_raw, (hv,)),
                           ("alpha_raw", alpha_raw, (hv,))):
        _check(name, a, shape)
    _check("conv_state", conv_state, (plan.conv_kernel - 1, plan.conv_dim), writable=True)
    _check("state", state, (hv, d, d), writable=True)
    out = np.empty(hv * d, _F32)
    fb = ffi.from_buffer
    lib.pi_delta_net_decode(pool, plan.desc, fb(_FA, qkv), fb(_FA, z), fb(_FA, beta_raw), fb(_FA, alpha_raw),
                            fb(_FA, conv_state), fb(_FA, state), work, fb(_FA, out))
    return out
