"""PowerInfer predictor folders: model_0.pt .. model_{L-1}.pt (+ optional config.json with sparse_threshold).

Each model_N.pt is a torch state dict with fc1.weight [R_N, n_embd] and fc2.weight [n_ff, R_N] (no biases),
read with the restricted .pt reader. The rank R_N differs per layer. In the PWRI file they become
blk.N.fc1.weight (ne [n_embd, R_N], i.e. numpy shape (R_N, n_embd): the torch layout as it is) and
blk.N.fc2.weight (ne [R_N, n_ff], numpy shape (n_ff, R_N)). Every shape is checked against the model here,
so a predictor for another model is refused before anything is written.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError
from .checkpoint import read_json
from .source import FLOAT_DTYPES, SourceTensor
from .torch_pt import read_state_dict

_FILE = re.compile(r"model_(\d+)\.pt")


@dataclass
class Predictor:
    folder: Path
    fc1: list[SourceTensor]  # per layer, torch shape [R_N, n_embd]
    fc2: list[SourceTensor]  # per layer, torch shape [n_ff, R_N]
    threshold: float | None  # from config.json, when given

    @property
    def ranks(self) -> list[int]:
        return [t.shape[0] for t in self.fc1]


def _weight(path: Path, state: dict[str, SourceTensor], key: str) -> SourceTensor:
    matches = [v for k, v in state.items() if k == key or k.endswith("." + key)]
    if len(matches) != 1:
        keys = ", ".join(sorted(state))  # names from the file: a few shown, not megabytes of them
        raise ModelFileError(f"{path}: expected one {key!r} tensor, found {len(matches)} "
                             f"(keys: {keys if len(keys) <= 200 else keys[:200] + '...'})")
    t = matches[0]
    if t.dtype not in FLOAT_DTYPES or len(t.shape) != 2:
        raise ModelFileError(f"{path}: {key} must be a 2-D floating-point tensor, got {t.dtype} {t.shape}")
    return t


def read_predictor(folder: str | os.PathLike, n_layer: int, n_embd: int, n_ff: int) -> Predictor:
    """Read and check a predictor folder for a model of n_layer layers, width n_embd and n_ff neurons."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFileError(f"{folder}: predictor folder not found")
    files = {int(m.group(1)): p for p in folder.iterdir() if (m := _FILE.fullmatch(p.name))}
    if len(files) != n_layer:
        raise ModelFileError(f"{folder}: {len(files)} predictor files (model_N.pt) for a model with {n_layer} "
                             "layers: layer count mismatch")
    missing = [i for i in range(n_layer) if i not in files]
    if missing:
        raise ModelFileError(f"{folder}: predictor file model_{missing[0]}.pt is missing "
                             f"(found {', '.join(files[i].name for i in sorted(files)[:4])}...)")
    fc1s, fc2s = [], []
    for il in range(n_layer):
        path = files[il]
        state = read_state_dict(path)
        fc1, fc2 = _weight(path, state, "fc1.weight"), _weight(path, state, "fc2.weight")
        rank = fc1.shape[0]
        if fc1.shape[1] != n_embd:
            raise ModelFileError(f"{path}: fc1.weight has shape {list(fc1.shape)}, the model needs "
                                 f"[rank, {n_embd}] (n_embd {n_embd}): predictor for another model?")
        if tuple(fc2.shape) != (n_ff, rank):
            raise ModelFileError(f"{path}: fc2.weight has shape {list(fc2.shape)}, the model needs "
                                 f"[{n_ff}, {rank}] (n_ff {n_ff}, rank of fc1 {rank})")
        fc1.name, fc2.name = f"{path.name}:fc1.weight", f"{path.name}:fc2.weight"
        fc1s.append(fc1)
        fc2s.append(fc2)
    threshold = None
    if (folder / "config.json").exists():
        value = read_json(folder / "config.json").get("sparse_threshold")
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ModelFileError(f"{folder / 'config.json'}: sparse_threshold must be a number, got {value!r}")
        threshold = None if value is None else float(value)
    return Predictor(folder, fc1s, fc2s, threshold)
