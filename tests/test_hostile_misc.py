"""Hostile inputs that used to end in a traceback (issue 35, point 7, and the shard and SIGTERM holes of point 8).

Each case builds its bad input itself and runs the real command line in a subprocess (`python -m powerinfer_cli`,
the interpreter running the tests): the outcome must be exit 1 with exactly one `error:` line and no traceback,
and, for commands that write, nothing under the output's name and no temporary file left in its folder.
"""
from __future__ import annotations

import json
import math
import os
import resource
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from powerinfer_py.convert import write_safetensors
from powerinfer_py.gguf import open_gguf

from hub_server import FakeRepo, HubServer
from model_checks import rewrite_gguf


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)  # this checkout's packages, as the tests import them
    env.update(extra)
    return env


def cli(*args, env: dict | None = None, limit_bytes: int | None = None, timeout: float = 240):
    """Run `powerinfer ARGS` in a subprocess (address space capped at limit_bytes when given)."""
    def cap():
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "powerinfer_cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env or _env(), preexec_fn=cap)


def assert_one_error(proc, *words: str) -> str:
    """Exit 1, one `error:` line holding each of words (case-insensitive), no traceback; returns the line."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for w in words:
        assert w.lower() in errors[0].lower(), (w, errors[0])
    return errors[0]


def assert_nothing_written(out: Path) -> None:
    """No file under the output's name and no temporary (.part) file beside it."""
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


@pytest.fixture(scope="module")
def llama(synthetic_model) -> Path:
    return synthetic_model("llama", "f32")


def _run(path: Path, *extra):
    return cli("run", "-m", path, "hi", "-n", "1", "-t", "1", *extra)


# ---- GGUF metadata ----------------------------------------------------------------------------------------

def test_gguf_array_nested_2000_deep(tmp_path):
    """One key holding an array of an array of ... 2000 levels, then an empty u8 array: written by hand (the
    writer has no nested arrays)."""
    key = b"deep.key"
    body = struct.pack("<Q", len(key)) + key + struct.pack("<I", VT.ARRAY)
    body += struct.pack("<IQ", VT.ARRAY, 1) * 2000 + struct.pack("<IQ", VT.UINT8, 0)
    path = tmp_path / "deep.gguf"
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + body)
    assert_one_error(cli("info", path), "nested more than", str(path))
    assert_one_error(_run(path), "nested more than")


def test_block_count_2_to_the_32_minus_1(llama, tmp_path):
    bad = rewrite_gguf(llama, tmp_path / "blocks.gguf", {"llama.block_count": 2**32 - 1})
    assert_one_error(_run(bad), "llama.block_count", str(2**32 - 1), "blocks 0..1")


@pytest.mark.parametrize("value", [0.0, math.nan, -10000.0])
def test_rope_freq_base_zero_nan_negative(llama, tmp_path, value):
    bad = rewrite_gguf(llama, tmp_path / "rope.gguf", {"llama.rope.freq_base": value},
                       types={"llama.rope.freq_base": (VT.FLOAT32, None)})
    assert_one_error(_run(bad), "llama.rope.freq_base", "> 0")


@pytest.mark.parametrize("value", [math.nan, -1e-5, math.inf])
def test_rms_epsilon_nan_negative(llama, tmp_path, value):
    key = "llama.attention.layer_norm_rms_epsilon"
    bad = rewrite_gguf(llama, tmp_path / "eps.gguf", {key: value}, types={key: (VT.FLOAT32, None)})
    assert_one_error(_run(bad), key, ">= 0")


def test_layer_norm_epsilon_nan(synthetic_model, tmp_path):
    key = "gpt2.attention.layer_norm_epsilon"
    bad = rewrite_gguf(synthetic_model("gpt2", "f32"), tmp_path / "ln.gguf", {key: math.nan},
                       types={key: (VT.FLOAT32, None)})
    assert_one_error(_run(bad), key)


