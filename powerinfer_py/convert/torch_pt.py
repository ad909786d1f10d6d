"""torch .pt / .bin files without torch, and without running anything from them.

A torch.save file (torch >= 1.6) is a zip archive with one top-level folder: `<folder>/data.pkl` (a pickle of
the saved object), `<folder>/data/<key>` (raw storages, little-endian), `<folder>/byteorder`, `version`. In the
pickle a tensor is `torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
backward_hooks)` where `storage` comes from a persistent id ("storage", torch.<T>Storage, key, location, numel).

Plain unpickling executes whatever callables the pickle names, so a downloaded checkpoint could run any code.
`_RestrictedUnpickler.find_class` resolves only the globals needed to rebuild tensors (each mapped to our own
harmless function or marker, never to an imported object) and refuses every other name before anything is
called. Tensors come back as lazy SourceTensors: their bytes are read only when converted.

`save_pt` writes the same layout (the `activation_N.pt` statistics files), readable by torch.load.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from .source import DTYPES, SourceTensor

# torch storage class name -> dtype (safetensors spelling)
_STORAGE_TYPES = {
    "DoubleStorage": "F64", "FloatStorage": "F32", "HalfStorage": "F16", "BFloat16Storage": "BF16",
    "LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
    "ByteStorage": "U8", "BoolStorage": "BOOL",
}
_DTYPE_STORAGE = {v: k for k, v in _STORAGE_TYPES.items()}
_NUMPY_TO_DTYPE = {np.dtype(v): k for k, v in DTYPES.items() if k != "BF16"}


class _StorageType:
    """What `torch.<T>Storage` resolves to: a marker carrying the dtype; not callable."""

    def __init__(self, dtype: str):
        self.dtype = dtype


class _Storage:
    """A storage named by the pickle; its bytes are the zip member `data/<key>`."""

    def __init__(self, key: str, dtype: str, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


class _Archive:
    """The open zip: member lookup and, for uncompressed members, their absolute data offsets."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise ModelFileError(f"{path}: not a torch zip checkpoint ({e}); legacy non-zip .pt files are "
                                 "not supported") from None
        pkls = [n for n in self.zip.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise ModelFileError(f"{path}: expected one <folder>/data.pkl in the archive, found {len(pkls)}")
        self.prefix = pkls[0][: -len("data.pkl")]
        order = self.zip.namelist()
        if self.prefix + "byteorder" in order:
            byteorder = self.zip.read(self.prefix + "byteorder").decode("ascii", "replace").strip()
            if byteorder != "little":
                raise UnsupportedError(f"{path}: byteorder {byteorder!r}; only little-endian files are supported")

    def member(self, key: str) -> zipfile.ZipInfo:
        try:
            return self.zip.getinfo(f"{self.prefix}data/{key}")
        except KeyError:
            raise ModelFileError(f"{self.path}: storage {key!r} named by the pickle is missing from the "
                                 "archive") from None

    def data_offset(self, info: zipfile.ZipInfo) -> int | None:
        """Absolute offset of an uncompressed member's bytes (after its local header), else None."""
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        with open(self.path, "rb") as fh:
            fh.seek(info.header_offset)
            local = fh.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise ModelFileError(f"{self.path}: corrupt zip: bad local header for {info.filename!r}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        return info.header_offset + 30 + name_len + extra_len


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: _Archive):
        super().__init__(io.BytesIO(data))
        self.archive = archive

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return self._rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGE_TYPES:
            return _StorageType(_STORAGE_TYPES[name])
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        raise ModelFileError(f"{self.archive.path}: refusing to load: the pickle names {module}.{name}, which "
                             "is not needed to rebuild tensors (the file may contain code); nothing was run")

    def persistent_load(self, pid: Any) -> _Storage:
        if (not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage"
                or not isinstance(pid[1], _StorageType) or not isinstance(pid[2], str)
                or not isinstance(pid[4], int)):
            raise ModelFileError(f"{self.archive.path}: unexpected persistent id {pid!r} in the pickle")
        return _Storage(pid[2], pid[1].dtype, pid[4])

    def _rebuild_tensor(self, storage, storage_offset, size, stride, *_ignored) -> SourceTensor:
        """(storage, offset, size, stride, [requires_grad, hooks, metadata]) -> a lazy SourceTensor."""
        path = self.archive.path
        if (not isinstance(storage, _Storage) or not isinstance(storage_offset, int) or storage_offset < 0
                or not all(isinstance(v, int) and v >= 0 for v in (*size, *stride)) or len(size) != len(stride)):
            raise ModelFileError(f"{path}: malformed tensor record (offset {storage_offset!r}, size {size!r}, "
                                 f"stride {stride!r})")
        info = self.archive.member(storage.key)
        itemsize = DTYPES[storage.dtype].itemsize
        if info.file_size < storage.numel * itemsize:
            raise ModelFileError(f"{path}: storage {storage.key!r} holds {info.file_size} bytes, {storage.numel} "
                                 f"{storage.dtype} elements need {storage.numel * itemsize} (truncated?)")
        size, stride = tuple(size), tuple(stride)
        last = storage_offset + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else -1
        if last >= storage.numel:
            raise ModelFileError(f"{path}: tensor of size {size} stride {stride} at offset {storage_offset} "
                                 f"reaches past its storage of {storage.numel} elements")
        contiguous = all(st == int(np.prod(size[i + 1:], dtype=np.int64))
                         for i, (s, st) in enumerate(zip(size, stride)) if s > 1)
        start = self.archive.data_offset(info) if contiguous else None
        name = f"{storage.key}@{storage_offset}"
        if start is not None:
            return SourceTensor(name, storage.dtype, size, path, offset=start + storage_offset * itemsize)
        archive = self.archive

        def load() -> np.ndarray:
            raw = np.frombuffer(archive.zip.read(info), dtype=DTYPES[storage.dtype], count=storage.numel)
            view = np.lib.stride_tricks.as_strided(raw[storage_offset:], size, [s * itemsize for s in stride])
            return np.ascontiguousarray(view)

        return SourceTensor(name, storage.dtype, size, path, loader=load)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None) -> Any:
    return data  # an nn.Parameter is its tensor for our purposes


