"""safetensors reader (no dependency on the safetensors package): header parsed and checked, data read lazily.

Layout: header length u64 little-endian, a JSON object of that many bytes
({name: {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, "__metadata__": {...}}),
then the data; offsets are relative to the end of the header. Everything that could make a later read fail or
misread (offsets outside the file, a byte count that does not match dtype x shape, overlapping tensors) is
found here, when the file is opened, and reported as a ModelFileError naming the file and the tensor.
"""
from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

from ..errors import ModelFileError
from ..outfile import atomic_output
from .source import DTYPES, SourceTensor, file_size

MAX_HEADER_BYTES = 100 << 20  # the format's own limit


def _fail(path: Path, problem: str) -> ModelFileError:
    return ModelFileError(f"{path}: {problem}")


def parse_json(text: str | bytes):
    """json.loads, with the two failures it reports outside JSONDecodeError (a RecursionError for nesting
    deeper than the parser's stack, a ValueError for an integer past Python's digit limit) turned into a
    ValueError with a short message. Any problem is a ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("arrays or objects nested too deeply") from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()  # Python 3.10.7+
        raise ValueError(f"an integer with more than {limit} digits") from None


def _header(path: Path) -> tuple[dict, int, int]:
    """(header dict, data section start, file size)."""
    size = file_size(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _fail(path, f"not a safetensors file: {size} bytes, too short for a header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise _fail(path, f"not a safetensors file or truncated: header of {n} bytes, file of {size}")
        raw = fh.read(n)
    try:
        header = parse_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _fail(path, f"safetensors header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise _fail(path, "safetensors header is not a JSON object")
    return header, 8 + n, size


def _tensor(path: Path, name: str, info, data_start: int, size: int) -> SourceTensor:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise _fail(path, f"tensor {name!r}: header entry needs dtype, shape and data_offsets, got {info!r}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in DTYPES:
        raise _fail(path, f"tensor {name!r}: dtype {dtype!r} is not supported ({', '.join(DTYPES)})")
    if (not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        raise _fail(path, f"tensor {name!r}: bad shape {shape!r} or data_offsets {offsets!r}")
    t = SourceTensor(name, dtype, tuple(shape), path, offset=data_start + offsets[0])
    if offsets[1] - offsets[0] != t.nbytes:
        raise _fail(path, f"tensor {name!r}: {offsets[1] - offsets[0]} bytes stored, {dtype} {tuple(shape)} "
                          f"needs {t.nbytes}")
    if data_start + offsets[1] > size:
        raise _fail(path, f"file is truncated: tensor {name!r} needs bytes up to {data_start + offsets[1]}, "
                          f"the file has {size}")
    return t


def read_safetensors(path: str | os.PathLike) -> dict[str, SourceTensor]:
    """The tensors of one safetensors file, in header order, as lazy SourceTensors."""
    path = Path(path)
    header, data_start, size = _header(path)
    tensors = {name: _tensor(path, name, info, data_start, size)
               for name, info in header.items() if name != "__metadata__"}
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise _fail(path, f"tensors {a!r} and {b!r} overlap in the data section")
    return tensors


def write_safetensors(path: str | os.PathLike, tensors: dict[str, tuple[str, np.ndarray]],
                      metadata: dict[str, str] | None = None) -> Path:
    """Write {name: (dtype, numpy array of raw values)} as a safetensors file (tests and benchmarks make
    checkpoints with it). BF16 arrays are given as uint16 bit patterns. Data is written one tensor at a time, to
    a temporary file renamed into place once complete (outfile.atomic_output)."""
    path = Path(path)
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, (dtype, arr) in tensors.items():
        if np.dtype(arr.dtype) != DTYPES[dtype]:
            raise ValueError(f"tensor {name!r}: {dtype} needs a {DTYPES[dtype]} array, got {arr.dtype}")
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned, as the reference writer does
    with atomic_output(path) as tmp, open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for _, arr in tensors.values():
            fh.write(np.ascontiguousarray(arr).data)
    return path
