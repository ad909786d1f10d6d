"""Hostile torch .pt/.bin files, each built here byte by byte: the reader must read nothing foreign, stay within
bounded memory, and fail with one clear line (issue 35, points 1 and 2).

Every read runs in a child process (`_read`) under RLIMIT_AS = its size after imports + 1.25 GiB, so a reader
that inflated a bomb would hit MemoryError there (and a crash, such as the C stack overflow a deeply nested
dict key causes in CPython's unpickler, cannot take pytest down with it). The child answers each request with
the PowerInferError's message; anything else (another exception, a crash, a timeout) fails the test. The
expected words are the specific refusal, never the generic out-of-memory message, so a reader that merely ran
out of memory under the limit does not pass. The CLI cases run `python -m powerinfer_cli convert` on a tiny HF
checkpoint whose pytorch_model.bin is replaced by a hostile one.
"""
from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from hf_fixtures import llama_config, llama_weights, write_checkpoint
from powerinfer_py.convert.torch_pt import read_pt, read_state_dict
from powerinfer_py.errors import ModelFileError

SECRET = "PI-HOSTILE-SECRET-3f9c1e"  # in a temp file and in the environment; must never reach an output

# ---- pickles by hand ---------------------------------------------------------------------------------------


def _s(text: str) -> bytes:  # BINUNICODE
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _i(v: int) -> bytes:  # BININT, or LONG1 with 8 bytes
    return b"J" + struct.pack("<i", v) if -(1 << 31) <= v < 1 << 31 else b"\x8a\x08" + struct.pack("<q", v)


def _t(*values: int) -> bytes:  # MARK ... TUPLE
    return b"(" + b"".join(_i(v) for v in values) + b"t"


def _tensor(key="0", numel=4, offset=0, size=(4,), stride=(1,), storage="FloatStorage", after=b"") -> bytes:
    """_rebuild_tensor_v2(('storage', torch.<storage>, key, 'cpu', numel), offset, size, stride, False,
    OrderedDict()), then `after` (opcodes applied to the rebuilt tensor, e.g. a BUILD)."""
    pid = b"(" + _s("storage") + f"ctorch\n{storage}\n".encode() + _s(key) + _s("cpu") + _i(numel) + b"tQ"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + _i(offset) + _t(*size) + _t(*stride) + b"\x89"
            + b"ccollections\nOrderedDict\n)RtR" + after)


def _state_dict(**items: bytes) -> bytes:
    return b"\x80\x02}(" + b"".join(_s(k) + v for k, v in items.items()) + b"u."


def _build(**attrs) -> bytes:
    """BUILD with a dict state {name: str or int}: what `obj.__dict__.update(state)` would do."""
    body = b"".join(_s(k) + (_s(v) if isinstance(v, str) else _i(v)) for k, v in attrs.items())
    return b"}(" + body + b"ub"


def _dag(levels: int) -> bytes:
    """A tuple of two references to a tuple of two references ... `levels` deep: 2 bytes a level, a repr of
    2**levels parts, and as long to hash."""
    return b")" + b"2\x86" * levels  # EMPTY_TUPLE, then DUP + TUPLE2 per level


def _torch_zip(path: Path, pkl: bytes, storages: dict[str, bytes] | None = None, byteorder=b"little") -> Path:
    """torch's layout: archive/data.pkl, byteorder, data/<key> (stored uncompressed), version."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", byteorder)
        for key, raw in (storages or {"0": np.arange(4, dtype=np.float32).tobytes()}).items():
            z.writestr(f"archive/data/{key}", raw)
        z.writestr("archive/version", b"3\n")
    return path


def _raw_zip(path: Path, entries: list[tuple]) -> Path:
    """A zip written field by field: (name, method, stored bytes, declared inflated size[, declared stored
    size]) per member. Compressed members get CRC 0 (a reader that honours the declared sizes refuses them
    before any CRC check)."""
    out, central = bytearray(), bytearray()
    for name, method, data, size, *stored in entries:
        raw_name, offset, csize = name.encode(), len(out), stored[0] if stored else len(data)
        crc = zlib.crc32(data) if method == zipfile.ZIP_STORED else 0
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, csize, size, len(raw_name), 0)
        out += raw_name + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, csize, size,
                               len(raw_name), 0, 0, 0, 0, 0, offset) + raw_name
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + eocd))
    return path


def _zeros_deflate(n_mib: int) -> bytes:
    """A raw deflate stream of n_mib MiB of zeros, ~1 KB per MiB: one fully flushed MiB repeated (after a full
    flush the compressor starts afresh, so each further MiB compresses to the same bytes)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    zero = bytes(1 << 20)
    first = c.compress(zero) + c.flush(zlib.Z_FULL_FLUSH)
    unit = c.compress(zero) + c.flush(zlib.Z_FULL_FLUSH)
    stream = first + unit * (n_mib - 1) + c.flush()
    assert len(zlib.decompressobj(-15).decompress(first + unit + unit)) == 3 << 20  # the repetition is valid
    return stream


