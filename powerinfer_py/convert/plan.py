"""Building blocks of a conversion: row-block producers (plain rows, gathered rows, transposed) and the
Builder that turns HF tensors into TensorPlans with their output type, checking shapes against config.json.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
from gguf import GGUFValueType

from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import GGMLType
from .checkpoint import Checkpoint
from .output import QUANTIZED, Block, TensorPlan
from .source import SourceTensor

OUTTYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16,
            "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}  # llama.cpp's general.file_type
BLOCK_ELEMS = 4 << 20  # elements per block handed to the encoder (16 MiB as float32)
METADATA_TYPES = {"tokenizer.ggml.token_type": (GGUFValueType.ARRAY, GGUFValueType.INT32),
                  "tokenizer.ggml.scores": (GGUFValueType.ARRAY, GGUFValueType.FLOAT32)}
# tensors of HF checkpoints that carry no weights (buffers saved by old transformers versions)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "attn.masked_bias", "attn.bias")


# ---- block producers ---------------------------------------------------------------------------------------

def _step(n_cols: int) -> int:
    return max(1, BLOCK_ELEMS // max(1, n_cols))


def _rows(src: SourceTensor, r0: int = 0, r1: int | None = None) -> Callable[[], Iterator[Block]]:
    """Rows r0..r1 as they are stored, a block of rows at a time (read straight from the file)."""
    def gen():
        stop = src.shape[0] if r1 is None else r1
        n_cols = int(np.prod(src.shape[1:], dtype=np.int64))
        for a in range(r0, stop, _step(n_cols)):
            b = min(stop, a + _step(n_cols))
            yield src.read_rows(a, b).reshape((b - a, n_cols) if len(src.shape) > 1 else (b - a,)), src.dtype
    return gen


def _gather(src: SourceTensor, index: np.ndarray) -> Callable[[], Iterator[Block]]:
    """Rows in the order of `index` (a permutation of the rows)."""
    def gen():
        full = src.read()
        for a in range(0, len(index), _step(full.shape[1])):
            yield full[index[a:a + _step(full.shape[1])]], src.dtype
    return gen


def _transposed(src: SourceTensor) -> Callable[[], Iterator[Block]]:
    """The transpose of a 2-D tensor: output row i is input column i."""
    def gen():
        full = src.read()  # [n_out, n_in]; one tensor in memory, blocks are transposed copies
        for a in range(0, full.shape[1], _step(full.shape[0])):
            yield np.ascontiguousarray(full[:, a:a + _step(full.shape[0])].T), src.dtype
    return gen


def _stacked(srcs: list[SourceTensor]) -> Callable[[], Iterator[Block]]:
    """Tensors of one shape one after another (a mixture-of-experts layer's experts as one 3-D tensor): the
    rows of the first, then of the second, ... (one source in memory at a time)."""
    def gen():
        for src in srcs:
            yield from _rows(src)()
    return gen


def rope_permutation(n_rows: int, n_head: int) -> np.ndarray:
    """Input row of each output row for llama.cpp's Q/K layout (see the module docstring)."""
    head_dim = n_rows // n_head
    half = head_dim // 2
    j = np.arange(head_dim)
    within = (j % 2) * half + j // 2
    return (np.arange(n_head)[:, None] * head_dim + within[None, :]).reshape(-1)


def falcon_qkv_order(n_head: int, n_head_kv: int, head_dim: int) -> np.ndarray:
    """Falcon-40B stores QKV rows per KV group [q x n_head/n_head_kv, k, v]; llama.cpp wants [all q, all k, all v]."""
    per = n_head // n_head_kv
    group = np.arange(n_head_kv)[:, None] * (per + 2) * head_dim
    q = (group + np.arange(per * head_dim)[None, :]).reshape(-1)
    k = (group + per * head_dim + np.arange(head_dim)[None, :]).reshape(-1)
    v = (group + (per + 1) * head_dim + np.arange(head_dim)[None, :]).reshape(-1)
    return np.concatenate([q, k, v])


# ---- the plan ----------------------------------------------------------------------------------------------

@dataclass
class Plan:
    arch: str
    magic: str
    metadata: dict[str, Any]
    tensors: list[TensorPlan] = field(default_factory=list)


class Builder:
    """Collects TensorPlans, checking each HF tensor's shape, and remembers which HF tensors were used."""

    def __init__(self, ckpt: Checkpoint, outtype: str):
        self.ckpt, self.outtype = ckpt, OUTTYPES[outtype]
        self.plans: list[TensorPlan] = []
        self.used: set[str] = set()

    def type_for(self, shape: tuple[int, ...]) -> GGMLType:
        if len(shape) == 1:
            return GGMLType.F32
        if self.outtype in QUANTIZED and shape[-1] % 32:
            return GGMLType.F16
        return self.outtype

    def source(self, hf_name: str, shape: tuple[int, ...] | None) -> SourceTensor:
        src = self.ckpt.get(hf_name)
        if shape is not None and tuple(src.shape) != tuple(shape):
            raise ModelFileError(f"{src.path}: tensor {hf_name!r} has shape {list(src.shape)}, config.json "
                                 f"implies {list(shape)}")
        if src.dtype not in ("F32", "F16", "BF16", "F64"):
            raise UnsupportedError(f"{src.path}: tensor {hf_name!r} has dtype {src.dtype}; F32/F16/BF16 expected")
        self.used.add(hf_name)
        return src

    def add(self, name: str, hf_name: str, shape: tuple[int, ...] | None = None, *, how: str = "rows",
            index: np.ndarray | None = None, first_row: int = 0) -> None:
        src = self.source(hf_name, shape)
        if how == "transpose":
            out_shape, blocks = (src.shape[1], src.shape[0]), _transposed(src)
        elif how == "gather":
            out_shape, blocks = tuple(src.shape), _gather(src, index)
        elif how == "f32":  # kept in f32 whatever the output type (MoE routers, as llama.cpp keeps them)
            self.plans.append(TensorPlan(name, GGMLType.F32, tuple(src.shape), _rows(src)))
            return
        elif how == "vector":  # a [1, n] matrix written as the vector [n] (qwen2moe's shared-expert gate)
            n = int(np.prod(src.shape))
            self.plans.append(TensorPlan(name, GGMLType.F32, (n,), lambda: iter([(src.read().reshape(n), src.dtype)])))
            return
        else:
            out_shape, blocks = (src.shape[0] - first_row, *src.shape[1:]), _rows(src, first_row)
        self.plans.append(TensorPlan(name, self.type_for(out_shape), out_shape, blocks))

    def add_stack(self, name: str, hf_names: list[str], shape: tuple[int, ...]) -> None:
        """One 3-D tensor (len(hf_names), *shape) from HF tensors of shape `shape` each (MoE experts)."""
        srcs = [self.source(n, shape) for n in hf_names]
        out_shape = (len(srcs), *shape)
        self.plans.append(TensorPlan(name, self.type_for(out_shape), out_shape, _stacked(srcs)))

    def add_plain(self, plan: TensorPlan) -> None:
        self.plans.append(plan)

    def optional(self, name: str, hf_name: str, shape: tuple[int, ...] | None = None) -> bool:
        if self.ckpt.has(hf_name):
            self.add(name, hf_name, shape)
            return True
        return False


def cfg_value(ckpt: Checkpoint, *keys: str, default: Any = None) -> Any:
    """The first of `keys` present in config.json; `default` if none is (None: required). Every value read this
    way is a size, count, scale or epsilon: a positive finite number, else a ModelFileError naming the key."""
    for k in keys:
        value = ckpt.config.get(k)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ModelFileError(f"{ckpt.folder / 'config.json'}: {k} must be a positive number, got {value!r}")
            return value
    if default is None:
        raise ModelFileError(f"{ckpt.folder / 'config.json'}: missing {' / '.join(keys)}")
    return default
