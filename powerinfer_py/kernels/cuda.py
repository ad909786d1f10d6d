"""CUDA kernels: the optional library built by `make cuda` (csrc/cuda), opened through cffi in ABI mode.

Nothing here is imported unless a CUDA backend is asked for or `powerinfer info` reports on it, and nothing
fails when the library or a device is missing: cuda_status() says why it cannot run (library not built, not
loadable, or the runtime's error: 35 "CUDA driver version is insufficient" on a machine without a driver, 100
"no CUDA-capable device"), and the callers fall back to the CPU.

Validation happens here (DESIGN rule 3): `Device` checks types, shapes, row-length multiples and arena bounds
before any pointer crosses the boundary. Device memory has one owner, `Arena` (one cudaMalloc, 16-byte
aligned sub-buffers, freed by close()), so the VRAM a plan asks for is exactly what is allocated.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import PowerInferError
from ..gguf.types import GGMLType, Tensor

LIB_NAME = "libpi_cuda.so"
LIB_ENV = "POWERINFER_CUDA_LIB"
HEADER = Path(__file__).resolve().parents[2] / "csrc" / "cuda" / "pi_cuda.h"
ALIGN = 16
TYPES = {GGMLType.F32: 4, GGMLType.F16: 8, GGMLType.Q8_0: 32, GGMLType.Q4_0: 32}  # type -> row multiple
VARIANTS = {"reglu": 0, "fatreglu": 1, "dreglu": 2, "relu": 3}


class CudaError(PowerInferError):
    """A CUDA runtime call failed (the message names the call and the runtime's error)."""


@dataclass(frozen=True)
class CudaStatus:
    available: bool
    reason: str  # the device ("NVIDIA H100 ..., 79.1 GiB free") or why there is none
    library: str | None = None


def library_path() -> Path:
    env = os.environ.get(LIB_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[1] / LIB_NAME


def _cdef() -> str:
    """The declarations between the cdef markers of pi_cuda.h (the header is the whole boundary)."""
    text = _header_text()
    start, end = text.index("/* cdef begin */"), text.index("/* cdef end */")
    return text[start:end]


def _header_text() -> str:
    if HEADER.is_file():
        return HEADER.read_text()
    # an installed wheel has no csrc/: the declarations ship next to the library
    return (library_path().parent / "pi_cuda.h").read_text()


@lru_cache(maxsize=1)
def _open():
    """(ffi, lib, None) or (None, None, reason)."""
    path = library_path()
    if not path.is_file():
        return None, None, f"the CUDA library is not built ({path} missing: run `make cuda`, needs nvcc)"
    try:
        from cffi import FFI
        ffi = FFI()
        ffi.cdef(_cdef())
        return ffi, ffi.dlopen(str(path)), None
    except (OSError, ValueError, ImportError) as e:
        return None, None, f"the CUDA library {path} does not load: {e}"
    except Exception as e:  # cffi.CDefError and friends: a header that does not parse
        return None, None, f"the CUDA library's header does not parse: {type(e).__name__}: {e}"


@lru_cache(maxsize=1)
def cuda_status(device: int = 0) -> CudaStatus:
    """Whether the CUDA backend can run here, and why not (cached: the answer does not change in a process)."""
    ffi, lib, problem = _open()
    if problem:
        return CudaStatus(False, problem)
    name = ffi.new("char[256]")
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    rc = lib.pi_cuda_init(device, name, 256, free, total)
    if rc:
        msg = ffi.string(lib.pi_cuda_error_string(rc)).decode()
        return CudaStatus(False, f"no usable CUDA device: {msg} (CUDA error {rc})", str(library_path()))
    dev = ffi.string(name).decode()
    return CudaStatus(True, f"{dev}, {free[0] / 2**30:.1f} of {total[0] / 2**30:.1f} GiB free", str(library_path()))


def device_free_bytes(device: int = 0) -> int:
    ffi, lib, problem = _open()
    if problem:
        raise CudaError(problem)
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    rc = lib.pi_cuda_init(device, ffi.NULL, 0, free, total)
    if rc:
        raise CudaError(f"cudaMemGetInfo failed: {ffi.string(lib.pi_cuda_error_string(rc)).decode()} (error {rc})")
    return int(free[0])


def planar(t: Tensor) -> np.ndarray:
    """t's bytes in the device layout (pi_cuda.h): F32/F16 as they are; Q8_0/Q4_0 regrouped into the quant
    plane [n_rows, quant bytes] followed by the scale plane [n_rows, n_cols / 32] f16. Same byte count."""
    if t.type not in TYPES:
        raise PowerInferError(f"{t.name}: {t.type.name} weights have no CUDA kernel (F32, F16, Q8_0, Q4_0)")
    if t.n_cols % TYPES[t.type]:
        raise PowerInferError(f"{t.name}: CUDA {t.type.name} rows need a multiple of {TYPES[t.type]} columns")
    if t.type in (GGMLType.F32, GGMLType.F16):
        return np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
    block = 34 if t.type == GGMLType.Q8_0 else 18
    blocks = np.ascontiguousarray(t.data).reshape(t.n_rows, t.n_cols // 32, block)
    return np.concatenate([blocks[:, :, 2:].reshape(-1), blocks[:, :, :2].reshape(-1)])


class Arena:
    """One device allocation of `n_bytes`, handed out in 16-byte aligned pieces; close() frees it."""

    def __init__(self, n_bytes: int):
        self.ffi, self.lib, problem = _open()
        if problem:
            raise CudaError(problem)
        self.size, self.used = int(n_bytes), 0
        ptr = self.ffi.new("void **")
        rc = self.lib.pi_cuda_malloc(ptr, max(self.size, ALIGN))
        if rc:
            raise CudaError(f"cudaMalloc of {self.size / 2**20:.1f} MiB failed: "
                            f"{self.ffi.string(self.lib.pi_cuda_error_string(rc)).decode()}")
        self.base = ptr[0]
        stream = self.ffi.new("void **")
        self.check(self.lib.pi_cuda_stream_create(stream), "cudaStreamCreate")
        self.stream = stream[0]

    def check(self, rc: int, what: str) -> None:
        if rc:
            raise CudaError(f"{what} failed: {self.ffi.string(self.lib.pi_cuda_error_string(rc)).decode()} "
                            f"(CUDA error {rc})")

    def alloc(self, n_bytes: int):
        """A device pointer to n_bytes inside the arena (raises if the arena is full: the plan was wrong)."""
        n = -(-int(n_bytes) // ALIGN) * ALIGN
        if self.used + n > self.size:
            raise CudaError(f"device arena of {self.size} bytes is full ({self.used} used, {n} asked)")
        ptr = self.ffi.cast("char *", self.base) + self.used
        self.used += n
        return ptr

    def upload(self, host: np.ndarray, dst=None):
        host = np.ascontiguousarray(host)
        dst = self.alloc(host.nbytes) if dst is None else dst
        self.check(self.lib.pi_cuda_memcpy_h2d(dst, self.ffi.from_buffer(host), host.nbytes, self.stream),
                   "copy to device")
        self.sync()  # the host array may be a temporary
        return dst

    def download(self, src, out: np.ndarray) -> np.ndarray:
        self.check(self.lib.pi_cuda_memcpy_d2h(self.ffi.from_buffer(out, require_writable=True), src, out.nbytes,
                                               self.stream), "copy to host")
        return out

    def sync(self) -> None:
        self.check(self.lib.pi_cuda_stream_sync(self.stream), "stream synchronize")

    def close(self) -> None:
        if getattr(self, "base", None) is not None:
            self.lib.pi_cuda_stream_destroy(self.stream)
            self.lib.pi_cuda_free(self.base)
            self.base = None
