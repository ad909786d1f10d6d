"""torch .pt / .bin files without torch, and without running or trusting anything from them.

A torch.save file (torch >= 1.6) is a zip archive with one top-level folder: `<folder>/data.pkl` (a pickle of
the saved object), `<folder>/data/<key>` (raw storages, little-endian), `<folder>/byteorder`, `version`. In the
pickle a tensor is `torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
backward_hooks)` where `storage` comes from a persistent id ("storage", torch.<T>Storage, key, location, numel).

Plain unpickling executes whatever callables the pickle names, so a downloaded checkpoint could run any code.
torch_pickle.load_pickle loads data.pkl with a scanned, restricted unpickler that runs nothing and hands the
pickle nothing it can modify; tensors come out of it as inert records. `_finish` then turns each record into a
SourceTensor made from the record's fields only, once they are validated against the archive: the tensor reads
only its own member `data/<key>` of this zip, within that member, with a dtype we know and sizes/strides that
neither repeat nor overlap elements (a stride-0 "tensor" of 1 GiB backed by 4 bytes is refused, not
materialised). Tensor bytes are read when converted, and only the range the tensor covers; a compressed member
may inflate at most _BOMB_RATIO:1 (beyond _BOMB_FLOOR), and the pickle itself is at most _MAX_PICKLE_BYTES.

Every failure is a ModelFileError naming the file (MemoryError, RecursionError and the errors the zip/pickle
machinery raises on garbage included), with a short message that repr()s nothing from the file.

`save_pt` writes the same layout (the `activation_N.pt` statistics files), readable by torch.load.
"""
from __future__ import annotations

import os
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from .source import DTYPES, SourceTensor
from .torch_pickle import STORAGE_TYPES, Refused, StateDict, TensorRecord, clip, describe, kind, load_pickle

_DTYPE_STORAGE = {v: k for k, v in STORAGE_TYPES.items()}
_NUMPY_TO_DTYPE = {np.dtype(v): k for k, v in DTYPES.items() if k != "BF16"}
_MAX_PICKLE_BYTES = 256 << 20  # data.pkl of a state dict: ~100 bytes per tensor
_MAX_DEPTH = 64  # nesting of dicts/lists/tuples around tensors (a state dict needs 1)
_BOMB_RATIO, _BOMB_FLOOR = 100, 16 << 20  # a compressed member may inflate 100:1, or to 16 MiB at any ratio


# ---- the archive, and records -> SourceTensors ------------------------------------------------------------