def test_vocabulary_longer_than_token_embd(llama, tmp_path):
    """tokenizer.ggml.tokens with 100 user-defined tokens more than token_embd has rows (llama.cpp's tokenizer
    then turns the text "<extra_5>" into id n + 5): without a size key, and with a size key matching the rows."""
    f = open_gguf(llama)
    n = len(f.metadata["tokenizer.ggml.tokens"])
    assert f.tensors["token_embd.weight"].shape[0] == n
    edit = {"tokenizer.ggml.tokens": f.metadata["tokenizer.ggml.tokens"] + [f"<extra_{i}>" for i in range(100)],
            "tokenizer.ggml.scores": f.metadata["tokenizer.ggml.scores"] + [0.0] * 100,
            "tokenizer.ggml.token_type": f.metadata["tokenizer.ggml.token_type"] + [4] * 100}  # user-defined
    f.close()
    types = {"tokenizer.ggml.tokens": (VT.ARRAY, VT.STRING), "tokenizer.ggml.scores": (VT.ARRAY, VT.FLOAT32),
             "tokenizer.ggml.token_type": (VT.ARRAY, VT.INT32)}
    bad = rewrite_gguf(llama, tmp_path / "vocab.gguf", edit, types=types)
    assert_one_error(cli("run", "-m", bad, "<extra_5> hi", "-n", "1", "-t", "1"), "token_embd", str(n + 100))
    sized = rewrite_gguf(bad, tmp_path / "sized.gguf", {"llama.vocab_size": n},
                         types={"llama.vocab_size": (VT.UINT32, None)})
    assert_one_error(cli("run", "-m", sized, "<extra_5> hi", "-n", "1", "-t", "1"), "token_embd", str(n + 100),
                     "llama.vocab_size")


def test_context_whose_kv_cache_cannot_be_allocated(llama):
    """-c 100000000: 25.6 GB of f16 K/V planes for this model; 4 GiB of address space cannot hold them."""
    proc = cli("run", "-m", llama, "hi", "-n", "1", "-t", "1", "-c", "100000000", limit_bytes=4 << 30)
    line = assert_one_error(proc, "-c", "100000000", "25.6 GB")
    assert "KV cache" in line


# ---- convert: JSON and shards -----------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "9" * 5000
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64}


def _checkpoint(folder: Path, config_text: str | None = None) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(config_text if config_text is not None else json.dumps(LLAMA_CONFIG))
    return folder


def _convert(folder: Path, out: Path):
    proc = cli("convert", folder, "-o", out)
    assert_nothing_written(out)
    return proc


@pytest.mark.parametrize("text, words", [(DEEP, ("config.json", "nested too deeply")),
                                         ('{"hidden_size": ' + HUGE_INT + "}", ("config.json", "digits"))],
                         ids=["deep", "huge-int"])
def test_convert_config_json_deep_or_huge_integer(tmp_path, text, words):
    folder = _checkpoint(tmp_path / "ckpt", text)
    write_safetensors(folder / "model.safetensors", {"w": ("F32", np.zeros(4, np.float32))})
    assert_one_error(_convert(folder, tmp_path / "out.gguf"), *words)


def _safetensors_with_header(path: Path, header: str) -> None:
    raw = header.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


@pytest.mark.parametrize("header, words", [
    (DEEP, ("model.safetensors", "nested too deeply")),
    ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, ' + HUGE_INT + "]}}", ("model.safetensors", "digits"))],
    ids=["deep", "huge-int"])
def test_convert_safetensors_header_deep_or_huge_integer(tmp_path, header, words):
    folder = _checkpoint(tmp_path / "ckpt")
    _safetensors_with_header(folder / "model.safetensors", header)
    assert_one_error(_convert(folder, tmp_path / "out.gguf"), *words)


def _sharded(folder: Path, shard: str) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))


