"""GGUF / PWRI reader: one read-only memory map, metadata as Python values, tensors as zero-copy views.

Layout (all little-endian): magic[4] ("GGUF", or "PWRI" for a PowerInfer sparse model), version u32 (2 or 3),
tensor count u64, key/value count u64, the key/values, the tensor infos (name, n_dims u32, ne[n_dims] u64 with
ne0 contiguous, type u32, offset u64 relative to the data section), padding to `general.alignment` (default 32),
then the data section.

We parse it ourselves rather than through gguf.GGUFReader: that reader rejects the PWRI magic, takes seconds on
a 262144-token vocabulary, and fails with numpy/struct exceptions on corrupt files. Every problem here becomes a
ModelFileError that names the file, what was being read and what is wrong.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import ModelFileError
from .types import Tensor

MAGICS = ("GGUF", "PWRI")
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
# Arrays of arrays: real files nest one or two levels; a deeper chain would only exhaust Python's stack.
MAX_ARRAY_DEPTH = 16

# Fixed-size scalar value types: struct format and numpy dtype (for arrays).
_SCALARS: dict[GGUFValueType, tuple[struct.Struct, np.dtype]] = {
    GGUFValueType.UINT8: (struct.Struct("<B"), np.dtype("<u1")),
    GGUFValueType.INT8: (struct.Struct("<b"), np.dtype("<i1")),
    GGUFValueType.UINT16: (struct.Struct("<H"), np.dtype("<u2")),
    GGUFValueType.INT16: (struct.Struct("<h"), np.dtype("<i2")),
    GGUFValueType.UINT32: (struct.Struct("<I"), np.dtype("<u4")),
    GGUFValueType.INT32: (struct.Struct("<i"), np.dtype("<i4")),
    GGUFValueType.FLOAT32: (struct.Struct("<f"), np.dtype("<f4")),
    GGUFValueType.BOOL: (struct.Struct("<B"), np.dtype("<u1")),
    GGUFValueType.UINT64: (struct.Struct("<Q"), np.dtype("<u8")),
    GGUFValueType.INT64: (struct.Struct("<q"), np.dtype("<i8")),
    GGUFValueType.FLOAT64: (struct.Struct("<d"), np.dtype("<f8")),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, kv count: 24 bytes


@dataclass
class GGUFFile:
    """An open GGUF or PWRI file. Tensors are views on one read-only memory map (`_mmap`, seen as the uint8
    array `_map`); close() drops our references."""

    path: Path
    magic: str
    version: int
    alignment: int
    file_size: int
    metadata: dict[str, Any]
    metadata_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]]
    tensors: dict[str, Tensor] = field(default_factory=dict)
    #: absolute file offset of each tensor's first byte; data_offset: where the data section starts
    tensor_offsets: dict[str, int] = field(default_factory=dict)
    data_offset: int = 0
    _map: np.ndarray | None = field(default=None, repr=False)
    _mmap: mmap.mmap | None = field(default=None, repr=False)

    @property
    def is_sparse(self) -> bool:
        return self.magic == "PWRI"

    @property
    def arch(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def release_pages(self, name: str) -> None:
        """Tell the kernel we no longer need the pages of one tensor (after converting it), so they stop
        counting in our resident memory. The view stays valid: touching it again reads the file back in."""
        mm = self._mmap
        if mm is None or name not in self.tensor_offsets or not hasattr(mm, "madvise"):
            return
        start = self.tensor_offsets[name]
        end = start + self.tensors[name].nbytes
        page = mmap.PAGESIZE
        start, end = -(-start // page) * page, end // page * page
        if end > start:
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        """Drop our references to the map; the OS unmaps it once no tensor view is alive."""
        self.tensors = {}
        self._map = self._mmap = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Parser:
    """Sequential reader over the mapped bytes that knows what it is reading, for error messages."""

    def __init__(self, buf: memoryview, path: Path, size: int):
        self.buf = buf
        self.path = path
        self.size = size
        self.off = 0
        self.what = "the header"
        self.depth = 0  # arrays currently open (nested arrays recurse through value())

    def fail(self, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {problem} (while reading {self.what})")

    def need(self, n: int) -> None:
        if n < 0 or self.off + n > self.size:
            raise self.fail(f"truncated file: need {n} bytes at offset {self.off} but the file has "
                            f"{self.size} bytes")

    def scalar(self, st: struct.Struct):
        self.need(st.size)
        (v,) = st.unpack_from(self.buf, self.off)
        self.off += st.size
        return v

    def count(self, what: str, min_item_bytes: int) -> int:
        n = self.scalar(_U64)
        if n * min_item_bytes > self.size - self.off:
            raise self.fail(f"truncated or corrupt file: {what} {n} needs at least {n * min_item_bytes} bytes "
                            f"but only {self.size - self.off} remain")
        return n

    def string(self) -> str:
        n = self.scalar(_U64)
        if n > self.size - self.off:
            raise self.fail(f"string length {n} at offset {self.off - 8} runs past the end of the file "
                            f"({self.size} bytes)")
        s = str(self.buf[self.off:self.off + n], "utf-8", "surrogateescape")
        self.off += n
        return s

    def value_type(self) -> GGUFValueType:
        t = self.scalar(_U32)
        try:
            return GGUFValueType(t)
        except ValueError:
            raise self.fail(f"unknown value type {t}") from None

    def value(self, vtype: GGUFValueType) -> tuple[Any, GGUFValueType | None]:
        """One value of `vtype`; returns (value, array element type or None)."""
        if vtype in _SCALARS:
            v = self.scalar(_SCALARS[vtype][0])
            return (bool(v) if vtype == GGUFValueType.BOOL else v), None
        if vtype == GGUFValueType.STRING:
            return self.string(), None
        sub = self.value_type()  # vtype is ARRAY
        return self.array(sub), sub

    def array(self, sub: GGUFValueType) -> list:
        if sub in _SCALARS:
            dtype = _SCALARS[sub][1]
            n = self.count("array length", dtype.itemsize)
            arr = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.off)
            self.off += n * dtype.itemsize
            return arr.astype(bool).tolist() if sub == GGUFValueType.BOOL else arr.tolist()
        if sub == GGUFValueType.STRING:
            return self.string_array(self.count("string array length", 8))
        n = self.count("nested array length", 12)  # each element: type u32 + count u64
        if self.depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"arrays nested more than {MAX_ARRAY_DEPTH} deep at offset {self.off}")
        self.depth += 1
        try:
            return [self.value(GGUFValueType.ARRAY)[0] for _ in range(n)]
        finally:
            self.depth -= 1

    def string_array(self, n: int) -> list[str]:
        # The hot loop for 262144-token vocabularies: locals only, no method calls per item.
        buf, off, size, unpack = self.buf, self.off, self.size, _U64.unpack_from
        out = [""] * n
        for i in range(n):
            if off + 8 > size:
                self.off = off
                raise self.fail(f"truncated file in string {i} of {n}")
            (ln,) = unpack(buf, off)
            off += 8
            if ln > size - off:
                self.off = off
                raise self.fail(f"string {i} of {n} has length {ln}, past the end of the file ({size} bytes)")
            out[i] = str(buf[off:off + ln], "utf-8", "surrogateescape")
            off += ln
        self.off = off
        return out


def _checked_size(path: Path) -> int:
    """The size of a regular file big enough for a GGUF header, or a ModelFileError saying what it is not."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ModelFileError(f"{path}: not a regular file")
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read: {e.strerror or e}") from None
    if size < _HEADER.size:
        raise ModelFileError(f"{path}: not a GGUF file: only {size} bytes, a GGUF header needs {_HEADER.size}")
    return size