def read_pt(path: str | os.PathLike) -> Any:
    """Unpickle a torch zip checkpoint with the restricted unpickler: tensors become SourceTensors,
    dicts/lists/numbers stay as they are. Anything else in the pickle raises ModelFileError before it runs."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: file not found")
    archive = _Archive(path)
    try:
        data = archive.zip.read(archive.prefix + "data.pkl")
        return _RestrictedUnpickler(data, archive).load()
    except ModelFileError:
        raise
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, IndexError,
            KeyError, zipfile.BadZipFile, OSError) as e:
        raise ModelFileError(f"{path}: corrupt pickle in torch checkpoint: {type(e).__name__}: {e}") from None


def read_state_dict(path: str | os.PathLike) -> dict[str, SourceTensor]:
    """A .pt/.bin state dict {name: tensor}. Tensors take their key as name."""
    obj = read_pt(path)
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, SourceTensor)
                                            for k, v in obj.items()):
        raise ModelFileError(f"{path}: expected a state dict of named tensors, got {type(obj).__name__}")
    for k, v in obj.items():
        v.name = k
    return dict(obj)


# ---- writer ------------------------------------------------------------------------------------------------

_ALIGN = 64  # torch aligns storages to 64 bytes in the archive (helps its memory-mapped loading)


def _pickle_tensor(out: list[bytes], key: str, dtype: str, shape: tuple[int, ...]) -> None:
    """Opcodes for _rebuild_tensor_v2(storage, 0, shape, C-order strides, False, OrderedDict())."""
    strides = [int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape))]
    numel = int(np.prod(shape, dtype=np.int64))
    out.append(b"ctorch._utils\n_rebuild_tensor_v2\n(")
    out.append(b"(" + _str("storage") + f"ctorch\n{_DTYPE_STORAGE[dtype]}\n".encode() + _str(key) + _str("cpu")
               + _int(numel) + b"tQ")
    out.append(_int(0) + _tuple(shape) + _tuple(strides) + b"\x89" + b"ccollections\nOrderedDict\n)R" + b"tR")


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _int(v: int) -> bytes:
    return b"J" + struct.pack("<i", v) if -(1 << 31) <= v < 1 << 31 else b"\x8a\x08" + struct.pack("<q", v)


def _tuple(values) -> bytes:
    return b"(" + b"".join(_int(int(v)) for v in values) + b"t"


def save_pt(path: str | os.PathLike, obj: np.ndarray | Mapping[str, np.ndarray]) -> Path:
    """Write one array, or a {name: array} state dict, as a torch zip checkpoint (atomically).
    Arrays: float64/32/16, int64/32/16/8, uint8 or bool, any shape."""
    path = Path(path)
    items = [("", obj)] if isinstance(obj, np.ndarray) else list(obj.items())
    arrays = []
    ops = [b"\x80\x02"] + ([b"}(" ] if not isinstance(obj, np.ndarray) else [])
    for i, (name, arr) in enumerate(items):
        arr = np.ascontiguousarray(arr)
        if arr.dtype.newbyteorder("<") not in _NUMPY_TO_DTYPE:
            raise ValueError(f"tensor {name!r}: dtype {arr.dtype} cannot be saved")
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        if name:
            ops.append(_str(name))
        _pickle_tensor(ops, str(i), _NUMPY_TO_DTYPE[arr.dtype], arr.shape)
        arrays.append(arr)
    ops.append(b"u." if not isinstance(obj, np.ndarray) else b".")
    from .output import atomic_output  # late: output imports the gguf writer, not needed for reading

    with atomic_output(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"".join(ops))
        z.writestr("archive/byteorder", b"little")
        for i, arr in enumerate(arrays):
            info = zipfile.ZipInfo(f"archive/data/{i}", date_time=(1980, 1, 1, 0, 0, 0))
            fixed = 30 + len(info.filename.encode()) + 4  # local header + name + extra field's own header
            pad = -(z.fp.tell() + fixed) % _ALIGN
            info.extra = struct.pack("<HH", 0x4246, pad) + bytes(pad)
            z.writestr(info, arr.tobytes())
        z.writestr("archive/version", b"3\n")
    return path