def _bomb_zip(path: Path, pkl: bytes, n_mib: int, bomb: str = "data/0", storages: dict | None = None) -> Path:
    """A torch archive whose member `bomb` is n_mib MiB of deflated zeros (the others stored)."""
    storages = storages or {"0": np.zeros(4, np.float32).tobytes()}
    members = {"data.pkl": pkl, "byteorder": b"little", **{f"data/{k}": v for k, v in storages.items()}}
    entries = [(f"archive/{name}", 0, raw, len(raw)) for name, raw in members.items() if name != bomb]
    return _raw_zip(path, entries + [(f"archive/{bomb}", zipfile.ZIP_DEFLATED, _zeros_deflate(n_mib),
                                      n_mib << 20)])


# ---- the child process that reads ---------------------------------------------------------------------------

_CHILD = r"""
import json, resource, sys
from powerinfer_py.errors import PowerInferError
from powerinfer_py.convert.source import SourceTensor
from powerinfer_py.convert.torch_pt import read_pt, read_state_dict
from powerinfer_py.hybrid.activations import load_activations
from powerinfer_py.tools.profile import read_activation_counts
from powerinfer_py.convert.predictor import read_predictor

def vm_size():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

limit = vm_size() + (5 << 28)  # 1.25 GiB above what the imports took
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

def read_all(obj, seen):
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, SourceTensor):
        obj.read()
    elif isinstance(obj, dict):
        for v in obj.values():
            read_all(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            read_all(v, seen)

def read(kind, target):
    if kind == "pt":
        read_all(read_pt(target), set())
    elif kind == "state_dict":
        read_all(read_state_dict(target), set())
    elif kind == "activations":  # a model of 1 layer with 16 FFN neurons
        load_activations(target, 1, 16)
    elif kind == "profile":
        read_activation_counts(target)
    else:  # predictor for 1 layer, n_embd 8, n_ff 16
        p = read_predictor(target, 1, 8, 16)
        read_all(p.fc1 + p.fc2, set())

for request in sys.stdin:  # one JSON line per request: [kind, path]; one JSON line back
    try:
        read(*json.loads(request))
        answer = ["read", ""]
    except PowerInferError as e:
        answer = ["error", str(e)]
    except BaseException as e:  # what the test fails on: a traceback the CLI would have shown
        answer = ["unexpected", f"{type(e).__name__}: {str(e)[:2000]}"]
    print(json.dumps(answer), flush=True)
"""


