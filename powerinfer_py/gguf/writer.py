"""GGUF / PWRI writer: metadata and raw tensors into a file that appears only when it is complete.

The byte layout is exactly what gguf.GGUFWriter produces (tests compare the two byte for byte). We serialise
it ourselves because GGUFWriter cannot express everything a faithful copy of a file needs (empty arrays,
empty strings, the order of keys: it always puts general.architecture first) and packs array items one by one
in Python, which is slow for 262144-token vocabularies. Shapes still go through gguf's own
quant_shape_from_byte_shape, so a quantized tensor's ne is what the gguf package would write.

Metadata values are typed by `types` (key -> (GGUFValueType, element type or None), as GGUFFile.metadata_types
gives them) or inferred: bool -> BOOL, int -> UINT32 if it fits else INT64, float -> FLOAT32, str -> STRING,
lists of those -> ARRAY (numpy arrays by their dtype).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_from_byte_shape

from ..outfile import atomic_output, check_free_space
from .reader import _SCALARS, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGICS
from .types import Tensor

VERSION = 3
MAX_NAME_BYTES = 63  # llama.cpp keeps tensor names in 64-byte buffers with a terminating zero

ValueTypes = tuple[GGUFValueType, "GGUFValueType | None"]
_NUMPY_TYPES = {np.dtype(dt).kind + str(np.dtype(dt).itemsize): vt for vt, (_, dt) in _SCALARS.items()
                if vt != GGUFValueType.BOOL}
_NUMPY_TYPES["f8"] = GGUFValueType.FLOAT32  # float64 data is written as FLOAT32 unless typed otherwise


def _infer_scalar(value: Any) -> GGUFValueType:
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, np.generic) and value.dtype.kind in "iuf":
        return _NUMPY_TYPES[value.dtype.kind + str(value.dtype.itemsize)]
    if isinstance(value, int):
        return GGUFValueType.UINT32 if 0 <= value < 1 << 32 else GGUFValueType.INT64
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, (str, bytes)):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return GGUFValueType.ARRAY
    raise TypeError(f"cannot store a {type(value).__name__} in GGUF metadata")


def _infer_element(values: Any) -> GGUFValueType:
    """The element type of a list (or numpy array) whose type was not given."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "b":
            return GGUFValueType.BOOL
        if values.dtype.kind in "iuf":
            return _NUMPY_TYPES[values.dtype.kind + str(values.dtype.itemsize)]
        values = values.tolist()
    kinds = {_infer_scalar(v) for v in values}
    if not kinds:
        return GGUFValueType.UINT32
    if len(kinds) == 1 and GGUFValueType.UINT32 not in kinds:
        return kinds.pop()
    if kinds <= {GGUFValueType.UINT32, GGUFValueType.INT64}:
        return GGUFValueType.UINT32 if kinds == {GGUFValueType.UINT32} else GGUFValueType.INT64
    if kinds <= {GGUFValueType.UINT32, GGUFValueType.INT64, GGUFValueType.FLOAT32}:
        return GGUFValueType.FLOAT32
    raise TypeError(f"a GGUF array holds one type, got {sorted(k.name for k in kinds)}")


def _string(value: str | bytes) -> bytes:
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _scalar_array(values: Any, sub: GGUFValueType) -> bytes:
    dtype = _SCALARS[sub][1]
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"expected a flat list, got shape {arr.shape}")
    if sub == GGUFValueType.BOOL or dtype.kind == "f":
        return arr.astype(dtype).tobytes()
    if arr.size and (arr.dtype.kind not in "iub" or arr.min() < np.iinfo(dtype).min
                     or arr.max() > np.iinfo(dtype).max):
        raise ValueError(f"values do not fit in {sub.name}")
    return arr.astype(dtype).tobytes()


def _encode_value(value: Any, vtype: GGUFValueType, sub: GGUFValueType | None) -> bytes:
    """The bytes of one value (without its type tag, which the caller writes)."""
    if vtype in _SCALARS:
        if vtype == GGUFValueType.BOOL:
            return b"\x01" if value else b"\x00"
        if vtype not in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) and not isinstance(value, (int, np.integer)):
            raise ValueError(f"{vtype.name} needs an integer, got {value!r}")
        return _SCALARS[vtype][0].pack(value)
    if vtype == GGUFValueType.STRING:
        if not isinstance(value, (str, bytes)):
            raise ValueError(f"STRING needs a str, got {type(value).__name__}")
        return _string(value)
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise ValueError(f"ARRAY needs a list, got {type(value).__name__}")
    sub = _infer_element(value) if sub is None else GGUFValueType(sub)
    head = struct.pack("<IQ", sub, len(value))
    if sub in _SCALARS:
        return head + _scalar_array(value, sub)
    if sub == GGUFValueType.STRING:
        if not all(isinstance(v, (str, bytes)) for v in value):
            raise ValueError("a STRING array holds only strings")
        return head + b"".join(_string(v) for v in value)
    # Nested arrays: each element carries its own element type, inferred from its values.
    return head + b"".join(_encode_value(v, GGUFValueType.ARRAY, None) for v in value)


def _encode_metadata(metadata: Mapping[str, Any], types: Mapping[str, ValueTypes]) -> bytes:
    out = []
    for key, value in metadata.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"metadata keys are non-empty strings, got {key!r}")
        vtype, sub = types[key] if key in types else (_infer_scalar(value), None)
        vtype = GGUFValueType(vtype)
        try:
            out.append(_string(key) + struct.pack("<I", vtype) + _encode_value(value, vtype, sub))
        except (ValueError, TypeError, OverflowError, struct.error) as e:
            raise ValueError(f"metadata key {key!r} ({vtype.name}): {e}") from None
    return b"".join(out)


