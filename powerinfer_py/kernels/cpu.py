"""CPU kernels: thin validated wrappers over the C functions declared in csrc/pi.h.

Validation happens here, once, on the Python side of the boundary (DESIGN rule 3): dtypes, shapes,
contiguity and bounds are checked and turned into clear exceptions; C trusts what it is handed.
cffi releases the GIL during every call.
"""
from __future__ import annotations

import os

import numpy as np

from ..tensor import GGMLType, Tensor

try:
    from .._pi import ffi, lib
except ImportError as exc:  # pragma: no cover - only without a built extension
    raise ImportError(
        "the C kernels are not built: run `pip install -e .` (or `make install`) in the project folder"
    ) from exc


def _ptr(arr: np.ndarray, ctype: str = "void *"):
    """A C pointer to a C-contiguous numpy array (no copy)."""
    if not arr.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    return ffi.cast(ctype, ffi.from_buffer(arr, require_writable=False))


def _f32(x, name: str = "x") -> np.ndarray:
    """x as a C-contiguous float32 array (copies only if it is not one already)."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    return arr


class CpuKernels:
    """The C kernels with their thread pool. One per model; close() (or garbage collection) frees the pool."""

    def __init__(self, n_threads: int | None = None):
        n = n_threads if n_threads is not None else (os.cpu_count() or 1)
        if n < 1:
            raise ValueError(f"threads must be at least 1, got {n}")
        self.n_threads = int(n)
        self._pool = ffi.gc(lib.pi_pool_new(self.n_threads), lib.pi_pool_free)

    def close(self) -> None:
        if self._pool is not None:
            ffi.release(self._pool)
            self._pool = None

    # ==== quantization and matmul (owner: matmul helper) ================================================

    # ==== norms, rope, softmax, attention, activations (owner: ops helper) ===============================