class _Child:
    """The reading child process, started on first use and again after it died (a crash or a timeout). Its
    stderr goes to a file (a pipe nobody reads could fill up and stall it)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.err = None

    def ask(self, kind: str, path: Path, timeout: float) -> tuple[str, str]:
        if self.proc is None:
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
            self.err = tempfile.TemporaryFile("w+")
            self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)
        try:
            self.proc.stdin.write(json.dumps([kind, str(path)]) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: reported below
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:  # hung or died: report how, and start afresh next time
            self.proc.kill()
            code = self.proc.wait()
            self.err.seek(0)
            how = f"exit {code} after {'a timeout' if not ready else 'a crash'}: {self.err.read()[-3000:]}"
            self.close()
            return "died", how
        status, message = json.loads(line)
        return status, message

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
            self.proc.stdout.close()
            self.err.close()
            self.proc = None


_child = _Child()


@pytest.fixture(scope="module", autouse=True)
def _close_child():
    yield
    _child.close()


def _read(path: Path, kind: str = "pt", timeout: float = 120) -> str:
    """Read `path` in the child; return its error line, `error: <message>` (the test fails on anything else:
    a successful read, an exception other than PowerInferError, a crash, a timeout)."""
    status, message = _child.ask(kind, path, timeout)
    assert status == "error", (status, message)
    assert "\n" not in message and len(message) < 500, message[:2000]
    assert "memory" not in message and SECRET not in message
    return f"error: {message}"


# ---- point 1: no tensor can be pointed at another file -------------------------------------------------------

@pytest.fixture
def secret_file(tmp_path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text(SECRET * 100)
    return path


@pytest.mark.parametrize("target", ["/proc/self/environ", "secret"])
@pytest.mark.parametrize("how", ["dict state", "slot state"])
def test_build_on_a_rebuilt_tensor_is_refused(tmp_path, secret_file, target, how):
    path = str(secret_file) if target == "secret" else target
    if how == "dict state":
        after = _build(path=path, offset=0, dtype="U8", shape=1000)
    else:  # BUILD (None, {attrs}): what setattr() on slots would do
        after = b"N}(" + _s("path") + _s(path) + _s("offset") + _i(0) + b"u\x86b"
    bad = _torch_zip(tmp_path / "bad.pt", _state_dict(w=_tensor(after=after)))
    assert "BUILD on a torch object" in _read(bad)


@pytest.mark.parametrize("victim", ["storage", "storage type", "rebuild function"])
def test_build_on_any_other_object_of_the_reader_is_refused(tmp_path, victim):
    """Storage records, storage-type markers and the rebuild callable are as read-only as the tensor."""
    change = _build(key="../secret", dtype="U8", numel=1 << 40)
    tensor = _tensor()
    if victim == "storage":  # BUILD right after BINPERSID: on the storage record
        tensor = tensor.replace(b"tQ", b"tQ" + change, 1)
    elif victim == "storage type":
        tensor = tensor.replace(b"FloatStorage\n", b"FloatStorage\n" + change, 1)
    else:
        tensor = tensor.replace(b"_rebuild_tensor_v2\n", b"_rebuild_tensor_v2\n" + change, 1)
    assert "BUILD on a torch object" in _read(_torch_zip(tmp_path / "bad.pt", _state_dict(w=tensor)))


def test_state_dict_metadata_build_is_still_read(tmp_path):
    """torch's state dicts are OrderedDicts with a `_metadata` attribute, set by BUILD: still valid."""
    pkl = (b"\x80\x02ccollections\nOrderedDict\n)R(" + _s("w") + _tensor() + b"u"
           + _build(_metadata=0) + b".")
    sd = read_state_dict(_torch_zip(tmp_path / "ok.pt", pkl))
    np.testing.assert_array_equal(sd["w"].read(), np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("key, words", [("../../secret", "unexpected persistent id"),
                                        ("byteorder", "storage 'byteorder' named by the pickle is missing"),
                                        ("7", "storage '7' named by the pickle is missing")])
def test_a_storage_key_names_only_a_member_of_data(tmp_path, key, words):
    bad = _torch_zip(tmp_path / "bad.pt", _state_dict(w=_tensor(key=key)))
    assert words in _read(bad)


@pytest.mark.parametrize("tensor, words", [
    (dict(offset=2), "reaches past its storage of 4 elements"),
    (dict(size=(2, 3), stride=(3, 1)), "reaches past its storage of 4 elements"),
    (dict(numel=1 << 40, size=(1 << 40,)), "holds 16 bytes, 1099511627776 F32 elements need"),
    (dict(offset=-1), "storage offset is not a count"),
    (dict(size=(4, 1), stride=(1,)), "2 sizes but 1 strides"),
    (dict(size=(1 << 62,)), "size is not a count"),
    (dict(storage="ComplexFloatStorage"), "names torch.ComplexFloatStorage"),
    (dict(storage="Storage"), "names torch.Storage"),
])
def test_offsets_sizes_and_dtypes_are_checked_against_the_member(tmp_path, tensor, words):
    assert words in _read(_torch_zip(tmp_path / "bad.pt", _state_dict(w=_tensor(**tensor))))


def test_a_member_past_the_end_of_the_file_is_refused(tmp_path):
    pkl = _state_dict(w=_tensor(numel=1 << 20, size=(1 << 20,)))
    bad = _raw_zip(tmp_path / "bad.pt", [("archive/data.pkl", 0, pkl, len(pkl)),
                                         ("archive/data/0", 0, b"\0" * 64, 4 << 20)])
    assert "stored with two different sizes" in _read(bad)
    # sizes that agree but lie: 4 MiB stored, 64 bytes in the file
    bad = _raw_zip(tmp_path / "bad.pt", [("archive/data.pkl", 0, pkl, len(pkl)),
                                         ("archive/data/0", 0, b"\0" * 64, 4 << 20, 4 << 20)])
    assert "reaches past the end of the file" in _read(bad)


# ---- point 2: bounded memory ----------------------------------------------------------------------------------

@pytest.mark.parametrize("size, stride, words", [
    ((1 << 29,), (0,), "stride 0"),  # 2 GiB of one stored float
    ((1 << 15, 1 << 15), (1, 1), "overlapping strides"),  # 4 GiB of overlapping windows on 128 KiB
    ((4, 1 << 28), (1 << 28, 0), "stride 0"),
])
def test_repeating_strides_are_refused_not_materialised(tmp_path, size, stride, words):
    numel = 1 << 16
    pkl = _state_dict(w=_tensor(numel=numel, size=size, stride=stride))
    bad = _torch_zip(tmp_path / "bad.pt", pkl, {"0": bytes(4 * numel)})
    assert words in _read(bad)


def test_views_that_do_not_repeat_elements_still_read(tmp_path):
    """Transposed, sliced and size-1 dims with any stride stay valid (read through the bounded loader)."""
    base = np.arange(24, dtype=np.float32)
    cases = {"t": ((6, 4), (1, 6), base.reshape(4, 6).T), "col": ((4,), (6,), base.reshape(4, 6)[:, 2]),
             "one": ((1, 5), (0, 1), base[3:8].reshape(1, 5)), "empty": ((0, 3), (0, 0), np.zeros((0, 3)))}
    offsets = {"col": 2, "one": 3}
    pkl = _state_dict(**{k: _tensor(numel=24, size=s, stride=st, offset=offsets.get(k, 0))
                         for k, (s, st, _) in cases.items()})
    sd = read_state_dict(_torch_zip(tmp_path / "ok.pt", pkl, {"0": base.tobytes()}))
    for k, (_, _, want) in cases.items():
        np.testing.assert_array_equal(sd[k].read(), want.astype(np.float32), err_msg=k)


def test_zip_bomb_member_is_refused(tmp_path):
    """2 GiB of zeros deflated to ~2 MB, behind a tensor that claims all of it."""
    pkl = _state_dict(w=_tensor(numel=1 << 29, size=(1 << 29,)))
    assert "looks like a zip bomb" in _read(_bomb_zip(tmp_path / "bomb.pt", pkl, 2048))


def test_a_bomb_member_is_not_inflated_for_a_small_tensor(tmp_path):
    """The tensor needs 16 bytes of a member that claims 2 GiB: refused by ratio, nothing inflated."""
    assert "looks like a zip bomb" in _read(_bomb_zip(tmp_path / "bomb.pt", _state_dict(w=_tensor()), 2048))


def test_compressed_members_still_read(tmp_path):
    """Valid compressed members (inflating less than the limit) still read, views of them too."""
    base = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    pkl = _state_dict(a=_tensor(numel=1000, offset=10, size=(5, 2), stride=(2, 1)),
                      b=_tensor(numel=1000, offset=100, size=(3, 4), stride=(1, 3)))
    path = tmp_path / "deflated.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/data/0", base.tobytes())
    sd = read_state_dict(path)
    np.testing.assert_array_equal(sd["a"].read(), base[10:20].reshape(5, 2))
    np.testing.assert_array_equal(sd["b"].read(), base[100:112].reshape(4, 3).T)


