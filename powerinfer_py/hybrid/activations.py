"""Per-layer neuron activation statistics, the input of placement: read from files, or profiled here.

Sources load_activations() reads (counts are per neuron, any non-negative numbers):
  * a folder of PowerInfer's activation/activation_N.pt (1-D torch tensors of length n_ff), read with the
    restricted .pt reader (no code from the file runs). Layers are matched by the number N, not by sorting
    names as strings (upstream's bug put activation_10 before activation_2).
  * a .npz with arrays activation_N (or layer_N), one per layer, or a single 2-D array [n_layer, n_ff];
  * a .json: {"layers": [[...], ...]} or a bare list of per-layer lists;
  * one .pt holding a 2-D tensor [n_layer, n_ff] or a list of 1-D tensors.
profile_activations() measures them instead: it runs the model's dense FFN path with the FFN observer hook
(ffn.py) over given tokens and counts, per neuron, the tokens whose activated gating value is non-zero.
"""
from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ModelFileError, PowerInferError
from .placement import check_counts

_PT_NAME = re.compile(r"activation_(\d+)\.pt$")
_NPZ_KEY = re.compile(r"(?:activation|layer)_(\d+)$")


def find_activations(model: str | os.PathLike) -> Path | None:
    """PowerInfer's layout: an activation/ folder beside the model file (None if there is none)."""
    folder = Path(model).parent / "activation"
    return folder if folder.is_dir() else None


def load_activations(source: str | os.PathLike, n_layer: int, n_ff: int) -> list[np.ndarray]:
    """Per-layer float64 counts [n_ff] from `source` (see the module docstring), validated for the model."""
    path = Path(source)
    if path.is_dir():
        counts = _from_folder(path, n_layer, n_ff)
    elif not path.exists():
        raise PowerInferError(f"{path}: no such activation statistics file or folder")
    elif path.suffix == ".npz":
        counts = _from_npz(path, n_layer, n_ff)
    elif path.suffix == ".json":
        counts = _from_json(path)
    elif path.suffix in (".pt", ".bin"):
        counts = _from_pt(path, n_layer, n_ff)
    else:
        raise PowerInferError(f"{path}: unknown statistics format (a folder of activation_N.pt, .npz, .json "
                              "or .pt)")
    return check_counts(counts, n_layer, n_ff, str(path))


def _read_tensor(path: Path):
    """The SourceTensor, or list of SourceTensors, of one .pt file; nothing read yet."""
    from ..convert.source import SourceTensor
    from ..convert.torch_pt import read_pt

    obj = read_pt(path)
    if isinstance(obj, SourceTensor):
        return obj
    if isinstance(obj, (list, tuple)) and all(isinstance(t, SourceTensor) for t in obj):
        return list(obj)
    raise ModelFileError(f"{path}: expected a tensor of activation counts, got {type(obj).__name__}")


def _check_sizes(source: Path, sizes: Sequence[int], n_layer: int, n_ff: int, first: int = 0) -> None:
    """check_counts' size checks on tensor shapes, before a byte is read: a file claiming more counts than the
    model has neurons fails here (with check_counts' words), not after being read into memory. `sizes`: the
    number of counts of each layer in the file."""
    if len(sizes) != n_layer:
        raise PowerInferError(f"{source}: statistics for {len(sizes)} layers, the model has {n_layer}")
    for il, n in enumerate(sizes, first):
        if n != n_ff:
            raise PowerInferError(f"{source}: layer {il} has {n} counts, the model's FFN has {n_ff} neurons")


def _from_folder(folder: Path, n_layer: int, n_ff: int) -> list[np.ndarray]:
    found = {int(m.group(1)): p for p in folder.iterdir() if (m := _PT_NAME.search(p.name))}
    missing = [il for il in range(n_layer) if il not in found]
    if missing:
        raise PowerInferError(f"{folder}: no activation_N.pt for layer(s) {missing[:8]} (found {len(found)} files)")
    extra = sorted(set(found) - set(range(n_layer)))
    if extra:
        raise PowerInferError(f"{folder}: statistics for layer(s) {extra[:8]}, the model has {n_layer} layers")
    out = []
    for il in range(n_layer):
        t = _read_tensor(found[il])
        _check_sizes(folder, [sum(x.n_elements for x in t) if isinstance(t, list) else t.n_elements], 1, n_ff, il)
        out.append(np.asarray([x.read() for x in t] if isinstance(t, list) else t.read()).reshape(-1))
    return out


