"""The restricted torch .pt/.bin reader and the .pt writer, without torch.

Fixtures under tests/fixtures/ were written once by torch 2.13 (torch.save); their values are arange-based
formulas recomputed here, or stored next to them in an .npz (predictor_layer_expected.npz).
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from powerinfer_py.convert.source import to_f32
from powerinfer_py.convert.torch_pt import read_pt, read_state_dict, save_pt
from powerinfer_py.errors import ModelFileError

FIXTURES = Path(__file__).parent / "fixtures"
BASE = np.arange(24, dtype=np.float32).reshape(4, 6) / 8 - 1  # what the fixture's tensors were made from


def _bf16_round(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def test_torch_state_dict_fixture():
    sd = read_state_dict(FIXTURES / "torch_state_dict.pt")
    assert list(sd) == ["f32", "f16", "bf16", "f64", "i64", "transposed", "rows", "column", "param"]
    got = {k: v.read() for k, v in sd.items()}
    np.testing.assert_array_equal(got["f32"], BASE)
    assert got["f16"].dtype == np.float16 and np.array_equal(got["f16"].astype(np.float32), BASE)
    assert sd["bf16"].dtype == "BF16" and got["bf16"].dtype == np.uint16
    np.testing.assert_array_equal(to_f32(got["bf16"], "BF16"), _bf16_round(BASE * 3))
    np.testing.assert_array_equal(got["f64"], BASE[:2].astype(np.float64))
    np.testing.assert_array_equal(got["i64"], np.arange(5) - 2)
    # views: strides (transposed, column) and a storage offset (rows) on base's shared storage
    np.testing.assert_array_equal(got["transposed"], BASE.T)
    np.testing.assert_array_equal(got["rows"], BASE[1:3])
    np.testing.assert_array_equal(got["column"], BASE[:, 2])
    np.testing.assert_array_equal(got["param"], np.full(3, 0.5, np.float32))  # nn.Parameter


def test_read_rows_of_a_stored_tensor():
    sd = read_state_dict(FIXTURES / "torch_state_dict.pt")
    assert sd["rows"].offset is not None  # contiguous in the file: read by offset, not through the zip
    np.testing.assert_array_equal(sd["rows"].read_rows(1, 2), BASE[2:3])
    np.testing.assert_array_equal(sd["transposed"].read_rows(2, 5), BASE.T[2:5])


def test_predictor_fixture_and_single_tensor():
    sd = read_state_dict(FIXTURES / "predictor_layer.pt")
    expected = np.load(FIXTURES / "predictor_layer_expected.npz")
    for key, name in (("fc1.weight", "fc1"), ("fc2.weight", "fc2")):
        assert sd[key].dtype == "F16"
        np.testing.assert_array_equal(sd[key].read().astype(np.float32), expected[name])
    counts = read_pt(FIXTURES / "activation_counts.pt")
    np.testing.assert_array_equal(counts.read(), np.arange(10, dtype=np.float32) * 3)


def test_legacy_format_is_refused_clearly():
    with pytest.raises(ModelFileError, match=r"legacy_format\.pt: not a torch zip checkpoint"):
        read_pt(FIXTURES / "legacy_format.pt")


# ---- refusing code ------------------------------------------------------------------------------------------

class _Evil:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _zip_with_pickle(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/data/0", np.zeros(4, np.float32).tobytes())
        z.writestr("archive/version", b"3\n")
    return path


def _tensor_pickle_with_evil_hooks(marker: Path) -> bytes:
    """A real tensor record whose backward_hooks argument is the evil object (a nested global)."""
    body = pickle.dumps(_Evil(marker), protocol=2)[2:-1]  # the object's opcodes without PROTO/STOP
    return (b"\x80\x02}(X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n("
            b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ"
            b"K\x00K\x04\x85K\x01\x85\x89" + body + b"tRu.")


@pytest.mark.parametrize("kind", ["top-level", "nested-in-tensor"])
def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path, kind):
    marker = tmp_path / "pwned"
    payload = (pickle.dumps({"w": _Evil(marker)}, protocol=2) if kind == "top-level"
               else _tensor_pickle_with_evil_hooks(marker))
    assert b"system" in payload  # the payload calls os.system (see test_plain_pickle_would_have_run_the_payload)
    bad = _zip_with_pickle(tmp_path / "bad.pt", payload)
    with pytest.raises(ModelFileError, match=r"bad\.pt: refusing to load.*(posix|os)\.system"):
        read_pt(bad)
    assert not marker.exists()


def test_plain_pickle_would_have_run_the_payload(tmp_path):
    """The payload used above is real: plain pickle creates the marker (so the test above can fail)."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(_Evil(marker), protocol=2))
    assert marker.exists()


