"""A numpy model of the CUDA library's C ABI (csrc/cuda/pi_cuda.h), for testing the host side without a GPU.

"Device memory" is host memory from cffi; every kernel entry point implements the header's documented
semantics in numpy, reading weights through the planar layout exactly as the device decoders do (see
decode_planar). With it, the CUDA device half (powerinfer_py/hybrid/cuda_device.py: arena, planar upload,
padding, argument order of every call) runs end to end on the CPU. It checks the glue, not the CUDA code: the
kernels themselves are compared with the same semantics by tests/test_cuda.py on a device.
"""
from __future__ import annotations

import numpy as np
from cffi import FFI

from powerinfer_py.gguf.types import GGMLType


def decode_planar(buf: np.ndarray, ty: int, n_rows: int, n_cols: int) -> np.ndarray:
    """f32 [n_rows, n_cols] from a tensor in the device layout (pi_cuda.h)."""
    ty = GGMLType(ty)
    if ty == GGMLType.F32:
        return buf.view(np.float32).reshape(n_rows, n_cols)
    if ty == GGMLType.F16:
        return buf.view(np.float16).reshape(n_rows, n_cols).astype(np.float32)
    nb = n_cols // 32
    qbytes = n_cols if ty == GGMLType.Q8_0 else n_cols // 2
    qs = buf[:n_rows * qbytes].reshape(n_rows, nb, qbytes // nb)
    d = buf[n_rows * qbytes:n_rows * (qbytes + 2 * nb)].view(np.float16).reshape(n_rows, nb, 1).astype(np.float32)
    if ty == GGMLType.Q8_0:
        return (qs.view(np.int8) * d).reshape(n_rows, n_cols)
    lo, hi = (qs & 15).astype(np.int32) - 8, (qs >> 4).astype(np.int32) - 8  # byte j: elements j and j + 16
    return (np.concatenate([lo, hi], axis=-1) * d).reshape(n_rows, n_cols).astype(np.float32)


def planar_nbytes(ty: int, n_rows: int, n_cols: int) -> int:
    ty = GGMLType(ty)
    per = {GGMLType.F32: 4 * n_cols, GGMLType.F16: 2 * n_cols, GGMLType.Q8_0: n_cols + n_cols // 16,
           GGMLType.Q4_0: n_cols // 2 + n_cols // 16}[ty]
    return n_rows * per


class FakeCudaLib:
    """Stands in for ffi.dlopen(libpi_cuda.so). Pointers are cffi char* into host buffers it keeps alive."""

    def __init__(self, ffi: FFI):
        self.ffi, self._keep, self.calls = ffi, [], []

    # -- helpers --------------------------------------------------------------------------------------------
    def _arr(self, ptr, dtype, count: int) -> np.ndarray:
        nbytes = int(count) * np.dtype(dtype).itemsize
        return np.frombuffer(self.ffi.buffer(self.ffi.cast("char *", ptr), nbytes), dtype=dtype)

    def _count(self, n: int, n_dev) -> int:
        return n if n_dev == self.ffi.NULL else min(n, int(self._arr(n_dev, np.int32, 1)[0]))

    def _w(self, ty, w, n_rows, n_cols) -> np.ndarray:
        return decode_planar(self._arr(w, np.uint8, planar_nbytes(ty, n_rows, n_cols)), ty, n_rows, n_cols)

    # -- runtime --------------------------------------------------------------------------------------------
    def pi_cuda_init(self, device, name, name_len, free, total):
        if free != self.ffi.NULL:
            free[0] = total[0] = 1 << 30
        return 0

    def pi_cuda_error_string(self, code):
        s = self.ffi.new("char[]", f"fake error {code}".encode())
        self._keep.append(s)
        return s

    def pi_cuda_malloc(self, ptr, n):
        buf = self.ffi.new("char[]", int(n))
        self._keep.append(buf)
        ptr[0] = buf
        return 0

    def pi_cuda_free(self, ptr):
        return 0

    def pi_cuda_memcpy_h2d(self, dst, src, n, stream):
        self.ffi.memmove(dst, src, n)
        return 0

    pi_cuda_memcpy_d2h = pi_cuda_memcpy_d2d = pi_cuda_memcpy_h2d

    def pi_cuda_memset(self, dst, value, n, stream):
        self._arr(dst, np.uint8, n)[:] = value
        return 0

    def pi_cuda_stream_create(self, stream):
        stream[0] = self.ffi.NULL
        return 0

    def pi_cuda_stream_destroy(self, stream):
        return 0

    def pi_cuda_stream_sync(self, stream):
        return 0

    # -- kernels --------------------------------------------------------------------------------------------
    def pi_cuda_matvec(self, ty, w, n_rows, n_cols, x, y, relu, stream):
        self.calls.append("matvec")
        out = self._w(ty, w, n_rows, n_cols).astype(np.float64) @ self._arr(x, np.float32, n_cols)
        self._arr(y, np.float32, n_rows)[:] = np.maximum(out, 0) if relu else out
        return 0

    def pi_cuda_matvec_rows(self, ty, w, n_rows, n_cols, rows, n_sel, n_dev, x, y, stream):
        self.calls.append("matvec_rows")
        n = self._count(n_sel, n_dev)
        r = self._arr(rows, np.int32, n)
        assert n == 0 or (r.min() >= 0 and r.max() < n_rows), "row index outside the weight"
        wd = self._w(ty, w, n_rows, n_cols)[r].astype(np.float64)
        self._arr(y, np.float32, n)[:] = wd @ self._arr(x, np.float32, n_cols)
        return 0

    def pi_cuda_ffn_act(self, variant, g, u, b, h, n, n_dev, param, stream):
        self.calls.append("ffn_act")
        n = self._count(n, n_dev)
        gv = self._arr(g, np.float32, n)
        uv = self._arr(u, np.float32, n) if variant != 3 else None
        if variant == 0:
            out = np.maximum(gv, 0) * uv
        elif variant == 1:
            out = np.where(gv > np.float32(param), gv, 0) * uv
        elif variant == 2:
            out = np.maximum(gv, 0) * np.maximum(uv, 0)
        else:
            out = np.maximum(gv + (self._arr(b, np.float32, n) if b != self.ffi.NULL else 0), 0)
        self._arr(h, np.float32, n)[:] = out
        return 0

    def pi_cuda_axpy_rows(self, ty, w, n_rows, n_cols, rows, n_sel, n_dev, h, n_splits, partials, y, stream):
        self.calls.append("axpy_rows")
        assert 1 <= n_splits <= 64
        n = self._count(n_sel, n_dev)
        r = self._arr(rows, np.int32, n)
        hv = self._arr(h, np.float32, n).astype(np.float64)
        self._arr(partials, np.float32, 64 * n_cols)[:n_cols] = 0  # touches the scratch the header promises
        self._arr(y, np.float32, n_cols)[:] = hv @ self._w(ty, w, n_rows, n_cols)[r].astype(np.float64)
        return 0


def install(monkeypatch) -> FakeCudaLib:
    """Make powerinfer_py.kernels.cuda use the fake library and report a device."""
    from powerinfer_py.kernels import cuda as C

    ffi = FFI()
    ffi.cdef(C._cdef())
    lib = FakeCudaLib(ffi)
    monkeypatch.setattr(C, "_open", lambda: (ffi, lib, None))
    monkeypatch.setattr(C, "cuda_status", lambda device=0: C.CudaStatus(True, "fake CUDA device (numpy)"))
    return lib