@pytest.mark.parametrize("member", ["data.pkl", "byteorder"])
def test_bombs_in_the_pickle_and_byteorder_members(tmp_path, member):
    assert "looks like a zip bomb" in _read(_bomb_zip(tmp_path / "bomb.pt", _state_dict(w=_tensor()), 2048, member))


def test_an_oversized_byteorder_member_is_not_read(tmp_path):
    path = _torch_zip(tmp_path / "big.pt", _state_dict(w=_tensor()), byteorder=b"little" + b" " * 10_000)
    assert "more than the 64 this reader accepts" in _read(path)


def test_an_opcode_flood_is_refused(tmp_path):
    """16 Mi EMPTY_DICT opcodes (16 MiB of pickle, 16 KB deflated) would build 16 Mi dicts, over 1.3 GB; the
    scan stops at its opcode limit (1 Mi)."""
    pkl = b"\x80\x02" + b"}" * ((16 << 20) - 8) + b"."
    path = tmp_path / "flood.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pkl)
    assert "more than 1048576 opcodes" in _read(path)


def test_a_huge_memo_index_is_refused(tmp_path):
    """LONG_BINPUT 0xfffffff0: CPython's unpickler would size its memo table for 4 G entries (32 GiB)."""
    pkl = b"\x80\x02K\x01r\xf0\xff\xff\xff."
    assert "memo slot 4294967280" in _read(_torch_zip(tmp_path / "memo.pt", pkl))


