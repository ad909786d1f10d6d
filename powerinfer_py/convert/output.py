"""Streaming GGUF/PWRI writer: the header is computed from tensor shapes and types alone, then each tensor's
bytes are produced, encoded and written one block of rows at a time, so memory stays near one tensor.

Safety, for every file this package writes:
  - the target is never overwritten unless `force`;
  - free space in the target folder is checked against the exact output size before anything is written;
  - bytes go to a temporary file in the target folder, renamed into place only once complete; on any error
    (KeyboardInterrupt included) the temporary file is removed and nothing appears under the target name.

Encoding runs on a small thread pool (numpy and the C quantizer release the GIL) while the calling thread reads
the next blocks, with a bounded number of blocks in flight.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
from gguf import quants as gguf_quants

from ..errors import PowerInferError
from ..gguf.types import GGMLType
from ..gguf.writer import (
    _resolve_alignment,
    build_header,
    data_layout,
    tensor_info_bytes,
    tensor_nbytes,
)
from ..kernels.cpus import usable_cpus
from ..outfile import atomic_output, check_free_space
from .source import to_f32

QUANTIZED = (GGMLType.Q8_0, GGMLType.Q4_0)

#: one block of a tensor: (raw values, their dtype in safetensors spelling, e.g. "BF16"), rows in output order;
#: or, for a plan with raw=True, already-encoded bytes as a uint8 array
Block = tuple[np.ndarray, str]


@dataclass
class TensorPlan:
    """One output tensor: its name, type, shape (numpy order) and a function yielding its blocks in order."""

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    blocks: Callable[[], Iterator[Block]]
    raw: bool = False  # blocks are already-encoded bytes (copied unchanged)

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.type, self.shape)


# ---- encoding ----------------------------------------------------------------------------------------------

def _find_quantizer() -> Callable[[np.ndarray, GGMLType], np.ndarray]:
    """x f32 [R, K] -> data in Tensor layout: the C kernel when built, else the numpy reference, else gguf's."""
    for module in ("cpu", "ref"):
        try:
            mod = __import__(f"powerinfer_py.kernels.{module}", fromlist=["quantize"])
            return mod.quantize
        except (ImportError, AttributeError, OSError):
            continue
    return gguf_quants.quantize


_quantize: Callable[[np.ndarray, GGMLType], np.ndarray] | None = None


def quantize_rows(x: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    global _quantize
    if _quantize is None:
        _quantize = _find_quantizer()
    return _quantize(np.ascontiguousarray(x, dtype=np.float32), ggml_type)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def encode_block(raw: np.ndarray, dtype: str, ggml_type: GGMLType) -> np.ndarray:
    """Raw source values -> the bytes of `ggml_type` (as a numpy array in Tensor layout)."""
    if ggml_type == GGMLType.F16 and dtype == "F16" or ggml_type == GGMLType.BF16 and dtype == "BF16":
        return raw  # same encoding: copy as it is
    x = to_f32(raw, dtype)
    if ggml_type == GGMLType.F32:
        return x
    if ggml_type == GGMLType.F16:
        return x.astype(np.float16)
    if ggml_type == GGMLType.BF16:
        return f32_to_bf16(x)
    if ggml_type in QUANTIZED:
        return quantize_rows(x.reshape(-1, x.shape[-1]), ggml_type)
    raise ValueError(f"cannot encode {ggml_type.name}")


def _encoded(plans: list[TensorPlan], n_threads: int) -> Iterator[tuple[int, np.ndarray]]:
    """(plan index, encoded block) in file order; encoding runs ahead on `n_threads` threads."""
    def jobs() -> Iterator[tuple[int, Callable[[], np.ndarray]]]:
        for i, plan in enumerate(plans):
            for raw, dtype in plan.blocks():
                if plan.raw:
                    yield i, (lambda raw=raw: raw)
                else:
                    yield i, (lambda raw=raw, dtype=dtype, t=plan.type: encode_block(raw, dtype, t))

    if n_threads <= 1:
        for i, job in jobs():
            yield i, job()
        return
    with ThreadPoolExecutor(n_threads, thread_name_prefix="pi-convert") as pool:
        pending: deque = deque()
        try:
            for i, job in jobs():
                pending.append((i, pool.submit(job)))
                if len(pending) > n_threads:
                    j, fut = pending.popleft()
                    yield j, fut.result()
            while pending:
                j, fut = pending.popleft()
                yield j, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()


# ---- files -------------------------------------------------------------------------------------------------

def check_target(path: Path, force: bool) -> None:
    if not path.parent.is_dir():
        raise PowerInferError(f"{path}: the output folder {path.parent} does not exist")
    if path.is_dir():
        raise PowerInferError(f"{path}: is a folder; give a file name")
    if path.exists() and not force:
        raise PowerInferError(f"{path}: already exists; pass --force to overwrite it")


def write_streamed(path: str | os.PathLike, metadata: Mapping[str, Any], plans: Iterable[TensorPlan], *,
                   magic: str = "GGUF", types: Mapping | None = None, alignment: int | None = None,
                   force: bool = False, n_threads: int | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Write a GGUF (or PWRI) file whose tensors are produced block by block. Returns the path.
    `progress(name, index, count)` is called before each tensor is written."""
    path = Path(path)
    check_target(path, force)
    plans = list(plans)
    metadata = dict(metadata)
    names = [p.name for p in plans]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate tensor name {next(n for n in names if names.count(n) > 1)!r}")
    alignment = _resolve_alignment(metadata, alignment)
    sizes = [p.nbytes for p in plans]
    offsets = data_layout(sizes, alignment)
    infos = [tensor_info_bytes(p.name, p.type, p.shape, off) for p, off in zip(plans, offsets)]
    header = build_header(magic, metadata, types or {}, infos, alignment)
    total = len(header) + (offsets[-1] + sizes[-1] if plans else 0)
    check_free_space(path, total)
    n_threads = n_threads or min(4, usable_cpus())

    with atomic_output(path) as tmp, open(tmp, "wb") as fh:
        fh.write(header)
        written, current = 0, -1
        for i, block in _encoded(plans, n_threads):
            if i != current:  # first block of the next tensor: close the previous one
                if current >= 0:
                    _finish(fh, plans[current], written, sizes[current], alignment)
                _check_produced(plans, current, i)
                current, written = i, 0
                if progress:
                    progress(plans[i].name, i, len(plans))
            block = np.ascontiguousarray(block)
            fh.write(block.reshape(-1).view(np.uint8).data)
            written += block.nbytes
        _check_produced(plans, current, len(plans))
        if plans:
            _finish(fh, plans[current], written, sizes[current], alignment)
    return path


def _check_produced(plans: list[TensorPlan], current: int, following: int) -> None:
    if following != current + 1:
        raise PowerInferError(f"tensor {plans[current + 1].name!r}: produced no data")


def _finish(fh, plan: TensorPlan, written: int, size: int, alignment: int) -> None:
    if written != size:
        raise PowerInferError(f"tensor {plan.name!r}: produced {written} bytes, {plan.type.name} "
                              f"{plan.shape} needs {size}")
    fh.write(bytes(-size % alignment))
