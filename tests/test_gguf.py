"""GGUF/PWRI reader and writer: round trips, agreement with the gguf package, and a clear error per corruption."""
from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as VT

from powerinfer_py.errors import ModelFileError, PowerInferError
from powerinfer_py.gguf import open_gguf, read_metadata_only, write_gguf
from powerinfer_py.gguf import writer as writer_module
from powerinfer_py.gguf.types import GGMLType, Tensor

rng = np.random.default_rng(1234)


def _quantized(name: str, ggml_type: GGMLType, shape: tuple[int, ...]) -> Tensor:
    x = rng.standard_normal(shape).astype(np.float32)
    return Tensor(name, ggml_type, shape, gguf.quants.quantize(x, ggml_type))


def _raw(name: str, ggml_type: GGMLType, shape: tuple[int, ...]) -> Tensor:
    """Random bytes in the layout of `ggml_type`: the reader and writer must carry them bit for bit."""
    block, size = gguf.GGML_QUANT_SIZES[ggml_type]
    n_bytes = int(np.prod(shape)) // block * size
    return Tensor.from_bytes(name, ggml_type, shape, rng.integers(0, 256, n_bytes, dtype=np.uint8))


def _tensors() -> list[Tensor]:
    return [
        Tensor("norm.weight", GGMLType.F32, (64,), rng.standard_normal(64).astype(np.float32)),
        Tensor("blk.0.f16.weight", GGMLType.F16, (3, 64), rng.standard_normal((3, 64)).astype(np.float16)),
        _raw("blk.0.bf16.weight", GGMLType.BF16, (2, 5, 8)),
        _quantized("blk.0.q8.weight", GGMLType.Q8_0, (4, 64)),
        _quantized("blk.0.q4.weight", GGMLType.Q4_0, (2, 96)),
        _raw("blk.0.q4k.weight", GGMLType.Q4_K, (3, 256)),
    ]


META = {"general.architecture": "llama", "general.name": "tiny", "llama.block_count": 1,
        "tokenizer.ggml.tokens": ["<unk>", "a", "bc"]}


def _write_valid(path: Path, **kw) -> tuple[Path, list[Tensor]]:
    tensors = _tensors()
    write_gguf(path, META, tensors, **kw)
    return path, tensors


def _corrupt(tmp_path: Path, edit) -> Path:
    """A valid file with `edit(bytearray) -> bytes-like` applied, written to a new file."""
    src, _ = _write_valid(tmp_path / "valid.gguf")
    raw = bytearray(src.read_bytes())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(edit(raw)))
    return bad


def _tensor_info_at(raw: bytearray, name: str) -> int:
    """Offset of the n_dims field of tensor `name`'s info (just after its name)."""
    needle = struct.pack("<Q", len(name)) + name.encode()
    pos = raw.find(needle)
    assert pos > 0
    return pos + len(needle)


def _key_type_at(raw: bytearray, key: str) -> int:
    """Offset of the value-type field of metadata `key`."""
    needle = struct.pack("<Q", len(key)) + key.encode()
    return raw.find(needle) + len(needle)


def _expect_error(path: Path, *fragments: str, use_mmap: bool = True) -> str:
    with pytest.raises(ModelFileError) as exc:
        open_gguf(path, use_mmap=use_mmap)
    msg = str(exc.value)
    assert str(path) in msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


# ---- round trips -------------------------------------------------------------------------------------------