def _open_map(path: Path) -> tuple[mmap.mmap, int]:
    size = _checked_size(path)
    try:
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: cannot map the file: {e}") from None
    return mm, size


def _parse_header(p: _Parser) -> tuple[str, int, int, int]:
    raw_magic, version, n_tensors, n_kv = _HEADER.unpack_from(p.buf, 0)
    p.off = _HEADER.size
    magic = raw_magic.decode("latin-1")
    if magic not in MAGICS:
        raise ModelFileError(f"{p.path}: not a GGUF file: magic {raw_magic!r}, expected b'GGUF' or b'PWRI'")
    if version not in VERSIONS:
        hint = " (a big-endian file?)" if version >= 1 << 16 else ""
        raise ModelFileError(f"{p.path}: unsupported GGUF version {version}{hint}; supported: 2 and 3")
    # Counts that could not fit even in the whole file are corrupt; smaller ones that run past the end are
    # reported as truncation where the bytes run out, which names what was being read.
    if n_kv > p.size:
        raise ModelFileError(f"{p.path}: corrupt header: key/value count {n_kv} for a file of {p.size} bytes")
    if n_tensors > p.size:
        raise ModelFileError(f"{p.path}: corrupt header: tensor count {n_tensors} for a file of {p.size} bytes")
    return magic, version, n_tensors, n_kv


