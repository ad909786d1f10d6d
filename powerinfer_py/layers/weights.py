"""Weight lookup shared by the models and their layers: a tensor by name with a clear error, a norm weight as
the f32 vector the kernels take, one layer's tensors as attributes, and the Expected table type
(name -> (shape in numpy order, required)) that each architecture's expected_tensors returns."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping

import numpy as np

from ..errors import ModelFileError
from ..gguf.types import Tensor

Expected = dict[str, tuple[tuple[int, ...], bool]]  # name -> (shape in numpy order, required)


def get_tensor(tensors: Mapping[str, Tensor], name: str, required: bool = True) -> Tensor | None:
    t = tensors.get(name)
    if t is None and required:
        raise ModelFileError(f"missing required tensor {name!r}")
    return t


def norm_weight(t: Tensor | None) -> np.ndarray | None:
    """A norm weight or bias as the f32 [D] array the kernels take (these are F32 in every GGUF we read;
    an F16 one is converted once here)."""
    if t is None:
        return None
    return np.ascontiguousarray(t.data, dtype=np.float32).reshape(-1)


def layer_tensors(tensors: Mapping[str, Tensor], il: int, names: Mapping[str, str],
                  optional: tuple[str, ...] = ()) -> SimpleNamespace:
    """Layer il's tensors as attributes: names maps attribute -> tensor suffix ("attn_q.weight").
    Suffixes ending in "norm.weight", "norm_2.weight" or ".bias" become f32 arrays; the rest stay Tensors for
    matmul."""
    out = {}
    for attr, suffix in names.items():
        t = get_tensor(tensors, f"blk.{il}.{suffix}", required=attr not in optional)
        out[attr] = norm_weight(t) if suffix.endswith(("norm.weight", "norm_2.weight", ".bias")) else t
    return SimpleNamespace(**out)