ALL_VALUES = {
    "general.architecture": ("llama", (VT.STRING, None)),
    "u8": (200, (VT.UINT8, None)), "i8": (-100, (VT.INT8, None)),
    "u16": (60000, (VT.UINT16, None)), "i16": (-30000, (VT.INT16, None)),
    "u32": (4_000_000_000, (VT.UINT32, None)), "i32": (-2_000_000_000, (VT.INT32, None)),
    "u64": (2**63 + 5, (VT.UINT64, None)), "i64": (-(2**62), (VT.INT64, None)),
    "f32": (0.25, (VT.FLOAT32, None)), "f64": (1e300, (VT.FLOAT64, None)),
    "yes": (True, (VT.BOOL, None)), "no": (False, (VT.BOOL, None)),
    "text": ("héllo ✓ 世界", (VT.STRING, None)), "empty_text": ("", (VT.STRING, None)),
    "a_u8": ([0, 255], (VT.ARRAY, VT.UINT8)), "a_i8": ([-128, 127], (VT.ARRAY, VT.INT8)),
    "a_u16": ([1, 65535], (VT.ARRAY, VT.UINT16)), "a_i16": ([-5, 5], (VT.ARRAY, VT.INT16)),
    "a_u32": ([7, 2**32 - 1], (VT.ARRAY, VT.UINT32)), "a_i32": ([-1, 3], (VT.ARRAY, VT.INT32)),
    "a_u64": ([2**64 - 1], (VT.ARRAY, VT.UINT64)), "a_i64": ([-(2**63)], (VT.ARRAY, VT.INT64)),
    "a_f32": ([0.5, -1.5], (VT.ARRAY, VT.FLOAT32)), "a_f64": ([1e-300, 2.0], (VT.ARRAY, VT.FLOAT64)),
    "a_bool": ([True, False, True], (VT.ARRAY, VT.BOOL)),
    "a_str": (["x", "", "ÿz"], (VT.ARRAY, VT.STRING)),
    "a_empty": ([], (VT.ARRAY, VT.INT32)),
    "a_nested": ([[1, 2], [3]], (VT.ARRAY, VT.ARRAY)),
}


def test_every_metadata_type_round_trips(tmp_path):
    meta = {k: v for k, (v, _) in ALL_VALUES.items()}
    types = {k: t for k, (_, t) in ALL_VALUES.items()}
    path = write_gguf(tmp_path / "m.gguf", meta, [], types=types)
    f = open_gguf(path)
    assert f.metadata == meta
    assert list(f.metadata) == list(meta)  # key order is kept
    assert f.metadata_types == types
    # the gguf package reads the same values
    ref = gguf.GGUFReader(path)
    for key, value in meta.items():
        if key != "a_nested":
            assert ref.fields[key].contents() == value, key
    # and a copy written from what we read is the same file byte for byte
    copy = write_gguf(tmp_path / "copy.gguf", f.metadata, [], types=f.metadata_types)
    assert copy.read_bytes() == path.read_bytes()


def test_metadata_type_inference(tmp_path):
    meta = {"general.architecture": "x", "small": 5, "big": 2**40, "neg": -3, "f": 0.1, "b": True,
            "ints": [1, 2], "mixed": [1, 2.5], "strs": ["a"], "np": np.arange(3, dtype=np.int16)}
    f = open_gguf(write_gguf(tmp_path / "i.gguf", meta, []))
    assert f.metadata_types["small"] == (VT.UINT32, None)
    assert f.metadata_types["big"] == (VT.INT64, None)
    assert f.metadata_types["neg"] == (VT.INT64, None)
    assert f.metadata_types["f"] == (VT.FLOAT32, None)
    assert f.metadata_types["b"] == (VT.BOOL, None)
    assert f.metadata_types["ints"] == (VT.ARRAY, VT.UINT32)
    assert f.metadata_types["mixed"] == (VT.ARRAY, VT.FLOAT32)
    assert f.metadata_types["strs"] == (VT.ARRAY, VT.STRING)
    assert f.metadata_types["np"] == (VT.ARRAY, VT.INT16)
    assert f.metadata["f"] == pytest.approx(0.1, rel=1e-7) and f.metadata["np"] == [0, 1, 2]


def test_writer_rejects_values_that_do_not_fit(tmp_path):
    with pytest.raises(ValueError, match="'k'"):
        write_gguf(tmp_path / "x.gguf", {"k": 300}, [], types={"k": (VT.UINT8, None)})
    with pytest.raises(ValueError, match="'arr'"):
        write_gguf(tmp_path / "x.gguf", {"arr": [1, -1]}, [], types={"arr": (VT.ARRAY, VT.UINT16)})
    with pytest.raises(ValueError, match="'s'"):
        write_gguf(tmp_path / "x.gguf", {"s": 3}, [], types={"s": (VT.STRING, None)})
    assert not list(tmp_path.iterdir())


def test_every_tensor_type_round_trips(tmp_path):
    path, tensors = _write_valid(tmp_path / "t.gguf")
    f = open_gguf(path)
    assert list(f.tensors) == [t.name for t in tensors]
    ref = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for t in tensors:
        got = f.tensors[t.name]
        assert got.type == t.type and got.shape == t.shape
        assert got.data.dtype == t.data.dtype and got.data.shape == t.data.shape
        assert got.data.tobytes() == t.data.tobytes()
        # the gguf package sees the same type, shape (ne order) and offset
        r = ref[t.name]
        assert r.tensor_type == t.type
        assert tuple(int(n) for n in r.shape) == tuple(reversed(t.shape))
        assert r.data_offset == f.tensor_offsets[t.name]
        assert f.tensor_offsets[t.name] % f.alignment == 0


