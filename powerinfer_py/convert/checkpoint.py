"""A Hugging Face checkpoint folder: config.json plus weights, every tensor available lazily by name.

Weights are looked for in this order (the first that exists wins):
  model.safetensors.index.json (sharded safetensors), *.safetensors, pytorch_model.bin.index.json,
  pytorch_model*.bin.
Only headers (safetensors) or pickles (.bin, through the restricted reader) are read when the folder is opened;
tensor bytes are read when converted. Missing shards, truncated shards, tensors listed in an index but absent
from their shard, and names present in two files are reported here, naming the file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import ModelFileError
from .safetensors import parse_json, read_safetensors
from .source import SourceTensor
from .torch_pt import read_state_dict


def read_json(path: Path) -> dict:
    """A JSON file that holds one object (config.json, tokenizer files, index files): the object, else a
    ModelFileError naming the file."""
    try:
        value = parse_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path}: file not found") from None
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ModelFileError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ModelFileError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


class Checkpoint:
    """`config` (the parsed config.json), `files` (weight files), `tensors` ({HF name: SourceTensor})."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ModelFileError(f"{self.folder}: not a folder (expected a Hugging Face checkpoint folder)")
        config = read_json(self.folder / "config.json")
        if not isinstance(config, dict):
            raise ModelFileError(f"{self.folder / 'config.json'}: expected a JSON object")
        self.config: dict[str, Any] = config
        self.files, index = self._weight_files()
        self.tensors: dict[str, SourceTensor] = {}
        where: dict[str, Path] = {}
        for f in self.files:
            loaded = read_safetensors(f) if f.suffix == ".safetensors" else read_state_dict(f)
            for name, t in loaded.items():
                if name in where:
                    raise ModelFileError(f"{f}: tensor {name!r} is also in {where[name]}")
                where[name] = f
                self.tensors[name] = t
        for name, shard in (index or {}).items():
            if name not in self.tensors:
                raise ModelFileError(f"{self.folder / shard}: tensor {name!r} listed in the index is missing")

    def _weight_files(self) -> tuple[list[Path], dict[str, str] | None]:
        for index_name, pattern in (("model.safetensors.index.json", "*.safetensors"),
                                    ("pytorch_model.bin.index.json", "pytorch_model*.bin")):
            index_path = self.folder / index_name
            if index_path.exists():
                weight_map = read_json(index_path).get("weight_map")
                if not isinstance(weight_map, dict) or not weight_map:
                    raise ModelFileError(f"{index_path}: no weight_map")
                shards = [self._shard(index_path, s) for s in dict.fromkeys(weight_map.values())]
                return shards, weight_map
            files = sorted(self.folder.glob(pattern))
            if files:
                return files, None
        raise ModelFileError(f"{self.folder}: no weights found (model.safetensors[.index.json], *.safetensors "
                             "or pytorch_model*.bin)")

    def _shard(self, index_path: Path, name) -> Path:
        """The file a weight_map entry names: a relative name inside the checkpoint folder that resolves
        (symbolic links followed) to a file inside it, or inside the repository's blob store when the folder is
        a Hugging Face cache snapshot (whose files are links to ../../blobs/<hash>). Absolute names, `..` and
        links elsewhere are refused, so an index cannot make the converter read (and embed) other files."""
        if not isinstance(name, str) or not name:
            raise ModelFileError(f"{index_path}: weight_map values must be shard file names, got {name!r}")
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts:
            raise ModelFileError(f"{index_path}: shard {name!r} is not a file name inside the checkpoint folder")
        shard = self.folder / rel
        if not shard.is_file():
            raise ModelFileError(f"{shard}: shard listed in {index_path.name} is missing")
        real, folder = shard.resolve(), self.folder.resolve()
        roots = [folder] + ([folder.parent.parent / "blobs"] if folder.parent.name == "snapshots" else [])
        if not any(real.is_relative_to(root) for root in roots):
            raise ModelFileError(f"{index_path}: shard {name!r} resolves to {real}, outside the checkpoint folder")
        return shard

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or [self.config.get("model_type", "")]
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise ModelFileError(f"{self.folder / 'config.json'}: architectures must be a list of class names, got "
                                 f"{archs!r}")
        return archs[0]

    def get(self, name: str) -> SourceTensor:
        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.folder}: tensor {name!r} not found in {', '.join(f.name for f in self.files)}")
        return t

    def has(self, name: str) -> bool:
        return name in self.tensors

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())