def _parse_metadata(p: _Parser, n_kv: int) -> tuple[dict, dict]:
    metadata: dict[str, Any] = {}
    types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
    for i in range(n_kv):
        p.what = f"the key of key/value {i}"
        key = p.string()
        p.what = f"key/value {i} ({key!r})"
        if key in metadata:
            raise p.fail(f"duplicate metadata key {key!r}")
        vtype = p.value_type()
        value, sub = p.value(vtype)
        metadata[key] = value
        types[key] = (vtype, sub)
    return metadata, types


def _alignment(p: _Parser, metadata: dict, types: dict) -> int:
    if ALIGNMENT_KEY not in metadata:
        return DEFAULT_ALIGNMENT
    value, (vtype, _) = metadata[ALIGNMENT_KEY], types[ALIGNMENT_KEY]
    ok = vtype not in (GGUFValueType.STRING, GGUFValueType.ARRAY, GGUFValueType.BOOL,
                       GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)
    if not ok or value <= 0 or value & (value - 1):
        raise ModelFileError(f"{p.path}: {ALIGNMENT_KEY} must be a positive power of two, got {value!r}")
    return int(value)


def _tensor_type(p: _Parser, type_id: int, name: str) -> GGMLQuantizationType:
    try:
        ggml_type = GGMLQuantizationType(type_id)
    except ValueError:
        ggml_type = None
    if ggml_type is None or ggml_type not in GGML_QUANT_SIZES:
        raise p.fail(f"unknown tensor type id {type_id} for tensor {name!r}")
    return ggml_type