def _from_npz(path: Path, n_layer: int, n_ff: int) -> list[np.ndarray]:
    # np.load inflates a member whole when it is read: refuse members larger than counts for the whole model
    # (float64 [n_layer, n_ff] plus a .npy header) before that, from the sizes the archive declares (zipfile
    # never reads a member past its declared size)
    limit = 8 * n_layer * n_ff + (1 << 16)
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError) as e:
        raise PowerInferError(f"{path}: not a .npz archive ({e})") from None
    if len(members) > n_layer + 1:
        raise PowerInferError(f"{path}: {len(members)} arrays for a model of {n_layer} layers")
    for m in members:
        if m.file_size > limit:
            raise PowerInferError(f"{path}: array {m.filename[:80]!r} holds {m.file_size} bytes, more than counts "
                                  f"for {n_layer} x {n_ff} neurons take ({limit})")
    with np.load(path, allow_pickle=False) as z:
        keyed = {int(m.group(1)): k for k in z.files if (m := _NPZ_KEY.fullmatch(k))}
        if keyed:
            return [z[keyed[il]] if il in keyed else np.zeros(0) for il in range(max(keyed) + 1)]
        if len(z.files) == 1 and z[z.files[0]].ndim == 2:
            return list(z[z.files[0]])
    raise PowerInferError(f"{path}: expected arrays activation_N / layer_N or one 2-D array")


def _from_json(path: Path) -> list[np.ndarray]:
    from ..convert.safetensors import parse_json

    try:
        obj = parse_json(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # parse_json: deep nesting and huge integers too
        raise PowerInferError(f"{path}: not valid JSON: {e}") from None
    layers = obj.get("layers") if isinstance(obj, dict) else obj
    if not isinstance(layers, list):
        raise PowerInferError(f'{path}: expected {{"layers": [[counts], ...]}} or a list of lists')
    try:
        return [np.asarray(layer, dtype=np.float64) for layer in layers]
    except (TypeError, ValueError):
        raise PowerInferError(f"{path}: the per-layer counts must be lists of numbers") from None


def _from_pt(path: Path, n_layer: int, n_ff: int) -> list[np.ndarray]:
    t = _read_tensor(path)
    if isinstance(t, list):
        _check_sizes(path, [x.n_elements for x in t], n_layer, n_ff)
        return [x.read() for x in t]
    if len(t.shape) == 2:  # [n_layer, n_ff]
        if t.shape[0] != n_layer:
            raise PowerInferError(f"{path}: statistics for {t.shape[0]} layers, the model has {n_layer}")
        _check_sizes(path, [t.shape[1]] * n_layer, n_layer, n_ff)
        return list(t.read())
    _check_sizes(path, [t.n_elements], n_layer, n_ff)
    return [t.read()]


def profile_activations(model, cache, tokens: Sequence[int], batch: int = 64) -> list[np.ndarray]:
    """Counts per layer [n_ff]: for how many of `tokens` each neuron's activated gating value was non-zero,
    measured by running `model` (a models.Model with ReLU-family FFNs) over them in batches. The FFNs are
    observed only during the call; the cache is cleared before and after."""
    ffns = getattr(model, "ffns", None)
    if not ffns:
        raise PowerInferError("this model has no per-layer FFNs to profile")
    counts = [np.zeros(f.n_ff, dtype=np.float64) for f in ffns]

    def observe(layer, x, p, act):
        counts[layer] += np.count_nonzero(act, axis=0)

    ids = np.asarray(tokens, dtype=np.int32)
    for f in ffns:
        f.observer = observe
    try:
        cache.clear()
        for s in range(0, len(ids), batch):
            if cache.n_past + min(batch, len(ids) - s) > cache.n_ctx:
                cache.clear()
            model.forward(ids[s:s + batch], cache)
    finally:
        for f in ffns:
            f.observer = None
        cache.clear()
    return counts
