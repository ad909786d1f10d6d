"""Re-encode the weights of a GGUF or PWRI file: `quantize(IN, OUT, f16|q8_0|q4_0)`.

Everything but the 2-D weights' encoding is kept: the magic (a PWRI stays PWRI), every metadata key with its
type (general.file_type is updated), the tensor order, the alignment, and the predictor tensors (fc1/fc2 are
re-encoded like the other weights, as published PowerInfer files do). 1-D tensors (norms, biases) and integer
tensors are copied byte for byte. A 2-D tensor whose rows are not a multiple of 32 cannot be Q8_0/Q4_0 and
becomes F16. Source weights of any type gguf can dequantize (Q4_K, Q6_K, ...) are accepted.

Tensors are read from the memory map a block of rows at a time and their pages released once written, so
resident memory stays small.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGUFValueType
from gguf import quants as gguf_quants

from ..errors import UnsupportedError
from ..gguf import GGUFFile, open_gguf
from ..gguf.types import INTEGER_TYPES, GGMLType, Tensor
from .output import QUANTIZED, Block, TensorPlan, check_target, write_streamed
from .plan import BLOCK_ELEMS, FILE_TYPES

QUANTIZE_TYPES = {"f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}
_FLOAT_SOURCES = {GGMLType.F32: "F32", GGMLType.F16: "F16", GGMLType.BF16: "BF16"}


def _target(t: Tensor, outtype: GGMLType) -> GGMLType | None:
    """The new type of `t`, or None to copy it unchanged."""
    if len(t.shape) < 2 or t.type in INTEGER_TYPES or t.type == GGMLType.F64:
        return None
    if outtype in QUANTIZED and t.shape[-1] % 32:
        return GGMLType.F16
    return outtype


def _copy_blocks(f: GGUFFile, t: Tensor) -> Callable[[], Iterator[Block]]:
    def gen():
        yield np.asarray(t.data).reshape(-1).view(np.uint8), "U8"
        f.release_pages(t.name)
    return gen


def _dequant_blocks(f: GGUFFile, t: Tensor) -> Callable[[], Iterator[Block]]:
    """Row blocks of `t` as raw floats (F32/F16/BF16 as stored) or dequantized float32."""
    def gen():
        rows = t.data.reshape(t.n_rows, -1)  # [n_rows, n_cols or row bytes]
        step = max(1, BLOCK_ELEMS // t.n_cols)
        for r0 in range(0, t.n_rows, step):
            block = rows[r0:r0 + step]
            if t.type in _FLOAT_SOURCES:
                yield np.array(block), _FLOAT_SOURCES[t.type]
            else:
                x = gguf_quants.dequantize(np.asarray(block), t.type)
                yield x.astype(np.float32, copy=False).reshape(len(block), t.n_cols), "F32"
        f.release_pages(t.name)
    return gen


def quantize(src: str | os.PathLike, out: str | os.PathLike, outtype: str, *, force: bool = False,
             n_threads: int | None = None, progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Write `src` re-encoded as `outtype` (f16, q8_0 or q4_0) to `out`. Returns the output path."""
    if outtype not in QUANTIZE_TYPES:
        raise UnsupportedError(f"quantization type {outtype!r} is not supported; choose one of "
                               f"{', '.join(QUANTIZE_TYPES)}")
    out = Path(out)
    check_target(out, force)
    target = QUANTIZE_TYPES[outtype]
    with open_gguf(src) as f:
        plans = []
        for t in f.tensors.values():
            new = _target(t, target)
            if new is None or new == t.type:
                plans.append(TensorPlan(t.name, t.type, t.shape, _copy_blocks(f, t), raw=True))
            else:
                plans.append(TensorPlan(t.name, new, t.shape, _dequant_blocks(f, t)))
        metadata = dict(f.metadata)
        types = dict(f.metadata_types)
        metadata["general.file_type"] = FILE_TYPES[outtype]
        types["general.file_type"] = (GGUFValueType.UINT32, None)
        return write_streamed(out, metadata, plans, magic=f.magic, types=types, alignment=f.alignment,
                              force=force, n_threads=n_threads, progress=progress)