def _parse_tensor_infos(p: _Parser, n_tensors: int, alignment: int, allow_empty: bool = False) -> list[tuple]:
    """Returns [(name, type, shape numpy order, relative offset, nbytes)] in file order. allow_empty: accept
    zero-length dimensions (a .gpuidx sidecar's empty gpu_bucket); model files never have them."""
    infos = []
    seen: set[str] = set()
    for i in range(n_tensors):
        p.what = f"the name of tensor info {i}"
        name = p.string()
        p.what = f"tensor info {i} ({name!r})"
        if name in seen:
            raise p.fail(f"duplicate tensor name {name!r}")
        seen.add(name)
        n_dims = p.scalar(_U32)
        if not 1 <= n_dims <= MAX_DIMS:
            raise p.fail(f"tensor {name!r} has {n_dims} dimensions; 1 to {MAX_DIMS} are allowed")
        p.need(8 * n_dims)
        ne = struct.unpack_from(f"<{n_dims}q", p.buf, p.off)
        p.off += 8 * n_dims
        if any(d < 0 or (d == 0 and not allow_empty) for d in ne):
            raise p.fail(f"tensor {name!r} has a zero or negative dimension: ne={list(ne)}")
        ggml_type = _tensor_type(p, p.scalar(_U32), name)
        offset = p.scalar(_U64)
        block_size, type_size = GGML_QUANT_SIZES[ggml_type]
        if ne[0] % block_size:
            raise p.fail(f"tensor {name!r}: row length {ne[0]} is not a multiple of the {ggml_type.name} "
                         f"block size {block_size}")
        n_elems = 1
        for d in ne:
            n_elems *= d
        if offset % alignment:
            raise p.fail(f"tensor {name!r}: data offset {offset} is not a multiple of the alignment {alignment}")
        infos.append((name, ggml_type, tuple(reversed(ne)), offset, n_elems // block_size * type_size))
    return infos


def _check_layout(path: Path, infos: list[tuple], data_offset: int, size: int) -> None:
    """Every tensor lies inside the file and no two tensors share bytes."""
    for name, _, _, offset, nbytes in infos:
        end = data_offset + offset + nbytes
        if end > size:
            raise ModelFileError(f"{path}: tensor {name!r} data ends at byte {end}, past the end of the file "
                                 f"({size} bytes): the file is truncated or the offset is wrong")
    spans = sorted((offset, offset + nbytes, name) for name, _, _, offset, nbytes in infos)
    for (_, end_a, name_a), (start_b, _, name_b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise ModelFileError(f"{path}: tensors {name_a!r} and {name_b!r} overlap in the data section "
                                 f"({name_b!r} starts at {start_b}, {name_a!r} ends at {end_a})")


def _mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where the system does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_whole(path: Path) -> tuple[np.ndarray, int]:
    """The file's bytes in anonymous memory (open_gguf with use_mmap=False), read in chunks. A file larger than
    the memory the system has available is refused up front (a map would page it in and out instead)."""
    size = _checked_size(path)  # the same checks and messages as a mapped open (missing, not a file, tiny)
    avail = _mem_available()
    if avail is not None and size > avail:
        raise ModelFileError(f"{path}: reading it into memory (--no-mmap) needs {size / 2**30:.1f} GiB and the "
                             f"system has {avail / 2**30:.1f} GiB available: map it instead (without --no-mmap)")
    arr = np.empty(size, dtype=np.uint8)
    view, done = memoryview(arr), 0
    try:
        with open(path, "rb") as fh:
            while done < size:
                n = fh.readinto(view[done:done + (64 << 20)])
                if not n:
                    raise ModelFileError(f"{path}: the file ended at byte {done} while reading it ({size} bytes "
                                         "when it was opened): was it changed meanwhile?")
                done += n
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the file: {e.strerror or e}") from None
    arr.flags.writeable = False  # as the read-only map: kernels never write into the weights
    return arr, size


def _parse(path: Path, with_tensors: bool, allow_empty: bool = False, use_mmap: bool = True) -> GGUFFile:
    if use_mmap or not with_tensors:
        mm, size = _open_map(path)
        # A read-only uint8 array over the whole file; tensor views are slices of it and keep the map alive.
        arr = np.frombuffer(mm, dtype=np.uint8)
    else:
        (arr, size), mm = _read_whole(path), None
    p = _Parser(memoryview(arr), path, size)
    magic, version, n_tensors, n_kv = _parse_header(p)
    metadata, types = _parse_metadata(p, n_kv)
    alignment = _alignment(p, metadata, types)
    f = GGUFFile(path, magic, version, alignment, size, metadata, types, _map=arr, _mmap=mm)
    if not with_tensors:
        return f
    infos = _parse_tensor_infos(p, n_tensors, alignment, allow_empty)
    data_offset = -(-p.off // alignment) * alignment
    if n_tensors and data_offset > size:
        raise ModelFileError(f"{path}: the data section would start at byte {data_offset}, past the end of "
                             f"the file ({size} bytes)")
    _check_layout(path, infos, data_offset, size)
    f.data_offset = data_offset
    for name, ggml_type, shape, offset, nbytes in infos:
        start = data_offset + offset
        f.tensors[name] = Tensor.from_bytes(name, ggml_type, shape, arr[start:start + nbytes])
        f.tensor_offsets[name] = start
    return f


def open_gguf(path: str | os.PathLike, *, allow_empty: bool = False, use_mmap: bool = True) -> GGUFFile:
    """Open a GGUF or PWRI file: parse and validate the header, map the tensors without copying.
    allow_empty: accept tensors with a zero-length dimension (placement sidecars). use_mmap=False reads the
    whole file into anonymous memory instead (llama.cpp's --no-mmap): RAM for all of it and a slower start,
    but on some machines the kernels read such memory faster than mapped page-cache pages
    (benchmarks/bench_mmap_vs_anon.py); release_pages does nothing then."""
    return _parse(Path(path), with_tensors=True, allow_empty=allow_empty, use_mmap=use_mmap)


def read_metadata_only(path: str | os.PathLike) -> GGUFFile:
    """Header and key/values only (no tensor infos, `tensors` empty): for the tokenizer and quick looks."""
    return _parse(Path(path), with_tensors=False)
