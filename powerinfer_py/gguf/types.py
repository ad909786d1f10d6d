"""Tensor: one named weight, a typed view on bytes (usually a memory map of the model file).

Shapes are in numpy order: `shape[-1]` is the contiguous dimension (ggml's ne0), so a GGUF tensor with
ne = [n_cols, n_rows] has shape (n_rows, n_cols). `data` holds the bytes without copying:

  F32  -> float32 array of `shape`
  F16  -> float16 array of `shape`
  BF16 -> uint16 array of `shape` (raw bfloat16 bits)
  Q8_0, Q4_0 and every other block type -> uint8 array of shape (*shape[:-1], row_bytes)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGMLType = GGMLQuantizationType

#: Types the C kernels compute on directly; anything else is converted once at load (see convert_for_kernels).
KERNEL_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0,
                GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.IQ4_NL,
                GGMLType.MXFP4,
                GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                GGMLType.Q2_K,
                GGMLType.Q3_K,
                GGMLType.IQ4_XS,
                GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S,
                GGMLType.IQ1_S, GGMLType.IQ1_M,
                )

_FLOAT_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16}


def row_bytes(ggml_type: GGMLType, n_cols: int) -> int:
    """Bytes in one row of n_cols elements; n_cols must be a whole number of blocks."""
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    if n_cols % block_size:
        raise ValueError(f"{ggml_type.name} rows need a multiple of {block_size} elements, got {n_cols}")
    return n_cols // block_size * type_size


@dataclass
class Tensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]
    data: np.ndarray

    @classmethod
    def from_bytes(cls, name: str, ggml_type: GGMLType, shape: tuple[int, ...], buf: np.ndarray) -> "Tensor":
        """Wrap a flat uint8 buffer (a slice of a memory map) as a tensor without copying."""
        shape = tuple(int(s) for s in shape)
        if ggml_type in _FLOAT_DTYPES:
            data = buf.view(_FLOAT_DTYPES[ggml_type]).reshape(shape)
        else:
            data = buf.reshape(*shape[:-1], row_bytes(ggml_type, shape[-1]))
        return cls(name, GGMLType(ggml_type), shape, data)

    @property
    def n_rows(self) -> int:
        n = 1
        for s in self.shape[:-1]:
            n *= s
        return n

    @property
    def n_cols(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.type.name}, shape={self.shape})"
