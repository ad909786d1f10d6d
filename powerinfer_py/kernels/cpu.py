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


# ==== quantization and matmul, module level (owner: matmul helper) ====================================
from . import ref as _ref  # noqa: E402  (type checks and messages are shared with the spec)

_QK = 32
_OUT_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16}


def quantize(x, ggml_type) -> np.ndarray:
    """x f32 [R, K] -> data in Tensor layout: f32/f16/uint16 (bf16) [R, K] or uint8 [R, row_bytes]."""
    t = _ref.check_kernel_type(ggml_type, "quantize")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize: x must be 2-D [rows, cols], got shape {x.shape}")
    n_rows, n_cols = x.shape
    if t in _OUT_DTYPES:
        out = np.empty((n_rows, n_cols), dtype=_OUT_DTYPES[t])
    else:
        if n_cols % _QK:
            raise ValueError(f"quantize: {t.name} rows need a multiple of {_QK} columns, got {n_cols}")
        out = np.empty((n_rows, lib.pi_row_size(int(t), n_cols)), dtype=np.uint8)
    if x.size:
        lib.pi_quantize(int(t), ffi.from_buffer("float[]", x), ffi.from_buffer(out), n_rows, n_cols)
    return out


def dequantize(t: Tensor) -> np.ndarray:
    """Tensor -> f32 array of t.shape."""
    ty = _ref.check_kernel_type(t.type, t.name)
    data = np.ascontiguousarray(t.data)
    if data.nbytes != t.n_rows * lib.pi_row_size(int(ty), t.n_cols):
        raise ValueError(f"{t.name}: {data.nbytes} bytes of data do not hold a {ty.name} tensor of shape {t.shape}")
    out = np.empty(t.shape, dtype=np.float32)
    if out.size:
        lib.pi_dequantize(int(ty), ffi.from_buffer(data), ffi.from_buffer("float[]", out), t.n_rows, t.n_cols)
    return out


def _weight_info(w: Tensor) -> tuple:
    """Checks a weight once: (data, C pointer, type id, n_rows, n_cols). Cached by CpuKernels per tensor."""
    ty = _ref.check_kernel_type(w.type, w.name)
    data = w.data
    if not isinstance(data, np.ndarray) or not data.flags.c_contiguous:
        raise ValueError(f"{w.name}: weight data must be a C-contiguous numpy array")
    n_rows, n_cols = w.n_rows, w.n_cols
    if n_cols % lib.pi_block_size(int(ty)):
        raise ValueError(f"{w.name}: {ty.name} rows need a multiple of {_QK} columns, got {n_cols}")
    if data.nbytes != n_rows * lib.pi_row_size(int(ty), n_cols):
        raise ValueError(f"{w.name}: {data.nbytes} bytes of data do not hold a {ty.name} tensor of shape {w.shape}")
    return (data, ffi.from_buffer(data), int(ty), n_rows, n_cols)


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
    # One call at a time per CpuKernels: the pool's scratch holds the quantized activations of the call.

    _WEIGHT_CACHE_MAX = 4096

    def _weight(self, w: Tensor) -> tuple:
        cache = self.__dict__.setdefault("_weights", {})
        info = cache.get(id(w))
        if info is None or info[0] is not w.data:  # id reuse: the cached entry keeps its data alive
            if len(cache) >= self._WEIGHT_CACHE_MAX:
                cache.clear()
            info = cache[id(w)] = _weight_info(w)
        return info

    def matmul(self, w: Tensor, x) -> np.ndarray:
        """y = x @ w.T: x f32 [K] -> [M] or [N, K] -> [N, M] (w has n_rows M, n_cols K)."""
        _, wp, ty, n_rows, n_cols = self._weight(w)
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous:
            raise ValueError(f"matmul {w.name}: x must be a C-contiguous float32 array, got "
                             f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim == 1:
            n_tok = 1
            y = np.empty(n_rows, dtype=np.float32)
        elif x.ndim == 2:
            n_tok = x.shape[0]
            y = np.empty((n_tok, n_rows), dtype=np.float32)
        else:
            raise ValueError(f"matmul {w.name}: x must be [K] or [N, K], got shape {x.shape}")
        if x.shape[-1] != n_cols:
            raise ValueError(f"matmul {w.name}: x has {x.shape[-1]} columns, the weight has {n_cols}")
        if n_tok and n_rows:
            lib.pi_matmul(self._pool, ty, wp, n_rows, n_cols, ffi.from_buffer("float[]", x), n_tok,
                          ffi.from_buffer("float[]", y))
        return y

    def get_rows(self, w: Tensor, ids) -> np.ndarray:
        """Embedding lookup: f32 [N, K] = dequantized rows `ids` (int [N]) of w."""
        _, wp, ty, n_rows, n_cols = self._weight(w)
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"get_rows {w.name}: ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        out = np.empty((len(ids), n_cols), dtype=np.float32)
        if len(ids):
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= n_rows:
                raise IndexError(f"get_rows {w.name}: ids must be in [0, {n_rows}), got {lo}..{hi}")
            ids32 = np.ascontiguousarray(ids, dtype=np.int32)
            lib.pi_get_rows(ty, wp, n_cols, ffi.from_buffer("int32_t[]", ids32), len(ids32),
                            ffi.from_buffer("float[]", out))
        return out

    def read_probe(self, buf) -> float:
        """Reads every byte of buf (a C-contiguous array) on all threads; returns their sum (for benchmarks)."""
        arr = np.asarray(buf)
        if not arr.flags.c_contiguous:
            raise ValueError("read_probe: buf must be C-contiguous")
        return float(lib.pi_read_probe(self._pool, ffi.from_buffer(arr), arr.nbytes))


    # ==== norms, rope, softmax, attention, activations (owner: ops helper) ===============================
