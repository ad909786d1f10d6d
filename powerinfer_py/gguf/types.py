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
from enum import IntEnum
from typing import NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGMLType = GGMLQuantizationType

class TypeKind(IntEnum):
    """What a weight type's blocks hold; the numbers of csrc/pi.h's enum pi_type_kind."""
    FLOAT = 1  # one value per element: F32, F16, BF16
    BLOCK = 2  # 32-element blocks, one scale each: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4
    K = 3      # 256-element super-blocks with a scale per group: Q2_K ... Q6_K, IQ4_XS
    IQ = 4     # 256-element super-blocks of grid entries: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M


class TypeTraits(NamedTuple):
    """One row of the type-traits table (csrc/pi.h pi_type_traits, the C kernels' copy)."""
    block: int     # elements per block: 1 (float types), 32 or 256
    bytes: int     # bytes per block
    kind: TypeKind
    group: int     # elements per scale: 32 or 16 (0 for float types)
    has_min: bool  # an offset per scale: d * q + m (Q4_1, Q5_1) or d * sc * q - dmin * m (Q2_K, Q4_K, Q5_K)


_F, _B, _K, _I = TypeKind.FLOAT, TypeKind.BLOCK, TypeKind.K, TypeKind.IQ
#: The types the C kernels compute on directly and their facts, the Python twin of C's table (pi_traits in
#: csrc/quants.h, read through pi_type_traits_table; tests/test_type_traits.py holds the two equal). Anything
#: else is converted once at load (see convert_for_kernels).
TYPE_TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: TypeTraits(1, 4, _F, 0, False),
    GGMLType.F16: TypeTraits(1, 2, _F, 0, False),
    GGMLType.BF16: TypeTraits(1, 2, _F, 0, False),
    GGMLType.Q8_0: TypeTraits(32, 34, _B, 32, False),
    GGMLType.Q4_0: TypeTraits(32, 18, _B, 32, False),
    GGMLType.Q5_0: TypeTraits(32, 22, _B, 32, False),
    GGMLType.Q4_1: TypeTraits(32, 20, _B, 32, True),
    GGMLType.Q5_1: TypeTraits(32, 24, _B, 32, True),
    GGMLType.IQ4_NL: TypeTraits(32, 18, _B, 32, False),
    GGMLType.MXFP4: TypeTraits(32, 17, _B, 32, False),
    GGMLType.Q4_K: TypeTraits(256, 144, _K, 32, True),
    GGMLType.Q5_K: TypeTraits(256, 176, _K, 32, True),
    GGMLType.Q6_K: TypeTraits(256, 210, _K, 16, False),
    GGMLType.Q2_K: TypeTraits(256, 84, _K, 16, True),
    GGMLType.Q3_K: TypeTraits(256, 110, _K, 16, False),
    GGMLType.IQ4_XS: TypeTraits(256, 136, _K, 32, False),
    GGMLType.IQ3_XXS: TypeTraits(256, 98, _I, 32, False),
    GGMLType.IQ3_S: TypeTraits(256, 110, _I, 32, False),
    GGMLType.IQ2_XXS: TypeTraits(256, 66, _I, 32, False),
    GGMLType.IQ2_XS: TypeTraits(256, 74, _I, 16, False),
    GGMLType.IQ2_S: TypeTraits(256, 82, _I, 16, False),
    GGMLType.IQ1_S: TypeTraits(256, 50, _I, 32, False),
    GGMLType.IQ1_M: TypeTraits(256, 56, _I, 16, False),
}

#: Types the C kernels compute on directly, in TYPE_TRAITS' order
KERNEL_TYPES = tuple(TYPE_TRAITS)

#: The float types' numpy views of their data (BF16: the raw 16 bits, as uint16)
FLOAT_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16}
#: Integer tensors: kept as they are (neither kernel weights nor converted)
INTEGER_TYPES = (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64)


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
        if ggml_type in FLOAT_DTYPES:
            data = buf.view(FLOAT_DTYPES[ggml_type]).reshape(shape)
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