def test_other_globals_and_bad_records_are_refused(tmp_path):
    payload = b"\x80\x02cbuiltins\neval\nX\x04\x00\x00\x001+1\x85R."
    with pytest.raises(ModelFileError, match="builtins.eval"):
        read_pt(_zip_with_pickle(tmp_path / "eval.pt", payload))
    # a tensor reaching past its storage (4 floats) must not read neighbouring memory
    payload = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
               b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x02K\x04\x85K\x01\x85\x89)tR.")
    with pytest.raises(ModelFileError, match="reaches past its storage"):
        read_pt(_zip_with_pickle(tmp_path / "oob.pt", payload))
    # a storage key that is not in the archive
    payload = payload.replace(b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x007").replace(b"K\x02K\x04", b"K\x00K\x04")
    with pytest.raises(ModelFileError, match="storage '7'.*missing"):
        read_pt(_zip_with_pickle(tmp_path / "nokey.pt", payload))
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ModelFileError, match="junk.pt"):
        read_pt(tmp_path / "junk.pt")
    with pytest.raises(ModelFileError, match="missing.pt: file not found"):
        read_pt(tmp_path / "missing.pt")


# ---- writer -------------------------------------------------------------------------------------------------

def test_save_pt_round_trip_and_layout(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(5, dtype=np.float16),
              "c": np.arange(4, dtype=np.int64) - 1, "d": np.array([True, False])}
    path = save_pt(tmp_path / "sd.pt", arrays)
    sd = read_state_dict(path)
    for k, v in arrays.items():
        got = sd[k].read()
        assert got.dtype == v.dtype and np.array_equal(got, v), k
    one = read_pt(save_pt(tmp_path / "one.pt", np.linspace(0, 1, 7, dtype=np.float32)))
    np.testing.assert_array_equal(one.read(), np.linspace(0, 1, 7, dtype=np.float32))
    # torch's layout: one top-level folder, data.pkl first, version record, storages 64-byte aligned
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        assert names[0] == "archive/data.pkl" and "archive/version" in names and "archive/byteorder" in names
        for info in z.infolist():
            if info.filename.startswith("archive/data/"):
                raw = path.read_bytes()[info.header_offset:]
                n, e = struct.unpack("<HH", raw[26:30])
                assert (info.header_offset + 30 + n + e) % 64 == 0
    # the pickle names only the tensor-rebuilding globals
    with zipfile.ZipFile(path) as z:
        import pickletools
        out = io.StringIO()
        pickletools.dis(z.read("archive/data.pkl"), out=out)
    globals_ = {line.split("GLOBAL")[1].strip() for line in out.getvalue().splitlines() if "GLOBAL" in line}
    assert globals_ == {"'torch._utils _rebuild_tensor_v2'", "'torch FloatStorage'", "'torch HalfStorage'",
                        "'torch LongStorage'", "'torch BoolStorage'", "'collections OrderedDict'"}


# ---- resource errors become one clear message -----------------------------------------------------------------

@pytest.mark.parametrize("error", [MemoryError, RecursionError, struct.error])
def test_resource_and_struct_errors_while_unpickling_are_model_file_errors(tmp_path, monkeypatch, error):
    from powerinfer_py.convert import torch_pt

    def fail(data):
        raise error("from deep inside")

    monkeypatch.setattr(torch_pt, "load_pickle", fail)
    path = save_pt(tmp_path / "a.pt", np.zeros(3, np.float32))
    with pytest.raises(ModelFileError, match=r"a\.pt: (out of memory|.*nested too deeply|corrupt pickle)"):
        read_pt(path)


def test_out_of_memory_reading_a_tensor_names_it(tmp_path, monkeypatch):
    from powerinfer_py.convert import source
    from powerinfer_py.errors import PowerInferError

    sd = read_state_dict(save_pt(tmp_path / "a.pt", {"big": np.zeros((4, 3), np.float32)}))

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(source.np, "empty", no_memory)
    for read in (sd["big"].read, lambda: sd["big"].read_rows(0, 2)):
        with pytest.raises(PowerInferError, match=r"a\.pt: not enough memory to read tensor 'big' \(0 MiB\)"):
            read()
