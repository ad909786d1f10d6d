"""load_weights: a GGUFFile's tensors, checked against what the model expects and ready for the kernels.

Tensors in a kernel type (tensor.KERNEL_TYPES: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, MXFP4 (gpt-oss's
and llama.cpp's MXFP4_MOE experts), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and the I-quants IQ3_XXS, IQ3_S, IQ2_XXS,
IQ2_XS, IQ2_S, IQ1_S, IQ1_M) stay zero-copy views on the memory map. Every other float or quantized type (TQ1_0,
TQ2_0, F64 ...) is converted once, here: dequantized to f32 with the gguf package's numpy code, then
quantized to Q8_0 (the nearest kernel type that loses almost nothing: 8.5 bits per weight), or kept F32 for 1-D
tensors and rows that are not a multiple of 32. Integer tensors (I8..I64) are left alone. After a tensor is
converted its pages of the map are released, so resident memory holds the converted copy and not both.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import quants as gguf_quants

from ..config import ModelConfig
from ..errors import ModelFileError
from .reader import GGUFFile
from ..models import read_config
from .types import INTEGER_TYPES, KERNEL_TYPES, GGMLType, Tensor

Q8_0_BLOCK = GGML_QUANT_SIZES[GGMLType.Q8_0][0]
_CHUNK_ELEMS = 1 << 22  # convert ~4M weights at a time: bounds the f32 scratch to 16 MB per step

ExpectedFn = Callable[[ModelConfig], "dict[str, tuple[tuple[int, ...], bool]]"]


@dataclass(frozen=True)
class Conversion:
    name: str
    from_type: GGMLType
    to_type: GGMLType


@dataclass
class LoadedWeights:
    config: ModelConfig
    tensors: dict[str, Tensor]  # file order; converted tensors replaced by their converted copy
    conversions: list[Conversion]
    file: GGUFFile


def conversion_target(t: Tensor) -> GGMLType | None:
    """The type load_weights converts `t` to, or None if the kernels take it as it is."""
    if t.type in KERNEL_TYPES or t.type in INTEGER_TYPES:
        return None
    if len(t.shape) >= 2 and t.shape[-1] % Q8_0_BLOCK == 0:
        return GGMLType.Q8_0
    return GGMLType.F32


def _q8_0_quantizer() -> Callable[[np.ndarray], np.ndarray]:
    """x f32 [R, K] -> Q8_0 data uint8 [R, K / 32 * 34]: the C kernel if built, else numpy."""
    for module in ("cpu", "ref"):
        try:
            fn = importlib.import_module(f"..kernels.{module}", __package__).quantize
        except (ImportError, AttributeError, OSError):
            continue
        return lambda x, fn=fn: fn(x, GGMLType.Q8_0)
    return lambda x: gguf_quants.quantize(x, GGMLType.Q8_0)


def _dequantize(data: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    if ggml_type == GGMLType.F64:  # not covered by gguf.quants
        return data.view("<f8").astype(np.float32)
    return gguf_quants.dequantize(data, ggml_type).astype(np.float32, copy=False)


def convert_tensor(t: Tensor, to_type: GGMLType, quantize_q8_0=None) -> Tensor:
    """Dequantize `t` and re-encode it as `to_type` (Q8_0 or F32), a few rows at a time."""
    rows = t.data.reshape(t.n_rows, -1)  # [n_rows, row bytes or n_cols]
    if to_type == GGMLType.F32:
        out = np.empty((t.n_rows, t.n_cols), dtype=np.float32)
    elif to_type == GGMLType.Q8_0:
        out = np.empty((t.n_rows, t.n_cols // Q8_0_BLOCK * GGML_QUANT_SIZES[to_type][1]), dtype=np.uint8)
        quantize_q8_0 = quantize_q8_0 or _q8_0_quantizer()
    else:
        raise ValueError(f"cannot convert to {to_type.name}")
    step = max(1, _CHUNK_ELEMS // t.n_cols)
    for r0 in range(0, t.n_rows, step):
        x = _dequantize(rows[r0:r0 + step], t.type).reshape(-1, t.n_cols)
        if to_type == GGMLType.F32:
            out[r0:r0 + step] = x
        else:
            out[r0:r0 + step] = quantize_q8_0(np.ascontiguousarray(x)).reshape(len(x), -1)
    shape = t.shape
    return Tensor(t.name, to_type, shape, out.reshape(*shape[:-1], out.shape[-1]))


def check_expected(f: GGUFFile, expected: dict[str, tuple[tuple[int, ...], bool]]) -> None:
    """Every required tensor present, and every expected one with its shape (a ModelFileError naming it)."""
    for name, (shape, required) in expected.items():
        t = f.tensors.get(name)
        if t is None:
            if required:
                raise ModelFileError(f"{f.path}: missing required tensor {name!r} (expected shape {tuple(shape)})")
            continue
        if tuple(t.shape) != tuple(shape):
            raise ModelFileError(f"{f.path}: tensor {name!r} has shape {t.shape}, expected {tuple(shape)}")


def load_weights(f: GGUFFile, expected: ExpectedFn | None = None,
                 config: ModelConfig | None = None) -> LoadedWeights:
    """Config + tensors of `f`, validated against `expected(config)` (name -> (shape, required)) and with
    every non-kernel type converted once (see the module docstring). Conversions are listed for the user.
    config: the file's, when the caller has read it already (default: models.read_config(f))."""
    if config is None:
        config = read_config(f)
    if expected is not None:
        check_expected(f, expected(config))
    tensors: dict[str, Tensor] = {}
    conversions: list[Conversion] = []
    quantize_q8_0 = None
    for name, t in f.tensors.items():
        target = conversion_target(t)
        if target is None:
            tensors[name] = t
            continue
        if target == GGMLType.Q8_0 and quantize_q8_0 is None:
            quantize_q8_0 = _q8_0_quantizer()
        try:
            tensors[name] = convert_tensor(t, target, quantize_q8_0)
        except NotImplementedError:
            raise ModelFileError(f"{f.path}: tensor {name!r} has type {t.type.name}, which cannot be "
                                 "converted (no dequantizer for it)") from None
        f.release_pages(name)
        conversions.append(Conversion(name, t.type, target))
    return LoadedWeights(config, tensors, conversions, f)
