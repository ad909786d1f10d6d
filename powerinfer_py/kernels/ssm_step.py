"""One decode token of the Mamba-2 selective scan in one C call: csrc/ssm_scan.c, pi_ssm_scan_step.

The numpy scan of layers/mamba2_mixer.py (Mamba2Mixer._scan) is the specification; for one token it makes three
passes over the layer's state and two temporaries of its size. The C step reads and writes each state value once,
updating the cache's state in place, and gives the same values to float rounding (only the sum S . C runs in
another order; tests/test_kernels_ssm_scan.py). Used through CpuKernels.steps.ssm_scan_step (cpu_steps.py).
"""
from __future__ import annotations

import numpy as np

from .._pi import ffi, lib

_F32 = np.dtype(np.float32)
_FA = "float[]"


def _check(name: str, a, shape: tuple, writable: bool = False) -> None:
    if not (type(a) is np.ndarray and a.dtype is _F32 and a.flags.c_contiguous and a.shape == shape
            and (a.flags.writeable or not writable)):
        raise ValueError(f"ssm_scan_step: {name} must be a{' writable' if writable else ''} C-contiguous float32 "
                         f"array of shape {shape}, got {getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")


def ssm_scan_step(pool, S, x, dt, A, B, C) -> np.ndarray:
    """One token: S f32 [H, P, N] updated in place, x f32 [H, P], dt (after softplus) and A f32 [H], B and C f32
    [G, N] with H a multiple of G; returns y f32 [H, P] = S C per head (without the D skip). pool: a live pi_pool."""
    if type(S) is not np.ndarray or S.ndim != 3 or type(B) is not np.ndarray or B.ndim != 2:
        raise ValueError("ssm_scan_step: S must be a float32 array [H, P, N] and B one of [G, N]")
    H, P, N = S.shape
    G = B.shape[0]
    if min(H, P, N, G) < 1 or H % G:
        raise ValueError(f"ssm_scan_step: {H} heads cannot share {G} groups (H must be a positive multiple of G)")
    _check("S", S, (H, P, N), writable=True)
    for name, a, shape in (("x", x, (H, P)), ("dt", dt, (H,)), ("A", A, (H,)), ("B", B, (G, N)), ("C", C, (G, N))):
        _check(name, a, shape)
    y = np.empty((H, P), _F32)
    fb = ffi.from_buffer
    lib.pi_ssm_scan_step(pool, H, P, N, G, fb(_FA, S), fb(_FA, x), fb(_FA, dt), fb(_FA, A), fb(_FA, B), fb(_FA, C),
                         fb(_FA, y))
    return y