def test_convert_weight_map_outside_the_folder(tmp_path):
    """The shard names ../, an absolute path and a link to a file outside: each a real safetensors file holding
    the listed tensor, so the refusal is about where it lies and nothing else."""
    outside = write_safetensors(tmp_path / "outside.safetensors", {"w": ("F32", np.ones(4, np.float32))})
    cases = {"dotdot": ("../outside.safetensors", "not a file name inside"),
             "absolute": (str(outside), "not a file name inside"),
             "nested": ("sub/../../outside.safetensors", "not a file name inside"),
             "link": ("link.safetensors", "outside the checkpoint folder")}
    for label, (shard, words) in cases.items():
        folder = _checkpoint(tmp_path / label)
        (folder / "sub").mkdir()
        (folder / "link.safetensors").symlink_to(outside)
        _sharded(folder, shard)
        assert_one_error(_convert(folder, tmp_path / f"{label}.gguf"), words)


def test_weight_map_links_inside_the_folder_still_work(tmp_path):
    """The check must not refuse what is fine: a link to a shard inside the folder opens (no error from the
    shard check; the tiny checkpoint then fails later, for its missing tensors, with a different message)."""
    from powerinfer_py.convert import Checkpoint

    folder = _checkpoint(tmp_path / "ok")
    (folder / "real").mkdir()
    write_safetensors(folder / "real" / "shard.safetensors", {"w": ("F32", np.ones(4, np.float32))})
    (folder / "link.safetensors").symlink_to(folder / "real" / "shard.safetensors")
    _sharded(folder, "link.safetensors")
    assert set(Checkpoint(folder).tensors) == {"w"}


# ---- Hub names --------------------------------------------------------------------------------------------

BAD_NAMES = ["../escape.gguf", "/etc/abs.gguf", "sub\\..\\win.gguf", "C:/drive.gguf", "a/C:x.gguf"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_hub_file_names_the_library_rejects(tmp_path, name):
    repo = FakeRepo("Org/Hostile-GGUF", {name: b"GGUF" + bytes(100), "README.md": b"# x\n"})
    env = _env(HF_HOME=str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        env.pop(var, None)
    with HubServer([repo], max_lifetime_s=120) as srv:
        env["HF_ENDPOINT"] = srv.url
        proc = cli("download", "Org/Hostile-GGUF", env=env)
    assert_one_error(proc, "Org/Hostile-GGUF", "not a plain relative path")
    assert not any(p.name.endswith(".gguf") for p in tmp_path.rglob("*")), list(tmp_path.rglob("*"))


# ---- SIGTERM while writing --------------------------------------------------------------------------------

def test_sigterm_during_quantize_leaves_no_file(synthetic_model, tmp_path):
    """A q8_0 re-encode of a model big enough to take a few seconds: SIGTERM once the temporary file is being
    written; the process still ends of the signal, and neither the output nor its .part file remains."""
    src = synthetic_model("llama", "f32", n_embd=512, n_ff=2048, n_layer=8, n_vocab=2048)
    out = tmp_path / "out.gguf"
    proc = subprocess.Popen([sys.executable, "-m", "powerinfer_cli", "quantize", str(src), str(out), "q8_0",
                             "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 120
        part = []
        while time.monotonic() < deadline and proc.poll() is None:
            part = [p for p in tmp_path.iterdir() if p.name.startswith(".out.gguf.") and p.stat().st_size > 0]
            if part:
                break
            time.sleep(0.02)
        assert part, "the temporary file never appeared (quantize ended too soon: make the model bigger)"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, stderr)  # ended by the signal, as by default
    assert "Traceback" not in stderr, stderr
    assert_nothing_written(out)


def test_sigterm_handler_is_restored_after_a_write(tmp_path):
    """outfile's handler lives only while a temporary file exists; a handler someone else set is left alone."""
    from powerinfer_py.outfile import atomic_output

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with atomic_output(tmp_path / "x.bin") as tmp:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            tmp.write_bytes(b"x")
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert (tmp_path / "x.bin").read_bytes() == b"x"

        def own(signum, frame):
            pass

        signal.signal(signal.SIGTERM, own)
        with atomic_output(tmp_path / "y.bin") as tmp:
            assert signal.getsignal(signal.SIGTERM) is own
            tmp.write_bytes(b"y")
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_write_safetensors_is_atomic(tmp_path):
    """An error halfway (an array that cannot be written) leaves neither the target nor a temporary file, and
    an existing target is untouched."""
    target = tmp_path / "w.safetensors"
    target.write_bytes(b"old")

    class FailsAfterOne(dict):  # the header sees both tensors; writing the data fails after the first
        def values(self):
            yield from list(super().values())[:1]
            raise OSError(5, "simulated I/O error")

    tensors = FailsAfterOne(a=("F32", np.ones(2, np.float32)), b=("F32", np.zeros(4, np.float32)))
    with pytest.raises(OSError, match="simulated"):
        write_safetensors(target, tensors)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


# ---- server request bodies --------------------------------------------------------------------------------

@pytest.mark.parametrize("body, words", [(DEEP, "nested too deeply"),
                                         ('{"max_tokens": ' + HUGE_INT + "}", "too many digits")],
                         ids=["deep", "huge-int"])
def test_server_json_body_deep_or_huge_integer_is_a_400(body, words):
    from powerinfer_py.serve import api

    with pytest.raises(api.ApiError) as err:
        api.parse_body(body.encode())
    assert err.value.status == 400 and words in str(err.value)


# ---- statistics and session files: zip bombs and deep JSON ------------------------------------------------------

def test_activation_npz_zip_bomb_is_refused_before_it_is_inflated(tmp_path):
    """A .npz whose member inflates to 1 GiB (a few MB on disk) is refused from the sizes the archive declares,
    in a child under an address-space limit far below what inflating it would take."""
    import zipfile

    bomb = tmp_path / "stats.npz"
    header = b"\x93NUMPY\x01\x00" + struct.pack("<H", 118) + (
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 67108864), }".ljust(117) + b"\n")
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("arr_0.npy", "w", force_zip64=True) as f:
            f.write(header)
            zeros = bytes(1 << 20)
            for _ in range(1024):
                f.write(zeros)
    assert bomb.stat().st_size < 8 << 20
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))\n"
            "from powerinfer_py.errors import PowerInferError\n"
            "from powerinfer_py.hybrid.activations import load_activations\n"
            "try:\n    load_activations(sys.argv[1], 2, 512)\n"
            "except PowerInferError as e:\n    print('refused:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 0 and proc.stdout.startswith("refused:"), proc.stdout + proc.stderr
    assert "more than counts for 2 x 512 neurons take" in proc.stdout


