"""SourceTensor: one tensor of a checkpoint file (safetensors or torch .pt/.bin), read lazily.

Checkpoints are read tensor by tensor, and large tensors a few rows at a time, so converting a model never
holds more than about one tensor in memory. A SourceTensor knows its dtype (safetensors spelling: F32, F16,
BF16, ...), its shape in torch order (shape[-1] contiguous) and where its bytes are:

  - `offset`: absolute file offset of element 0 when the tensor is stored contiguously in the file
    (every safetensors tensor, and torch tensors in uncompressed zip members whose strides are C-order);
    rows are then read with one positioned read each, into a fresh numpy buffer (no memory map, so pages
    of the input never count towards our resident memory);
  - otherwise `loader`, a function returning the whole tensor (strided torch views, compressed members).

torch_pt makes SourceTensors only after unpickling, from records it has checked against the archive, so nothing
in a pickle can reach or change one (its path, offset, shape, dtype or loader).

Raw arrays keep the stored dtype; BF16 comes back as uint16 bit patterns, see `to_f32`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ModelFileError, PowerInferError

#: safetensors dtype name -> numpy dtype of the raw stored values (BF16: its bits, as uint16)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Raw stored values -> float32 (a new array unless raw already is float32). BF16 bits become the high
    half of a float32: exact."""
    if dtype == "BF16":
        out = np.zeros(raw.shape + (2,), dtype=np.uint16)  # little-endian: [low half = 0, high half = bits]
        out[..., 1] = raw
        return out.view(np.float32).reshape(raw.shape)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype {dtype} is not a floating-point type")
    return raw.astype(np.float32, copy=False)


@dataclass
class SourceTensor:
    name: str
    dtype: str  # key of DTYPES
    shape: tuple[int, ...]  # torch order
    path: Path  # the file it lives in (for messages)
    offset: int | None = None  # absolute file offset of element 0, when stored contiguously
    loader: Callable[[], np.ndarray] | None = field(default=None, repr=False)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def n_elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.n_elements * self.itemsize

    def _pread(self, start: int, n_bytes: int) -> np.ndarray:
        buf = np.empty(n_bytes, dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as fh:
            fh.seek(start)
            got = fh.readinto(memoryview(buf)) if n_bytes else 0
            while got < n_bytes:  # readinto may return short counts on some file systems
                more = fh.readinto(memoryview(buf)[got:])
                if not more:
                    raise ModelFileError(f"{self.path}: file is truncated: tensor {self.name!r} needs bytes "
                                         f"up to {start + n_bytes}, the file ends at {start + got}")
                got += more
        return buf

    def read(self) -> np.ndarray:
        """The whole tensor, raw dtype, `shape`."""
        try:
            if self.offset is None:
                arr = self.loader()
                return arr.reshape(self.shape)
            return self._pread(self.offset, self.nbytes).view(DTYPES[self.dtype]).reshape(self.shape)
        except MemoryError:
            raise self._no_memory() from None

    def _no_memory(self) -> PowerInferError:
        return PowerInferError(f"{self.path}: not enough memory to read tensor {self.name[:80]!r} "
                               f"({self.nbytes / 2**20:.0f} MiB)")

    def read_rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1 of the first dimension, raw dtype, shape (r1 - r0, *shape[1:])."""
        if not self.shape:
            raise ValueError(f"tensor {self.name!r} is a scalar")
        if self.offset is None:
            return np.ascontiguousarray(self.read()[r0:r1])
        row = self.nbytes // self.shape[0] if self.shape[0] else 0
        try:
            raw = self._pread(self.offset + r0 * row, (r1 - r0) * row)
        except MemoryError:
            raise self._no_memory() from None
        return raw.view(DTYPES[self.dtype]).reshape((r1 - r0,) + self.shape[1:])


def file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read: {e.strerror}") from None