# shared tuples (a DAG) and deep nesting: messages never repr them, keys are never hashed, walks are bounded

@pytest.mark.parametrize("where, words", [
    ("persistent id", "unexpected persistent id in the pickle (a tuple"),  # its repr: 2**64 parts
    ("tensor size", "size is not a count (tuple)"),
    ("dict key", "dict key that is not a string or number"),  # hashing it: 2**64 steps
    ("value", "expected a state dict of named tensors, got dict"),  # converted once per shared tuple
])
def test_shared_tuples_cost_their_size_not_their_expansion(tmp_path, where, words):
    dag = _dag(64)
    if where == "persistent id":
        pkl = b"\x80\x02" + dag + b"Q."
    elif where == "tensor size":
        pkl = _state_dict(w=_tensor().replace(_t(4), dag, 1))
    elif where == "dict key":
        pkl = b"\x80\x02}" + _dag(64) + b"K\x01s."
    else:
        pkl = _state_dict(w=_dag(60))
    assert words in _read(_torch_zip(tmp_path / "dag.pt", pkl), "state_dict", timeout=60)


@pytest.mark.parametrize("where, words", [
    ("dict key", "dict key that is not a string or number"),  # CPython's unpickler: C stack overflow
    ("frozenset", "dict key or set member that is not a string or number"),
    ("persistent id", "unexpected persistent id"),  # its repr: RecursionError
    ("list", "nested more than 64 deep"),
    ("cycle", "contain themselves (a cycle)"),
])
def test_recursion_bombs(tmp_path, where, words):
    deep = b")" + b"\x85" * 300_000  # a tuple nested 300k deep (TUPLE1 per level): enough to crash CPython
    if where == "dict key":
        pkl = b"\x80\x02}" + deep + b"K\x01s."
    elif where == "frozenset":
        pkl = b"\x80\x04(" + deep + b"\x91."
    elif where == "persistent id":
        pkl = b"\x80\x02" + deep + b"Q."
    elif where == "list":
        pkl = _state_dict(w=b"]" * 100_000 + b"a" * 99_999)
    else:
        pkl = _state_dict(w=b"]q\x00h\x00a")  # L = []; L.append(L)
    assert words in _read(_torch_zip(tmp_path / "deep.pt", pkl), timeout=60)


@pytest.mark.parametrize("pkl, words", [
    (b"\x80\x02" + _s("posix") + _s("system") + b"\x93" + _s("touch MARKER") + b"\x85R.", "names posix.system"),
    (b"\x80\x02(" + _s("touch MARKER") + b"iposix\nsystem\n.", "names posix.system"),  # INST
    (b"\x80\x02ccollections\nOrderedDict\n(((" + _s("k") + _s("v") + b"tltR.",  # OrderedDict([("k", "v")])
     "builds an OrderedDict from arguments"),
], ids=["STACK_GLOBAL", "INST", "OrderedDict args"])
def test_other_ways_of_naming_or_calling_are_refused(tmp_path, pkl, words):
    marker = tmp_path / "pwned"
    pkl = pkl.replace(b"MARKER", str(marker).encode()).replace(  # fix the BINUNICODE length after the edit
        struct.pack("<I", len("touch MARKER")), struct.pack("<I", len(f"touch {marker}")))
    assert words in _read(_torch_zip(tmp_path / "bad.pt", pkl))
    assert not marker.exists()