def _resolve_alignment(metadata: dict[str, Any], alignment: int | None) -> int:
    meta_align = metadata.get(ALIGNMENT_KEY)
    if alignment is None:
        alignment = DEFAULT_ALIGNMENT if meta_align is None else int(meta_align)
    elif meta_align is not None and int(meta_align) != alignment:
        raise ValueError(f"alignment={alignment} disagrees with metadata {ALIGNMENT_KEY}={meta_align}")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of two, got {alignment}")
    if alignment != DEFAULT_ALIGNMENT and meta_align is None:
        metadata[ALIGNMENT_KEY] = alignment  # readers find a non-default alignment only through this key
    return alignment


def tensor_info_bytes(name: str, ggml_type: GGMLQuantizationType, shape: tuple[int, ...], offset: int) -> bytes:
    """One tensor info record: name, n_dims, ne (ne0 first), type, offset. `shape` in numpy order (elements)."""
    raw = name.encode("utf-8")
    if not raw or len(raw) > MAX_NAME_BYTES:
        raise ValueError(f"tensor name {name!r} must be 1 to {MAX_NAME_BYTES} bytes")
    if not 1 <= len(shape) <= 4:
        raise ValueError(f"tensor {name!r}: {len(shape)} dimensions, GGUF allows 1 to 4")
    ne = tuple(int(s) for s in reversed(shape))
    return (_string(raw) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
            + struct.pack("<IQ", ggml_type, offset))


def tensor_nbytes(ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` (numpy order) and type; the last dim must be a whole number of blocks."""
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    if shape and shape[-1] % block_size:
        raise ValueError(f"{ggml_type.name} needs rows of a multiple of {block_size} elements, got shape {shape}")
    return int(np.prod(shape, dtype=np.int64)) // block_size * type_size


def _tensor_info(t: Tensor, offset: int) -> bytes:
    """The info record of `t`, after checking that its data holds exactly a t.type tensor of t.shape
    (ne comes from gguf's byte-shape rule for block types)."""
    data = t.data
    if data.dtype == np.uint8:
        shape = quant_shape_from_byte_shape(data.shape, t.type)
    else:
        shape = data.shape
    if tuple(shape) != tuple(t.shape):
        raise ValueError(f"tensor {t.name!r}: data of shape {data.shape} ({data.dtype}) does not hold a "
                         f"{t.type.name} tensor of shape {t.shape}")
    block_size, type_size = GGML_QUANT_SIZES[t.type]
    n_elems = int(np.prod(t.shape))
    if data.nbytes != n_elems // block_size * type_size:
        raise ValueError(f"tensor {t.name!r}: {data.nbytes} bytes of data, {t.type.name} {t.shape} needs "
                         f"{n_elems // block_size * type_size}")
    return tensor_info_bytes(t.name, t.type, tuple(shape), offset)


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def _write_data(fh, t: Tensor, alignment: int) -> None:
    flat = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
    fh.write(flat.data)
    fh.write(bytes(_pad(flat.nbytes, alignment)))


def build_header(magic: str, metadata: Mapping[str, Any], types: Mapping[str, ValueTypes],
                 infos: list[bytes], alignment: int) -> bytes:
    """The header up to the data section: magic, version, counts, key/values, tensor infos, padding.
    `infos` are tensor_info_bytes records whose offsets come from `data_layout`. Used by write_gguf and by
    writers that stream the data section (powerinfer_py.convert)."""
    head = struct.pack("<4sIQQ", magic.encode("ascii"), VERSION, len(infos), len(metadata))
    head += _encode_metadata(metadata, types) + b"".join(infos)
    return head + bytes(_pad(len(head), alignment))


def data_layout(nbytes: Iterable[int], alignment: int) -> list[int]:
    """Offsets (relative to the data section) of tensors of the given byte sizes, each padded to alignment."""
    offsets, offset = [], 0
    for n in nbytes:
        offsets.append(offset)
        offset += n + _pad(n, alignment)
    return offsets


def _build_header(magic: str, metadata: dict, types: Mapping, tensors: list[Tensor], alignment: int) -> bytes:
    offsets = data_layout((t.data.nbytes for t in tensors), alignment)
    infos = [_tensor_info(t, off) for t, off in zip(tensors, offsets)]
    return build_header(magic, metadata, types, infos, alignment)


def write_gguf(path: str | os.PathLike, metadata: Mapping[str, Any], tensors: Iterable[Tensor] | Mapping[str, Tensor],
               *, types: Mapping[str, ValueTypes] | None = None, magic: str = "GGUF",
               alignment: int | None = None) -> Path:
    """Write a GGUF (or, with magic="PWRI", PowerInfer) file atomically and return its path.

    The file is written to a temporary name in the target folder and renamed into place only when complete;
    on any error (KeyboardInterrupt included) the temporary file is removed and the target is untouched.
    `alignment` defaults to metadata's general.alignment, else 32.
    """
    path = Path(path)
    if magic not in MAGICS:
        raise ValueError(f"magic must be one of {MAGICS}, got {magic!r}")
    metadata = dict(metadata)
    tensor_list = list(tensors.values()) if isinstance(tensors, Mapping) else list(tensors)
    names = [t.name for t in tensor_list]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"duplicate tensor name {dup!r}")
    alignment = _resolve_alignment(metadata, alignment)
    header = _build_header(magic, metadata, types or {}, tensor_list, alignment)

    # no margin: small files (a tokenizer's vocab-only copy) must still be written on a nearly full disk
    check_free_space(path, len(header) + sum(t.data.nbytes + _pad(t.data.nbytes, alignment) for t in tensor_list),
                     margin=0)
    with atomic_output(path) as tmp, open(tmp, "wb") as fh:
        fh.write(header)
        for t in tensor_list:
            _write_data(fh, t, alignment)
    return path

