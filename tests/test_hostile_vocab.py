"""Crafted vocabularies: tokenizer.* metadata that used to abort the process inside llama.cpp (exit 134, a native
backtrace) or that means nothing is refused with one `error:` line naming the file and the key.

Each case rewrites the metadata of a tiny synthetic llama model (the tensors stay, with the embedding and output
rows cut to the new vocabulary size where it shrinks, so the tokenizer is what the file fails on). The cases
marked ABORTS are also run straight through llama.cpp in a child process, without our checks, to show that the
check stands in front of a real abort and is not a guess.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType as T

from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf, write_gguf
from powerinfer_py.gguf.types import Tensor
from powerinfer_py.tokenizer import Tokenizer

K = "tokenizer.ggml."
STRINGS, FLOATS, INTS = (T.ARRAY, T.STRING), (T.ARRAY, T.FLOAT32), (T.ARRAY, T.INT32)
TEXT = "hi é 🤗"


def _vocab(tokens: list[str]) -> dict:
    """Edits that replace the vocabulary by `tokens` (all normal, score 0)."""
    return {K + "tokens": (tokens, STRINGS), K + "scores": ([0.0] * len(tokens), FLOATS),
            K + "token_type": ([1] * len(tokens), INTS)}


def _with(tokens: list[str], i: int, text: str) -> list[str]:
    out = list(tokens)
    out[i] = text
    return out


def _cases(tokens: list[str], types: list[int]) -> list[tuple[str, dict, str, bool]]:
    """(id, metadata edits (key -> (value, type) or None to drop), text the error must contain, ABORTS)."""
    n = len(tokens)
    no_bytes = [t for t in tokens if not t.startswith("<0x")]
    no_special = {K + "bos_token_id": None, K + "eos_token_id": None, K + "unknown_token_id": None}
    gpt2 = {K + "model": ("gpt2", None), K + "merges": (["a b"], STRINGS)}
    return [
        ("tokens-empty", {**_vocab([]), **no_special}, K + "tokens is empty", True),
        ("tokens-one", {**_vocab(["a"]), **no_special},
         K + "add_bos_token: the vocabulary adds a BOS token", True),
        ("tokens-one-bos-out", _vocab(["a"]), K + "bos_token_id is 1, outside the vocabulary", False),
        ("tokens-one-no-bos", {**_vocab(["a"]), **no_special, K + "add_bos_token": (False, None)},
         K + "tokens has no token for 'h'", True),
        ("tokens-no-byte-tokens", {**_vocab(no_bytes), K + "token_type": ([2, 3, 3] + [1] * (len(no_bytes) - 3), INTS)},
         K + "tokens has no token for 'é'", True),
        ("tokens-duplicate", {K + "tokens": (_with(tokens, 300, tokens[301]), STRINGS)},
         f"{K}tokens has the token {tokens[301]!r} twice, ids 300 and 301", True),
        ("tokens-duplicate-control", {K + "tokens": (_with(tokens, 2, "<s>"), STRINGS)},
         f"{K}tokens has the token '<s>' twice, ids 1 and 2", True),
        ("tokens-duplicate-after-nul", {K + "tokens": (_with(_with(tokens, 300, "x\0a"), 301, "x\0b"), STRINGS)},
         "(up to its first NUL byte) twice", True),
        ("tokens-empty-vs-marker", {K + "tokens": (_with(_with(tokens, 300, ""), 301, "[EMPTY_300]"), STRINGS)},
         "'[EMPTY_300]' twice", True),
        ("tokens-not-strings", {K + "tokens": (list(range(n)), INTS)}, K + "tokens must be an array of strings", False),
        ("tokens-missing", {K + "tokens": None}, K + "tokens is missing", False),
        ("model-bert", {K + "model": ("bert", None)}, K + "model is 'bert', a tokenizer this version does not run",
         True),
        ("model-none", {K + "model": ("none", None)}, K + "model is 'none': the file carries no vocabulary", True),
        ("model-no-vocab", {K + "model": ("no_vocab", None)}, K + "model is 'no_vocab'", True),
        ("model-t5", {K + "model": ("t5", None)}, K + "model is 't5'", False),
        ("model-number", {K + "model": (5, None)}, K + "model must be a string", False),
        ("model-missing", {K + "model": None}, K + "model is missing", False),
        ("scores-short", {K + "scores": ([0.0] * (n - 1), FLOATS)}, f"{K}scores has {n - 1} entries for {n} tokens",
         False),
        ("scores-long", {K + "scores": ([0.0] * (n + 5), FLOATS)}, f"{K}scores has {n + 5} entries", False),
        ("scores-strings", {K + "scores": (["a"] * n, STRINGS)}, K + "scores must be an array of float32 or int32",
         False),
        ("token-type-long", {K + "token_type": (types + [1], INTS)}, f"{K}token_type has {n + 1} entries", False),
        ("token-type-float", {K + "token_type": ([1.0] * n, FLOATS)}, K + "token_type must be an array of int32",
         False),
        ("token-type-byte-on-a-word", {K + "token_type": (_with(types, 300, 6), INTS)},
         K + "token_type marks token 300", False),
        ("merges-not-strings", {**gpt2, K + "merges": ([1, 2, 3], INTS)}, K + "merges must be an array of strings",
         False),
        ("merges-missing", {**gpt2, K + "merges": None}, K + "merges is missing", False),
        ("gemma4-without-bos", {K + "model": ("gemma4", None), K + "merges": (["a b"], STRINGS),
                                K + "bos_token_id": None, K + "add_bos_token": (False, None)},
         K + "add_bos_token: the vocabulary adds a BOS token", True),
        ("bos-out-of-range", {K + "bos_token_id": (n, (T.UINT32, None))}, f"{K}bos_token_id is {n}, outside", False),
        ("bos-uint32-max", {K + "bos_token_id": (2**32 - 1, (T.UINT32, None))}, K + "bos_token_id is 4294967295",
         False),
        ("eos-out-of-range", {K + "eos_token_id": (n + 7, (T.UINT32, None))}, f"{K}eos_token_id is {n + 7}", False),
        ("eos-a-string", {K + "eos_token_id": ("2", None)}, K + "eos_token_id must be a token id", False),
    ]


def _rewrite(src: Path, dst: Path, edits: dict) -> Path:
    """src with `edits` applied to its metadata; token_embd/output cut to the new vocabulary's rows."""
    f = open_gguf(src)
    meta, types = dict(f.metadata), dict(f.metadata_types)
    for key, edit in edits.items():
        meta.pop(key, None)
        types.pop(key, None)
        if edit is not None:
            meta[key] = edit[0]
            if edit[1] is not None:
                types[key] = edit[1]
    n_old = len(f.metadata[K + "tokens"])
    tokens = meta.get(K + "tokens")
    n_new = len(tokens) if isinstance(tokens, list) and tokens and isinstance(tokens[0], str) else n_old
    tensors = []
    for t in f.tensors.values():
        if t.name in ("token_embd.weight", "output.weight") and t.shape[0] == n_old and n_new < n_old:
            t = Tensor(t.name, t.type, (n_new,) + t.shape[1:], t.data[:n_new].copy())
        tensors.append(t)
    return write_gguf(dst, meta, tensors, types=types)