def test_activation_npz_that_fits_still_reads(tmp_path):
    from powerinfer_py.hybrid.activations import load_activations

    counts = np.arange(2 * 16, dtype=np.float64).reshape(2, 16)
    np.savez(tmp_path / "ok.npz", counts)
    got = load_activations(tmp_path / "ok.npz", 2, 16)
    assert [g.tolist() for g in got] == counts.tolist()


def test_deep_or_huge_json_in_statistics_profile_and_session_files(tmp_path, llama):
    from powerinfer_py import load
    from powerinfer_py.chat import ChatSession, template_for
    from powerinfer_py.errors import PowerInferError
    from powerinfer_py.hybrid.activations import load_activations
    from powerinfer_py.tools.profile import load_profile

    for text, words in ((DEEP, "nested too deeply"), ('{"layers": ' + HUGE_INT + "}", "digits")):
        (tmp_path / "stats.json").write_text(text)
        with pytest.raises(PowerInferError, match=words):
            load_activations(tmp_path / "stats.json", 2, 16)
        (tmp_path / "prof").mkdir(exist_ok=True)
        (tmp_path / "prof" / "profile.json").write_text(text)
        with pytest.raises(PowerInferError, match=words):
            load_profile(tmp_path / "prof")
        session = tmp_path / "chat.json"  # what chat's /load reads
        session.write_text(text)
        with load(llama, threads=1, n_ctx=64) as llm:
            with pytest.raises(PowerInferError, match="chat.json is not a saved conversation"):
                ChatSession(llm, template_for(llm)).load(session)