def test_same_bytes_as_gguf_writer(tmp_path):
    tensors = _tensors()
    ours = write_gguf(tmp_path / "ours.gguf", META, tensors)
    w = gguf.GGUFWriter(tmp_path / "theirs.gguf", "llama")
    w.add_string("general.name", "tiny")
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", META["tokenizer.ggml.tokens"])
    for t in tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert ours.read_bytes() == (tmp_path / "theirs.gguf").read_bytes()


def test_pwri_magic_round_trip(tmp_path):
    plain, tensors = _write_valid(tmp_path / "d.gguf")
    sparse = write_gguf(tmp_path / "s.gguf", META, tensors, magic="PWRI")
    assert sparse.read_bytes()[:4] == b"PWRI"
    assert sparse.read_bytes()[4:] == plain.read_bytes()[4:]
    f = open_gguf(sparse)
    assert f.magic == "PWRI" and f.is_sparse and f.version == 3
    assert not open_gguf(plain).is_sparse
    assert f.tensors["blk.0.q8.weight"].data.tobytes() == tensors[3].data.tobytes()


def test_custom_alignment(tmp_path):
    path, tensors = _write_valid(tmp_path / "a.gguf", alignment=64)
    f = open_gguf(path)
    assert f.alignment == 64 and f.metadata["general.alignment"] == 64
    assert all(off % 64 == 0 for off in f.tensor_offsets.values()) and f.data_offset % 64 == 0
    ref = {t.name: t.data_offset for t in gguf.GGUFReader(path).tensors}
    assert ref == f.tensor_offsets
    with pytest.raises(ValueError, match="alignment"):
        write_gguf(tmp_path / "b.gguf", dict(META, **{"general.alignment": 64}), tensors, alignment=32)


def test_views_are_zero_copy_and_read_only(tmp_path):
    path, _ = _write_valid(tmp_path / "z.gguf")
    f = open_gguf(path)
    for t in f.tensors.values():
        assert np.shares_memory(t.data, f._map)
        assert not t.data.flags.writeable
    t = f.tensors["blk.0.q8.weight"]
    assert t.data.ctypes.data == f._map.ctypes.data + f.tensor_offsets[t.name]


