"""Writing trained predictors: into a PowerInfer (PWRI) model file, or as a PowerInfer predictor folder.

write_pwri(src, predictors, out): the source model's tensors, in its order, with per layer N
  - blk.N.ffn_down.weight (dense files) replaced by blk.N.ffn_down_t.weight, its transpose [n_ff, n_embd]
    (docs/FORMATS.md section 1: row i is neuron i's down column), re-encoded because quantized blocks run along the
    other axis: F32/F16 stay as they are, Q4_0 stays Q4_0, every other type becomes Q8_0 (F16 when n_embd is
    not a multiple of 32); PWRI sources keep their ffn_down_t bytes unchanged. ffn_down.bias -> ffn_down_t.bias.
  - blk.N.fc1.weight [R_N, n_embd] and blk.N.fc2.weight [n_ff, R_N] (replacing any the source had), placed
    right after the layer's down projection, in `fc_type` (f16 or f32);
  - every metadata key kept, plus powerinfer.sparse_threshold (f32) = the threshold the predictors were
    trained for; the magic is PWRI. Written block by block through convert.output.write_streamed (atomic).
write_pt(folder, predictors): model_N.pt ({"fc1.weight": [R, n_embd], "fc2.weight": [n_ff, R]}, torch zip files
  written without torch) and config.json {"sparse_threshold": t}: what `powerinfer convert --predictor` and
  PowerInfer's own converter read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
from gguf import GGUFValueType
from gguf import quants as gguf_quants

from ..convert.output import TensorPlan, atomic_output, check_target, write_streamed
from ..errors import PowerInferError
from ..gguf import open_gguf
from ..gguf.types import GGMLType, Tensor
from .predictor_fit import LayerPredictor

FC_TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16}
THRESHOLD_KEY = "powerinfer.sparse_threshold"
_FLOATS = {GGMLType.F32: "F32", GGMLType.F16: "F16", GGMLType.BF16: "BF16"}
_BLOCK_ROWS = 1024


def _as_f32(t: Tensor) -> np.ndarray:
    """The whole tensor as f32 in numpy order."""
    data = np.asarray(t.data)
    if t.type == GGMLType.F32:
        return data.astype(np.float32, copy=False).reshape(t.shape)
    if t.type == GGMLType.F16:
        return data.astype(np.float32).reshape(t.shape)
    return gguf_quants.dequantize(data, t.type).astype(np.float32, copy=False).reshape(t.shape)


def down_t_type(t: Tensor) -> GGMLType:
    """The type of ffn_down_t made from a dense ffn_down (see the module docstring)."""
    n_embd = t.shape[0]
    if t.type in (GGMLType.F32, GGMLType.F16):
        return t.type
    if n_embd % 32:
        return GGMLType.F16
    return GGMLType.Q4_0 if t.type == GGMLType.Q4_0 else GGMLType.Q8_0


def _raw(t: Tensor) -> Callable[[], Iterator]:
    def gen():
        yield np.asarray(t.data).reshape(-1).view(np.uint8), "U8"
    return gen


def _transposed(t: Tensor) -> Callable[[], Iterator]:
    def gen():
        xt = _as_f32(t).T  # [n_ff, n_embd] view
        for r0 in range(0, xt.shape[0], _BLOCK_ROWS):
            yield np.ascontiguousarray(xt[r0:r0 + _BLOCK_ROWS]), "F32"
    return gen


def _array(x: np.ndarray) -> Callable[[], Iterator]:
    def gen():
        yield np.ascontiguousarray(x, dtype=np.float32), "F32"
    return gen


def _predictor_plans(il: int, lp: LayerPredictor, fc_type: GGMLType) -> list[TensorPlan]:
    p = f"blk.{il}."
    return [TensorPlan(p + "fc1.weight", fc_type, lp.fc1.shape, _array(lp.fc1)),
            TensorPlan(p + "fc2.weight", fc_type, lp.fc2.shape, _array(lp.fc2))]


def write_pwri(src: str | os.PathLike, predictors: Sequence[LayerPredictor], out: str | os.PathLike, *,
               threshold: float = 0.0, fc_type: str = "f16", force: bool = False,
               progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Write src's model with the trained predictors as a PWRI file at out (see the module docstring)."""
    if fc_type not in FC_TYPES:
        raise PowerInferError(f"predictor tensor type {fc_type!r}; one of {', '.join(FC_TYPES)}")
    out = Path(out)
    check_target(out, force)
    if out.exists() and out.resolve() == Path(src).resolve():
        raise PowerInferError(f"{out}: the output would overwrite the model it is made from")
    ftype = FC_TYPES[fc_type]
    with open_gguf(src) as f:
        n_layer = sum(1 for n in f.tensors if n.endswith((".ffn_down.weight", ".ffn_down_t.weight")))
        if n_layer != len(predictors):
            raise PowerInferError(f"{src}: {n_layer} layers, {len(predictors)} predictors")
        plans: list[TensorPlan] = []
        for name, t in f.tensors.items():
            parts = name.split(".")
            if len(parts) == 4 and parts[0] == "blk" and parts[2] in ("fc1", "fc2"):
                continue  # replaced by the trained predictors
            if len(parts) == 4 and parts[0] == "blk" and parts[2] == "ffn_down" and parts[3] == "weight":
                il = int(parts[1])
                plans.append(TensorPlan(f"blk.{il}.ffn_down_t.weight", down_t_type(t), (t.shape[1], t.shape[0]),
                                        _transposed(t)))
                plans += _predictor_plans(il, predictors[il], ftype)
                continue
            if len(parts) == 4 and parts[0] == "blk" and parts[2] == "ffn_down" and parts[3] == "bias":
                name = f"blk.{parts[1]}.ffn_down_t.bias"
            plans.append(TensorPlan(name, t.type, t.shape, _raw(t), raw=True))
            if len(parts) == 4 and parts[2] == "ffn_down_t" and parts[3] == "weight":
                plans += _predictor_plans(int(parts[1]), predictors[int(parts[1])], ftype)
        metadata, types = dict(f.metadata), dict(f.metadata_types)
        metadata[THRESHOLD_KEY] = float(threshold)
        types[THRESHOLD_KEY] = (GGUFValueType.FLOAT32, None)
        return write_streamed(out, metadata, plans, magic="PWRI", types=types, alignment=f.alignment,
                              force=force, progress=progress)


def write_pt(folder: str | os.PathLike, predictors: Sequence[LayerPredictor], *, threshold: float = 0.0,
             fc_type: str = "f16", force: bool = False) -> Path:
    """Write model_N.pt files and config.json into folder (created if missing)."""
    from ..convert.torch_pt import save_pt

    if fc_type not in FC_TYPES:
        raise PowerInferError(f"predictor tensor type {fc_type!r}; one of {', '.join(FC_TYPES)}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PowerInferError(f"{folder}: exists and is not a folder")
    if not force and (folder / "model_0.pt").exists():
        raise PowerInferError(f"{folder}: already holds predictor files; pass --force to overwrite them")
    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.float16 if fc_type == "f16" else np.float32
    for il, lp in enumerate(predictors):
        save_pt(folder / f"model_{il}.pt", {"fc1.weight": lp.fc1.astype(dtype), "fc2.weight": lp.fc2.astype(dtype)})
    with atomic_output(folder / "config.json") as tmp:
        tmp.write_text(json.dumps({"sparse_threshold": float(threshold),
                                   "ranks": [lp.rank for lp in predictors]}) + "\n", encoding="utf-8")
    return folder