class _Archive:
    """The open zip: checked member lookup, absolute data offsets of uncompressed members, bounded reads."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.size = os.stat(path).st_size
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise ModelFileError(f"{path}: not a torch zip checkpoint ({describe(e)}); legacy non-zip .pt files "
                                 "are not supported") from None
        except (ValueError, struct.error, EOFError, OverflowError, zipfile.LargeZipFile, NotImplementedError) as e:
            raise ModelFileError(f"{path}: corrupt zip archive ({describe(e)})") from None
        self.starts: dict[str, int] = {}  # member name -> absolute offset of its bytes (uncompressed members)
        pkls = [n for n in self.zip.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            self.zip.close()
            raise ModelFileError(f"{path}: expected one <folder>/data.pkl in the archive, found {len(pkls)}")
        self.prefix = pkls[0][: -len("data.pkl")]

    def close(self) -> None:
        self.zip.close()

    def read_small(self, name: str, limit: int) -> bytes:
        """A whole member (the pickle, the byteorder record) of at most `limit` bytes once inflated."""
        info = self.zip.getinfo(name)
        self.check(info)
        if info.file_size > limit:
            raise ModelFileError(f"{self.path}: {clip(name)} is {info.file_size} bytes, more than the "
                                 f"{limit} this reader accepts")
        return self.zip.read(info)

    def byteorder(self) -> None:
        name = self.prefix + "byteorder"
        if name in self.zip.NameToInfo:
            order = self.read_small(name, 64).decode("ascii", "replace").strip()
            if order != "little":
                raise UnsupportedError(f"{self.path}: byteorder {clip(order, 20)!r}; only little-endian files "
                                       "are supported")

    def check(self, info: zipfile.ZipInfo) -> int | None:
        """Check that a member lies inside the file and does not inflate like a zip bomb; return the absolute
        offset of its bytes when it is stored uncompressed, else None."""
        name = info.filename
        if info.flag_bits & 0x1:
            raise UnsupportedError(f"{self.path}: {clip(name)} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            if info.file_size > max(_BOMB_FLOOR, _BOMB_RATIO * info.compress_size):
                raise ModelFileError(f"{self.path}: {clip(name)} inflates from {info.compress_size} to "
                                     f"{info.file_size} bytes: refusing what looks like a zip bomb")
        elif info.file_size != info.compress_size:
            raise ModelFileError(f"{self.path}: corrupt zip: {clip(name)} is stored with two different sizes")
        start = self.starts.get(name)
        if start is None:
            with open(self.path, "rb") as fh:
                fh.seek(info.header_offset)
                local = fh.read(30)
                if len(local) < 30 or local[:4] != b"PK\x03\x04":
                    raise ModelFileError(f"{self.path}: corrupt zip: bad local header for {clip(name)}")
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
                if fh.read(name_len).decode(encoding, "replace") != info.orig_filename:
                    raise ModelFileError(f"{self.path}: corrupt zip: {clip(name)} has another name in its "
                                         "local header")
            start = self.starts[name] = info.header_offset + 30 + name_len + extra_len
        if start + info.compress_size > self.size:
            raise ModelFileError(f"{self.path}: {clip(name)} reaches past the end of the file (truncated?)")
        return start if info.compress_type == zipfile.ZIP_STORED else None

    def tensor(self, rec: TensorRecord) -> SourceTensor:
        """A SourceTensor for a record, reading only the record's range of its own member (see the module
        docstring for what is refused)."""
        st, path = rec.storage, self.path
        try:
            info = self.zip.getinfo(f"{self.prefix}data/{st.key}")
        except KeyError:
            raise ModelFileError(f"{path}: storage {clip(st.key)!r} named by the pickle is missing from the "
                                 "archive") from None
        itemsize = DTYPES[st.dtype].itemsize  # st.dtype comes from STORAGE_TYPES: always known
        if info.file_size < st.numel * itemsize:
            raise ModelFileError(f"{path}: storage {st.key!r} holds {info.file_size} bytes, {st.numel} "
                                 f"{st.dtype} elements need {st.numel * itemsize} (truncated?)")
        start = self.check(info)
        size, stride = rec.size, rec.stride
        n = _prod(size)
        span = _span(path, size, stride) if n else 0  # elements from the first to the last one it covers
        if rec.offset + span > st.numel:
            raise ModelFileError(f"{path}: tensor of size {size} stride {stride} at offset {rec.offset} "
                                 f"reaches past its storage of {st.numel} elements")
        contiguous = not n or all(d == _prod(size[i + 1:]) for i, (s, d) in enumerate(zip(size, stride)) if s > 1)
        name = f"{st.key}@{rec.offset}"
        if start is not None and contiguous:
            return SourceTensor(name, st.dtype, size, path, offset=start + (rec.offset * itemsize if n else 0))
        first, n_bytes = rec.offset * itemsize, span * itemsize
        read = (_positioned_reader(path, start + first, n_bytes) if start is not None
                else _member_reader(path, info, first, n_bytes))
        dtype = DTYPES[st.dtype]

        def load() -> np.ndarray:
            if not n:
                return np.empty(size, dtype)
            raw = np.frombuffer(read(), dtype=dtype)
            return np.ascontiguousarray(np.lib.stride_tricks.as_strided(raw, size, [s * itemsize for s in stride]))

        return SourceTensor(name, st.dtype, size, path, loader=load)


def _prod(values) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def _span(path: Path, size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """1 + the offset of the tensor's last element from its first, for strides that reach every element at
    its own place: each stride (ascending, dims of size 1 aside) must step past everything the smaller strides
    reach. That refuses stride 0 and overlapping views, which would turn a few stored bytes into a huge array;
    C-order, transposed and sliced tensors pass."""
    reach = 0
    for s, st in sorted(((s, st) for s, st in zip(size, stride) if s > 1), key=lambda d: d[1]):
        if st == 0:
            raise ModelFileError(f"{path}: tensor of size {size} has stride 0 (one stored value repeated "
                                 f"{s} times): refused")
        if st <= reach:
            raise ModelFileError(f"{path}: tensor of size {size} stride {stride} reads some stored elements more "
                                 "than once (overlapping strides): refused")
        reach += (s - 1) * st
    return reach + 1


def _positioned_reader(path: Path, start: int, n_bytes: int):
    def read() -> bytes:
        with open(path, "rb") as fh:
            fh.seek(start)
            raw = fh.read(n_bytes)
        if len(raw) != n_bytes:
            raise ModelFileError(f"{path}: file is truncated: a tensor needs bytes up to {start + n_bytes}, the "
                                 f"file ends at {start + len(raw)}")
        return raw
    return read


def _member_reader(path: Path, info: zipfile.ZipInfo, first: int, n_bytes: int):
    """Bytes first..first+n_bytes of a compressed member, inflating no more than that (plus a chunk)."""
    name, layout = info.filename, (info.header_offset, info.compress_size, info.file_size, info.compress_type)

    def read() -> bytes:
        try:
            with zipfile.ZipFile(path) as z:
                now = z.getinfo(name)
                if (now.header_offset, now.compress_size, now.file_size, now.compress_type) != layout:
                    raise ModelFileError(f"{path}: changed since it was opened ({clip(name)})")
                with z.open(now) as fh:
                    fh.seek(first)
                    raw = fh.read(n_bytes)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError) as e:
            raise ModelFileError(f"{path}: corrupt compressed member {clip(name)} ({describe(e)})") from None
        if len(raw) != n_bytes:
            raise ModelFileError(f"{path}: {clip(name)} ends before the tensor it holds")
        return raw
    return read


_PLAIN = (str, int, float, bool, bytes, type(None))


def _finish(obj: Any, archive: _Archive) -> Any:
    """The loaded object with every TensorRecord turned into a SourceTensor (dicts, lists, tuples and scalars kept,
    StateDict back to an OrderedDict). Shared containers are converted once, so a DAG of shared tuples costs
    its size, not its expansion; cycles, depth beyond _MAX_DEPTH and any other object are refused."""
    done: dict[int, Any] = {}
    active: set[int] = set()

    def walk(o: Any, depth: int) -> Any:
        cls = type(o)
        if cls in _PLAIN:
            return o
        if cls is TensorRecord:
            return archive.tensor(o)
        if cls not in (dict, StateDict, list, tuple):
            raise Refused(f"the pickle holds a {kind(o)}, not tensors, dicts, lists and numbers")
        key = id(o)
        if key in done:
            return done[key]
        if key in active:
            raise Refused("the pickle's objects contain themselves (a cycle)")
        if depth >= _MAX_DEPTH:
            raise Refused(f"the pickle's objects are nested more than {_MAX_DEPTH} deep")
        active.add(key)
        if cls is list or cls is tuple:
            out = cls(walk(v, depth + 1) for v in o)
        else:
            out = (OrderedDict if cls is StateDict else dict)((k, walk(v, depth + 1)) for k, v in o.items())
        active.discard(key)
        done[key] = out
        return out

    return walk(obj, 0)


_CORRUPT = (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, IndexError, KeyError,
            zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error, OverflowError, NotImplementedError,
            OSError)


def read_pt(path: str | os.PathLike) -> Any:
    """Unpickle a torch zip checkpoint safely (see the module docstring): tensors become SourceTensors,
    dicts/lists/tuples/numbers stay as they are. Anything else raises ModelFileError before it runs."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: file not found")
    try:
        archive = _Archive(path)
        try:
            archive.byteorder()
            data = archive.read_small(archive.prefix + "data.pkl", _MAX_PICKLE_BYTES)
            return _finish(load_pickle(data), archive)
        finally:
            archive.close()
    except Refused as e:
        raise ModelFileError(f"{path}: refusing to load: {e}") from None
    except ModelFileError:
        raise
    except MemoryError:
        raise ModelFileError(f"{path}: out of memory while reading the checkpoint's pickle (a corrupt or hostile "
                             "file?)") from None
    except RecursionError:
        raise ModelFileError(f"{path}: the checkpoint's pickle is nested too deeply") from None
    except _CORRUPT as e:
        raise ModelFileError(f"{path}: corrupt pickle in torch checkpoint: {describe(e)}") from None


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