@pytest.mark.parametrize("pkl", [b"\x80\x02t.", b"\x80\x02a.", b"\x80\x02X\xff\xff\x00\x00ab", b"\x80\x02h\x05.",
                                 b"\x80\x02\xff."], ids=["no MARK", "underflow", "truncated", "empty memo", "opcode"])
def test_malformed_pickles_are_named_corrupt(tmp_path, pkl):
    with pytest.raises(ModelFileError, match=r"bad\.pt: corrupt pickle in torch checkpoint: \w+"):
        read_pt(_torch_zip(tmp_path / "bad.pt", pkl))


def test_error_messages_are_short_and_quote_nothing_large(tmp_path):
    """A 1 MB global name and a 1 MB string in an odd place: the message stays one short line."""
    pkl = b"\x80\x02c" + b"m" * (1 << 20) + b"\nname\n."
    with pytest.raises(ModelFileError) as e:
        read_pt(_torch_zip(tmp_path / "long.pt", pkl))
    assert "refusing to load" in str(e.value) and len(str(e.value)) < 400
    pkl = b"\x80\x02" + _s("x" * (1 << 20)) + b"Q."
    with pytest.raises(ModelFileError, match="unexpected persistent id") as e:
        read_pt(_torch_zip(tmp_path / "pid.pt", pkl))
    assert len(str(e.value)) < 400


# ---- the other readers: activation_N.pt and predictor model_N.pt -----------------------------------------------

def test_activation_files_shape_is_checked_before_reading(tmp_path):
    """A counts tensor larger than the model's FFN is refused on its shape: its member (corrupt deflate data
    here) is never read."""
    folder = tmp_path / "activation"
    folder.mkdir()
    pkl = b"\x80\x02" + _tensor(numel=1 << 20, size=(1 << 20,)) + b"."
    _raw_zip(folder / "activation_0.pt", [("archive/data.pkl", 0, pkl, len(pkl)),
                                          ("archive/data/0", zipfile.ZIP_DEFLATED, b"\xff" * 65536, 4 << 20)])
    assert "layer 0 has 1048576 counts, the model's FFN has 16 neurons" in _read(folder, "activations")
    assert "layer 0 has 1048576 counts" in _read(folder / "activation_0.pt", "activations")


@pytest.mark.parametrize("kind", ["activations", "profile"])
@pytest.mark.parametrize("case", ["stride 0", "zip bomb", "build"])
def test_hostile_activation_files(tmp_path, kind, case):
    folder = tmp_path / "activation"
    folder.mkdir()
    path = folder / "activation_0.pt"
    if case == "stride 0":
        words = "stride 0"
        _torch_zip(path, b"\x80\x02" + _tensor(size=(16,), stride=(0,)) + b".")
        if kind == "profile":  # no model to compare with: the claimed size is huge
            _torch_zip(path, b"\x80\x02" + _tensor(size=(1 << 29,), stride=(0,)) + b".")
    elif case == "zip bomb":
        words = "looks like a zip bomb"
        _bomb_zip(path, b"\x80\x02" + _tensor(numel=16, size=(16,)) + b".", 2048)
    else:
        words = "BUILD on a torch object"
        _torch_zip(path, b"\x80\x02" + _tensor(after=_build(path="/proc/self/environ")) + b".")
    assert words in _read(folder, kind)


