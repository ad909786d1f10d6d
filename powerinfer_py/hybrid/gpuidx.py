"""The `.gpuidx` placement sidecar (docs/FORMATS.md section 3), read and written compatibly with PowerInfer.

A GGUF file with magic PWRI, general.architecture = "generic.gpu_index", generic.gpu_index.block_count (u32)
and split.vram_capacity (u64: the VRAM bytes the plan was solved for), and 2*L tensors, layers in numeric
order: blk.N.gpu_idx (I32 [n_ff], 1 = neuron on the device) then blk.N.gpu_bucket (I32 [k_N], the ascending
indices of those neurons). A layer with no device neuron has an empty bucket (ne0 = 0), which GGUF allows.
The file appears only when complete (written to a temporary name in the same folder, then renamed).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from ..convert.output import atomic_output
from ..errors import ModelFileError
from ..gguf.reader import open_gguf
from ..gguf.types import GGMLType
from ..gguf.writer import build_header, data_layout, tensor_info_bytes
from .placement import Placement

ARCH = "generic.gpu_index"
KEY_BLOCKS = "generic.gpu_index.block_count"
KEY_CAPACITY = "split.vram_capacity"
ALIGNMENT = 32


def write_gpuidx(path: str | os.PathLike, plan: Placement) -> Path:
    """Write plan as a sidecar at path (atomically); returns the path."""
    path = Path(path)
    arrays: list[tuple[str, np.ndarray]] = []
    for il, hot in enumerate(plan.hot):
        arrays.append((f"blk.{il}.gpu_idx", plan.mask(il)))
        arrays.append((f"blk.{il}.gpu_bucket", np.asarray(hot, dtype=np.int32)))
    meta = {"general.architecture": ARCH, KEY_BLOCKS: len(plan.hot), KEY_CAPACITY: int(plan.budget)}
    types = {KEY_BLOCKS: (GGUFValueType.UINT32, None), KEY_CAPACITY: (GGUFValueType.UINT64, None)}
    offsets = data_layout((a.nbytes for _, a in arrays), ALIGNMENT)
    infos = [tensor_info_bytes(name, GGMLType.I32, a.shape, off) for (name, a), off in zip(arrays, offsets)]
    header = build_header("PWRI", meta, types, infos, ALIGNMENT)
    with atomic_output(path) as tmp, open(tmp, "wb") as fh:
        fh.write(header)
        for _, a in arrays:
            raw = a.astype("<i4").tobytes()
            fh.write(raw + bytes(-len(raw) % ALIGNMENT))
    return path


def read_gpuidx(path: str | os.PathLike, n_layer: int | None = None, n_ff: int | None = None) -> Placement:
    """A sidecar as a Placement (hot indices, n_ff and budget; no footprint or shares). n_layer / n_ff, when
    given, must match the model the plan is for. Inconsistent files raise ModelFileError."""
    path = Path(path)
    f = open_gguf(path, allow_empty=True)
    try:
        if f.metadata.get("general.architecture") != ARCH:
            raise ModelFileError(f"{path}: not a placement sidecar (general.architecture is "
                                 f"{f.metadata.get('general.architecture')!r}, expected {ARCH!r})")
        blocks = f.metadata.get(KEY_BLOCKS)
        if not isinstance(blocks, int) or blocks < 0:
            raise ModelFileError(f"{path}: missing or bad {KEY_BLOCKS}")
        if n_layer is not None and blocks != n_layer:
            raise ModelFileError(f"{path}: the placement is for {blocks} layers, the model has {n_layer}")
        hot, width = [], None
        for il in range(blocks):
            idx = _i32(f, path, f"blk.{il}.gpu_idx")
            bucket = _i32(f, path, f"blk.{il}.gpu_bucket")
            width = len(idx) if width is None else width
            if len(idx) != width or (n_ff is not None and len(idx) != n_ff):
                raise ModelFileError(f"{path}: blk.{il}.gpu_idx has {len(idx)} entries, expected "
                                     f"{n_ff if n_ff is not None else width}")
            if not np.array_equal(np.flatnonzero(idx).astype(np.int32), bucket):
                raise ModelFileError(f"{path}: blk.{il}.gpu_bucket is not the ascending list of the neurons "
                                     "blk.{il}.gpu_idx marks")
            hot.append(bucket.copy())
        if len(f.tensors) != 2 * blocks:
            raise ModelFileError(f"{path}: {len(f.tensors)} tensors, expected {2 * blocks}")
        return Placement(hot, int(width or n_ff or 0), int(f.metadata.get(KEY_CAPACITY, 0)))
    finally:
        f.close()


def _i32(f, path: Path, name: str) -> np.ndarray:
    t = f.tensors.get(name)
    if t is None:
        raise ModelFileError(f"{path}: missing tensor {name!r}")
    if t.type != GGMLType.I32 or len(t.shape) != 1:
        raise ModelFileError(f"{path}: tensor {name!r} must be a 1-D I32 array, got {t.type.name} {t.shape}")
    return np.frombuffer(t.data.tobytes(), dtype="<i4").astype(np.int32)