@pytest.fixture(scope="module")
def base(synthetic_model) -> Path:
    return synthetic_model("llama")


@pytest.fixture(scope="module")
def cases(base):
    meta = open_gguf(base).metadata
    return {c[0]: c for c in _cases(list(meta[K + "tokens"]), list(meta[K + "token_type"]))}


CASE_IDS = [c[0] for c in _cases(["t"] * 512, [1] * 512)]  # the ids only: the values need the real vocabulary


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _cli(args: list, env_cache: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, POWERINFER_CACHE=str(env_cache))
    return subprocess.run([sys.executable, "-m", "powerinfer_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=_no_core)


@pytest.mark.parametrize("case", CASE_IDS)
def test_run_refuses_the_vocabulary_with_one_error_line(case, cases, base, tmp_path):
    _, edits, message, _aborts = cases[case]
    bad = _rewrite(base, tmp_path / f"{case}.gguf", edits)
    proc = _cli(["run", "-m", bad, TEXT, "-n", "2"], tmp_path / "cache")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: "), proc.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not list(tmp_path.glob("core*"))


_RAW_LOAD = r"""
import ctypes, sys
import llama_cpp as lc
quiet = lc.llama_log_callback(lambda *a: None)  # kept referenced: llama.cpp calls it until the end
lc.llama_log_set(quiet, ctypes.c_void_p(0))
params = lc.llama_model_default_params()
params.vocab_only = True
model = lc.llama_model_load_from_file(sys.argv[1].encode(), params)
if not model:
    print("refused"); sys.exit(0)
vocab = lc.llama_model_get_vocab(model)
text = sys.argv[2].encode()
buf = (lc.llama_token * 64)()
print("tokenized", lc.llama_tokenize(vocab, text, len(text), buf, 64, True, True))
"""


@pytest.mark.parametrize("case", [c for c in CASE_IDS if c in
                                  ("tokens-empty", "tokens-one", "tokens-one-no-bos", "tokens-no-byte-tokens",
                                   "tokens-duplicate", "tokens-duplicate-after-nul", "tokens-empty-vs-marker",
                                   "model-bert", "model-none", "gemma4-without-bos")])
def test_llama_cpp_itself_aborts_on_what_is_refused(case, cases, base, tmp_path):
    """Without our checks, llama.cpp kills the process (SIGABRT) on these: why they are refused up front."""
    _, edits, _, aborts = cases[case]
    assert aborts
    bad = _rewrite(base, tmp_path / f"{case}.gguf", edits)
    proc = subprocess.run([sys.executable, "-c", _RAW_LOAD, str(bad), TEXT], capture_output=True, text=True,
                          timeout=120, preexec_fn=_no_core)
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stdout, proc.stderr[-500:])


def test_what_llama_cpp_accepts_still_loads(base, tmp_path):
    """Not refused: empty token strings (llama.cpp names each [EMPTY_<id>], so two are distinct), special ids
    other than BOS/EOS out of range (llama.cpp disables them: real files have such), unknown token types, and a
    gpt2 vocabulary with its merges."""
    meta = open_gguf(base).metadata
    tokens, n = list(meta[K + "tokens"]), len(meta[K + "tokens"])
    reference = Tokenizer(base, cache_dir=tmp_path / "cache")
    for name, edits in [
            ("two-empty", {K + "tokens": (_with(_with(tokens, 300, ""), 301, ""), STRINGS)}),
            ("pad-out", {K + "padding_token_id": (n + 3, (T.UINT32, None)),
                         K + "unknown_token_id": (n + 9, (T.UINT32, None))}),
            ("odd-types", {K + "token_type": ([1, 3, 3] + [99] * (n - 3), INTS)}),
            ("gpt2", {K + "model": ("gpt2", None), K + "merges": (["▁ t", "h e"], STRINGS)})]:
        tok = Tokenizer(_rewrite(base, tmp_path / f"{name}.gguf", edits), cache_dir=tmp_path / "cache")
        ids = tok.encode("the cat")
        assert ids and all(0 <= i < n for i in ids), name
        if name != "gpt2":  # the same SentencePiece vocabulary tokenizes as before
            assert ids == reference.encode("the cat"), name
        tok.close()
    reference.close()


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "mamba2", "qwen35"])
def test_synthetic_files_pass(synthetic_model, arch):
    """The checks accept what powerinfer_py.synth*.py write (every writer takes synth.tokenizer_metadata, so
    a few writers stand for all the architecture tests)."""
    tok = Tokenizer(synthetic_model(arch))
    assert tok.encode("hello world", add_bos=False)
    tok.close()


def test_the_demo_model_passes(real_model):
    tok = Tokenizer(real_model)
    assert tok.n_vocab == 262144 and tok.decode(tok.encode("héllo 🤗")) == "héllo 🤗"
    tok.close()


def test_a_refused_vocabulary_leaves_nothing_in_the_cache(cases, base, tmp_path):
    bad = _rewrite(base, tmp_path / "dup.gguf", cases["tokens-duplicate"][1])
    with pytest.raises(ModelFileError, match="twice"):
        Tokenizer(bad, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # refused before any vocab-only copy was written