def test_read_into_memory_instead_of_mapping(tmp_path, monkeypatch):
    """use_mmap=False (--no-mmap): the same metadata and tensor bytes, read-only, in memory of our own (no map to
    release pages of); the same errors for missing, tiny and truncated files; a file that ends early while it
    is read is a named error."""
    path, tensors = _write_valid(tmp_path / "r.gguf")
    mapped, read = open_gguf(path), open_gguf(path, use_mmap=False)
    assert read._mmap is None and mapped._mmap is not None
    assert read.metadata == mapped.metadata and read.tensor_offsets == mapped.tensor_offsets
    for t in tensors:
        got = read.tensors[t.name]
        assert got.type == t.type and got.shape == t.shape and got.data.tobytes() == t.data.tobytes()
        assert not got.data.flags.writeable and np.shares_memory(got.data, read._map)
    read.release_pages(tensors[0].name)  # nothing to release: the bytes stay
    assert read.tensors[tensors[0].name].data.tobytes() == tensors[0].data.tobytes()
    _expect_error(tmp_path / "nope.gguf", "no such file", use_mmap=False)
    size = path.stat().st_size
    (tmp_path / "short.gguf").write_bytes(path.read_bytes()[:size - 100])
    _expect_error(tmp_path / "short.gguf", "past the end of the file", use_mmap=False)

    class Shrinking:  # a reader that hits the end of the file halfway
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def readinto(self, view):
            return self.fh.readinto(view[:min(len(view), size // 2 - self.fh.tell())]) if self.fh.tell() < size // 2 else 0

    monkeypatch.setattr("powerinfer_py.gguf.reader._mem_available", lambda: size - 1)  # too big to read in
    _expect_error(path, "--no-mmap", "GiB available", "map it instead", use_mmap=False)
    assert open_gguf(path).tensors  # mapping it is still fine
    monkeypatch.undo()
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: Shrinking(real_open(p, mode, *a, **k))
                        if str(p) == str(path) and mode == "rb" else real_open(p, mode, *a, **k))
    _expect_error(path, "ended at byte", "changed meanwhile", use_mmap=False)


def test_metadata_only(tmp_path):
    path, _ = _write_valid(tmp_path / "m.gguf")
    f = read_metadata_only(path)
    assert f.metadata == META and f.tensors == {}


# ---- atomic writes -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failed_write_leaves_no_file(tmp_path, monkeypatch, exc):
    calls = []

    def failing_write(fh, t, alignment):
        calls.append(t.name)
        if len(calls) == 3:
            raise exc
        real_write(fh, t, alignment)

    real_write = writer_module._write_data
    monkeypatch.setattr(writer_module, "_write_data", failing_write)
    with pytest.raises(type(exc)):
        write_gguf(tmp_path / "new.gguf", META, _tensors())
    assert len(calls) == 3
    assert list(tmp_path.iterdir()) == []

    # an existing file of that name is left as it was
    monkeypatch.setattr(writer_module, "_write_data", real_write)
    old, _ = _write_valid(tmp_path / "old.gguf")
    before = old.read_bytes()
    calls.clear()
    monkeypatch.setattr(writer_module, "_write_data", failing_write)
    with pytest.raises(type(exc)):
        write_gguf(old, {"general.architecture": "other"}, _tensors())
    assert old.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["old.gguf"]


def test_full_disk_is_a_clear_error_and_loses_nothing(tmp_path, monkeypatch):
    """A disk too small for the output is refused before anything is written; a disk that fills up while
    writing (other writers share it) is a PowerInferError naming the file; the old file survives either way."""
    import errno
    import shutil

    from powerinfer_py import outfile

    old, _ = _write_valid(tmp_path / "old.gguf")
    before = old.read_bytes()

    real_usage = shutil.disk_usage
    monkeypatch.setattr(outfile.shutil, "disk_usage",
                        lambda p: real_usage(p)._replace(free=100))  # 100 bytes free
    with pytest.raises(PowerInferError, match=r"not enough free disk space .* needs .* MB, 0\.0 MB are free"):
        write_gguf(old, META, _tensors())
    monkeypatch.setattr(outfile.shutil, "disk_usage", real_usage)

    def filling_write(fh, t, alignment):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer_module, "_write_data", filling_write)
    with pytest.raises(PowerInferError, match=r"old\.gguf: the disk holding .* is full"):
        write_gguf(old, {"general.architecture": "other"}, _tensors())
    assert old.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["old.gguf"]


def test_writer_rejects_bad_tensors(tmp_path):
    t = _tensors()
    with pytest.raises(ValueError, match="duplicate tensor name"):
        write_gguf(tmp_path / "x.gguf", META, [t[0], t[0]])
    wrong = Tensor("w", GGMLType.F16, (3, 64), np.zeros((3, 64), np.float32))
    with pytest.raises(ValueError, match="'w'"):
        write_gguf(tmp_path / "x.gguf", META, [wrong])
    assert list(tmp_path.iterdir()) == []


# ---- corrupt files: one clear error each -------------------------------------------------------------------

def test_missing_and_tiny_files(tmp_path):
    _expect_error(tmp_path / "nope.gguf", "no such file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _expect_error(empty, "not a GGUF file", "0 bytes")
    _expect_error(_corrupt(tmp_path, lambda r: r[:20]), "not a GGUF file")


def test_wrong_magic(tmp_path):
    msg = _expect_error(_corrupt(tmp_path, lambda r: b"GGML" + r[4:]), "not a GGUF file")
    assert "GGML" in msg


@pytest.mark.parametrize("version,hint", [(1, "version 1"), (4, "version 4"), (3 << 24, "big-endian")])
def test_unsupported_version(tmp_path, version, hint):
    _expect_error(_corrupt(tmp_path, lambda r: r[:4] + struct.pack("<I", version) + r[8:]), "unsupported", hint)


def test_truncated_in_key_values(tmp_path):
    def cut(raw):
        return raw[:_key_type_at(raw, "tokenizer.ggml.tokens") + 20]
    _expect_error(_corrupt(tmp_path, cut), "truncated", "'tokenizer.ggml.tokens'")


def test_truncated_in_tensor_infos(tmp_path):
    def cut(raw):
        return raw[:_tensor_info_at(raw, "blk.0.q8.weight") + 10]
    _expect_error(_corrupt(tmp_path, cut), "truncated", "tensor info 3", "'blk.0.q8.weight'")


def test_truncated_data(tmp_path):
    src, tensors = _write_valid(tmp_path / "v.gguf")
    size = src.stat().st_size
    bad = tmp_path / "short.gguf"
    bad.write_bytes(src.read_bytes()[:size - 100])
    msg = _expect_error(bad, "'blk.0.q4k.weight'", "past the end of the file", f"{size - 100} bytes")
    f = open_gguf(src)
    end = f.tensor_offsets["blk.0.q4k.weight"] + tensors[-1].nbytes
    assert f"byte {end}" in msg


@pytest.mark.parametrize("field", [8, 16])  # tensor count, kv count
def test_absurd_counts(tmp_path, field):
    what = "tensor count" if field == 8 else "key/value count"
    _expect_error(_corrupt(tmp_path, lambda r: r[:field] + struct.pack("<Q", 2**60) + r[field + 8:]),
                  "corrupt header", what)


def test_absurd_string_length(tmp_path):
    def edit(raw):
        pos = raw.find(struct.pack("<Q", len("general.name")) + b"general.name")
        raw[pos:pos + 8] = struct.pack("<Q", 2**62)
        return raw
    _expect_error(_corrupt(tmp_path, edit), "string length", "past the end")


def test_absurd_array_length(tmp_path):
    def edit(raw):
        pos = _key_type_at(raw, "tokenizer.ggml.tokens") + 8  # after value type and element type
        raw[pos:pos + 8] = struct.pack("<Q", 2**50)
        return raw
    _expect_error(_corrupt(tmp_path, edit), "truncated or corrupt", "array length", "'tokenizer.ggml.tokens'")


def test_unknown_value_type(tmp_path):
    def edit(raw):
        pos = _key_type_at(raw, "llama.block_count")
        raw[pos:pos + 4] = struct.pack("<I", 99)
        return raw
    _expect_error(_corrupt(tmp_path, edit), "unknown value type 99", "'llama.block_count'")


def _patch_tensor(tmp_path, name, rel, fmt, value):
    def edit(raw):
        pos = _tensor_info_at(raw, name) + rel
        raw[pos:pos + struct.calcsize(fmt)] = struct.pack(fmt, value)
        return raw
    return _corrupt(tmp_path, edit)


# tensor info layout after the name: n_dims u32 @0, ne0 u64 @4, ne1 u64 @12, then type u32 and offset u64
@pytest.mark.parametrize("type_id", [99, 4])  # 4 was Q4_2, removed from ggml
def test_unknown_tensor_type(tmp_path, type_id):
    bad = _patch_tensor(tmp_path, "blk.0.q8.weight", 20, "<I", type_id)
    _expect_error(bad, f"unknown tensor type id {type_id}", "'blk.0.q8.weight'")


@pytest.mark.parametrize("ne0", [0, -5])
def test_zero_or_negative_dim(tmp_path, ne0):
    bad = _patch_tensor(tmp_path, "blk.0.q8.weight", 4, "<q", ne0)
    _expect_error(bad, "zero or negative dimension", "'blk.0.q8.weight'")


@pytest.mark.parametrize("n_dims", [0, 5])
def test_bad_dim_count(tmp_path, n_dims):
    bad = _patch_tensor(tmp_path, "blk.0.q8.weight", 0, "<I", n_dims)
    _expect_error(bad, f"{n_dims} dimensions", "'blk.0.q8.weight'")


def test_row_not_multiple_of_block(tmp_path):
    bad = _patch_tensor(tmp_path, "blk.0.q8.weight", 4, "<q", 48)
    _expect_error(bad, "row length 48", "Q8_0 block size 32", "'blk.0.q8.weight'")


def test_unaligned_offset(tmp_path):
    src, _ = _write_valid(tmp_path / "v.gguf")
    off = open_gguf(src).tensor_offsets["blk.0.q8.weight"] - open_gguf(src).data_offset
    bad = _patch_tensor(tmp_path, "blk.0.q8.weight", 24, "<Q", off + 4)
    _expect_error(bad, f"offset {off + 4}", "alignment 32", "'blk.0.q8.weight'")


def test_offset_past_end(tmp_path):
    bad = _patch_tensor(tmp_path, "blk.0.q8.weight", 24, "<Q", 2**40)
    _expect_error(bad, "'blk.0.q8.weight'", "past the end of the file")


def test_overlapping_tensors(tmp_path):
    # point the Q4_0 tensor at the Q8_0 tensor's bytes
    src, _ = _write_valid(tmp_path / "v.gguf")
    f = open_gguf(src)
    q8_off = f.tensor_offsets["blk.0.q8.weight"] - f.data_offset
    bad = _patch_tensor(tmp_path, "blk.0.q4.weight", 24, "<Q", q8_off)
    _expect_error(bad, "overlap", "'blk.0.q8.weight'", "'blk.0.q4.weight'")


def test_duplicate_tensor_name(tmp_path):
    def edit(raw):
        pos = raw.find(b"blk.0.q4.weight")
        raw[pos:pos + 15] = b"blk.0.q8.weight"
        return raw
    _expect_error(_corrupt(tmp_path, edit), "duplicate tensor name", "'blk.0.q8.weight'")


def test_duplicate_key(tmp_path):
    def edit(raw):
        pos = raw.find(b"general.name")
        raw[pos:pos + 12] = b"general.arch"[:12]
        return raw
    path = write_gguf(tmp_path / "k.gguf", {"general.arch": "a", "general.name": "b"}, [])
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(edit(bytearray(path.read_bytes()))))
    _expect_error(bad, "duplicate metadata key", "'general.arch'")


def test_bad_alignment_value(tmp_path):
    # the writer refuses 48, so write 64 and patch the value
    raw = bytearray(write_gguf(tmp_path / "b.gguf", {"general.alignment": 64}, []).read_bytes())
    pos = _key_type_at(raw, "general.alignment") + 4
    raw[pos:pos + 4] = struct.pack("<I", 48)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    _expect_error(bad, "general.alignment", "power of two", "48")


# ---- the real model ----------------------------------------------------------------------------------------



@pytest.mark.real_model
def test_real_model_header(real_model):
    f = open_gguf(real_model)
    assert f.magic == "GGUF" and f.version == 3 and len(f.tensors) == 236
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 262144
    assert f.tensors["token_embd.weight"].shape == (262144, 640)
    assert f.tensors["token_embd.weight"].type == GGMLType.Q8_0


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_agrees_with_gguf_reader(real_model):
    f = open_gguf(real_model)
    ref = gguf.GGUFReader(real_model)  # slow: ~10 s on the 262144-token vocabulary
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert keys == list(f.metadata)
    for key in keys:
        field = ref.fields[key]
        assert f.metadata_types[key][0] == field.types[0], key
        if key in ("tokenizer.ggml.scores",):
            assert np.array_equal(np.float32(f.metadata[key]), np.float32(field.contents()))
        else:
            assert f.metadata[key] == field.contents(), key
    assert [t.name for t in ref.tensors] == list(f.tensors)
    for t in ref.tensors:
        ours = f.tensors[t.name]
        assert ours.type == t.tensor_type
        assert tuple(reversed(ours.shape)) == tuple(int(n) for n in t.shape)
        assert f.tensor_offsets[t.name] == t.data_offset
        assert ours.nbytes == t.n_bytes


def test_any_truncation_or_header_corruption_is_a_model_file_error(tmp_path):
    """Every prefix of a valid file, and random byte changes in its header, either parse or raise
    ModelFileError: never a numpy/struct/Unicode exception."""
    meta = dict(META, nested=[[1, 2], [3]], floats=[1.5, 2.5])
    raw = write_gguf(tmp_path / "v.gguf", meta, _tensors()).read_bytes()
    header_len = open_gguf(tmp_path / "v.gguf").data_offset
    bad = tmp_path / "bad.gguf"
    fuzz = np.random.default_rng(0)
    cases = [raw[:n] for n in range(0, len(raw), 3)]
    for _ in range(400):
        b = bytearray(raw)
        for pos in fuzz.integers(0, header_len, size=fuzz.integers(1, 4)):
            b[pos] = int(fuzz.integers(0, 256))
        cases.append(bytes(b))
    n_errors = 0
    for case in cases:
        bad.write_bytes(case)
        try:
            open_gguf(bad)
        except ModelFileError as e:
            assert str(bad) in str(e)
            n_errors += 1
    assert n_errors > len(cases) // 2


def test_release_pages_keeps_views_valid(tmp_path):
    big = Tensor("big.weight", GGMLType.F32, (64, 1024), rng.standard_normal((64, 1024)).astype(np.float32))
    path = write_gguf(tmp_path / "r.gguf", META, [big])
    f = open_gguf(path)
    before = f.tensors["big.weight"].data.copy()
    f.release_pages("big.weight")
    np.testing.assert_array_equal(f.tensors["big.weight"].data, before)