@pytest.mark.parametrize("case, words", [
    ("build", "BUILD on a torch object"), ("zip bomb", "looks like a zip bomb"), ("stride 0", "stride 0"),
    ("many keys", "(keys: "),
])
def test_hostile_predictor_files(tmp_path, case, words):
    folder = tmp_path / "predictor"
    folder.mkdir()
    fc1, fc2 = dict(numel=128, size=(16, 8), stride=(8, 1)), dict(numel=256, size=(16, 16), stride=(16, 1))
    storages = {"0": bytes(512), "1": bytes(1024)}
    items = {"fc1.weight": _tensor(**fc1), "fc2.weight": _tensor(key="1", **fc2)}
    path = folder / "model_0.pt"
    if case == "build":
        items["fc1.weight"] = _tensor(**fc1, after=_build(path="/proc/self/environ", offset=0))
    elif case == "stride 0":
        items["fc2.weight"] = _tensor(key="1", numel=256, size=(16, 16), stride=(0, 1))
    elif case == "many keys":
        del items["fc1.weight"]
        items.update({f"{'k' * 1000}{i}": _tensor(key="1", **fc2) for i in range(1000)})
    if case == "zip bomb":  # fc1's storage "0" is the bomb
        _bomb_zip(path, _state_dict(**items), 2048)
    else:
        _torch_zip(path, _state_dict(**items), storages)
    assert words in _read(folder, "predictor")


# ---- the CLI: `powerinfer convert` on a checkpoint with a hostile pytorch_model.bin ------------------------

DIMS = dict(n_layer=1, n_embd=32, n_ff=64, n_head=2, n_head_kv=2, n_vocab=512)


def _hostile_checkpoint(folder: Path, case: str) -> None:
    """A valid tiny LLaMA checkpoint whose pytorch_model.bin is rewritten by hand with one hostile tensor."""
    weights = llama_weights(np.random.default_rng(0), **DIMS)
    write_checkpoint(folder, llama_config(**DIMS), weights, layout="bin")
    items, storages = {}, {}
    for i, (name, w) in enumerate(weights.items()):
        strides = tuple(int(np.prod(w.shape[j + 1:])) for j in range(w.ndim))
        items[name] = _tensor(key=str(i), numel=w.size, size=w.shape, stride=strides)
        storages[str(i)] = w.astype(np.float32).tobytes()
    target = "model.norm.weight"
    i = list(weights).index(target)
    if case == "environ":  # what the probe did: 128 bytes of the environment as output_norm.weight
        items[target] = _tensor(key=str(i), numel=32, size=(32,), after=_build(path="/proc/self/environ", offset=0))
    elif case == "secret":
        items[target] = _tensor(key=str(i), numel=32, size=(32,),
                                after=_build(path=str(folder.parent / "secret.txt"), offset=0))
    elif case == "stride 0":  # the right shape, one stored value repeated
        items[target] = _tensor(key=str(i), numel=32, size=(32,), stride=(0,))
    path = folder / "pytorch_model.bin"
    if case == "zip bomb":  # storage "0", of the first tensor (model.embed_tokens.weight), is the bomb
        _bomb_zip(path, _state_dict(**items), 2048, storages=storages)
    else:
        _torch_zip(path, _state_dict(**items), storages)


@pytest.mark.parametrize("case, words", [("environ", "BUILD on a torch object"), ("secret", "BUILD on a torch object"),
                                         ("stride 0", "stride 0"), ("zip bomb", "looks like a zip bomb")])
def test_cli_convert_refuses_with_one_error_line(tmp_path, secret_file, case, words):
    hf, out_dir = tmp_path / "hf", tmp_path / "out"
    _hostile_checkpoint(hf, case)
    out_dir.mkdir()
    env = dict(os.environ, PI_HOSTILE_SECRET=SECRET, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "powerinfer_cli", "convert", str(hf), "-o", str(out_dir / "m.gguf"),
                           "--outtype", "f32"], capture_output=True, text=True, timeout=300, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "pytorch_model.bin" in lines[0] and words in lines[0]
    assert SECRET not in proc.stdout + proc.stderr
    assert os.listdir(out_dir) == []  # no output under the final name, no temporary file


def test_cli_convert_of_the_same_checkpoint_without_the_hostile_part_works(tmp_path):
    """The hand-written pickle of the CLI cases is itself valid: only the hostile part makes them fail."""
    hf, out = tmp_path / "hf", tmp_path / "m.gguf"
    _hostile_checkpoint(hf, "none")
    proc = subprocess.run([sys.executable, "-m", "powerinfer_cli", "convert", str(hf), "-o", str(out), "--outtype",
                           "f32"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from powerinfer_py.gguf import open_gguf

    with open_gguf(out) as f:
        assert f.metadata["general.architecture"] == "llama"
        assert f.tensors["output_norm.weight"].shape == (32,)
