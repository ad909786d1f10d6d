"""Tokenizer: llama.cpp's own, through llama-cpp-python's low-level bindings, loaded vocab-only.

Using llama.cpp's tokenizer means every vocabulary type it knows (SentencePiece, BPE with its many
pre-tokenizers, WordPiece, Unigram, ...) tokenizes exactly as llama.cpp does, which the golden tests against
llama.cpp rely on. A vocab-only load reads the metadata and skips the tensors (about 0.4 s for a
262144-token vocabulary).

llama.cpp rejects files whose magic is PWRI (PowerInfer's sparse models) and architectures it does not know
(bamboo, opt). For those we hand it a vocab-only copy: a GGUF with the source's metadata and no tensors,
written once into a cache folder under a name derived from a hash of the metadata, so later loads reuse it.
If llama.cpp does not know the architecture, the copy says general.architecture = "llama": a vocab-only load
never reads the architecture's hyperparameters, only the tokenizer.ggml.* keys.

llama.cpp trusts the tokenizer.* keys: some crafted values abort the whole process inside its vocab loader or
tokenizer (an assertion or an uncaught C++ exception: exit 134, no Python error). check_vocabulary() refuses
those first, each with a message naming the key; see its docstring for the list and why each one is there.

llama.cpp's log output is captured while the vocabulary loads (and shown only in an error), so loading a
tokenizer prints nothing; the previous log callback is put back afterwards.
"""
from __future__ import annotations

import codecs
import ctypes
import hashlib
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .errors import ModelFileError
from gguf import GGUFValueType

from .gguf import GGUFFile, read_metadata_only, write_gguf

_LOG_ERROR = 4  # ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_FALLBACK_ARCH = "llama"
_log_lock = threading.Lock()  # llama.cpp's log callback is process-global


def _llama():
    """The llama_cpp module, imported on first use (importing it loads a large shared library)."""
    import llama_cpp
    return llama_cpp


def default_cache_dir() -> Path:
    """$POWERINFER_CACHE/vocab if set, else ~/.cache/powerinfer/vocab."""
    from .demo import cache_dir

    return cache_dir() / "vocab"


@contextmanager
def _captured_log() -> Iterator[list[str]]:
    """Route llama.cpp's log into a list of error lines for the duration of the block, then restore."""
    lc = _llama()
    errors: list[str] = []
    level = [0]

    @lc.llama_log_callback
    def collect(lvl, text, _user_data):
        lvl = level[0] if lvl == 5 else lvl  # CONT continues the previous message's level
        level[0] = lvl
        if lvl == _LOG_ERROR and text:
            errors.append(text.decode("utf-8", "replace").strip())

    with _log_lock:
        prev_cb, prev_ud = lc.llama_log_callback(), ctypes.c_void_p()
        lc.llama_log_get(ctypes.byref(prev_cb), ctypes.byref(prev_ud))
        lc.llama_log_set(collect, ctypes.c_void_p(0))
        try:
            yield errors
        finally:
            lc.llama_log_set(prev_cb, prev_ud)


def _load_vocab_model(path: Path) -> tuple[object | None, list[str]]:
    """llama_model_load_from_file(path, vocab_only): (model pointer or None, llama.cpp's error lines)."""
    lc = _llama()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    with _captured_log() as errors:
        model = lc.llama_model_load_from_file(str(path).encode(), params)
    return (model or None), errors


# tokenizer.ggml.model values of the architectures this project runs: SentencePiece ("llama": Llama, Gemma 1-3,
# Phi-3, MiniCPM, ...), byte-level BPE ("gpt2": Qwen, GPT-OSS, DeepSeek, GLM, OLMo, ...) and Gemma 4's BPE with
# byte fallback ("gemma4"). llama.cpp knows others (bert, t5, rwkv, plamo2, ...): encoders or models we do not
# run, and "none"/"no_vocab", which loads but aborts at the first tokenize call.
TOKENIZER_MODELS = {"llama": "SentencePiece", "gpt2": "byte-level BPE", "gemma4": "Gemma 4 BPE"}
_NO_VOCAB = ("none", "no_vocab")
_TOKEN_TYPE_BYTE = 6  # llama_token_type BYTE: a <0xXX> byte-fallback token
_K = "tokenizer.ggml."


def _token_keys(tokens: Sequence[str]) -> list[str]:
    """The strings llama.cpp files the tokens under: a GGUF string read as a C string (up to its first NUL),
    an empty one as "[EMPTY_<id>]"."""
    if "\0" not in "".join(tokens) and all(tokens):  # the usual case, at C speed (262144-token vocabularies)
        return list(tokens)
    keys = list(tokens)
    for i, t in enumerate(keys):
        if not t or "\0" in t:
            t = t.split("\0", 1)[0]
            keys[i] = t or f"[EMPTY_{i}]"
    return keys


def check_vocabulary(f: GGUFFile) -> set[str]:
    """Refuse tokenizer.* values that make llama.cpp abort the process, or that mean nothing; ModelFileError
    naming the file and the key. Each was tried with llama.cpp itself (tests/test_hostile_vocab.py):
      - tokenizer.ggml.model other than those in TOKENIZER_MODELS ("none" and "bert" abort when text is
        tokenized);
      - tokenizer.ggml.tokens missing, not strings, empty (aborts), or with the same string twice as llama.cpp
        reads them (_token_keys; aborts the load: its token -> id map must have one entry per token);
      - scores / token_type of another type or length than the tokens (shorter is a clean llama.cpp error,
        longer means nothing), a BYTE token_type on a token that is not <0xXX>;
      - merges of a BPE vocabulary missing or not strings;
      - bos/eos ids outside the vocabulary (llama.cpp would silently substitute a default id).
    Other special ids (padding, unknown, ...) out of range are left to llama.cpp, which disables them with a
    warning: real files have those. A BOS or EOS the vocabulary must add but lacks is checked after loading
    (_check_loaded), where llama.cpp's own defaults are known. Returns the tokens as llama.cpp files them."""
    check = _VocabCheck(f)
    model = check.model()
    tokens, keys = check.tokens()
    check.arrays(tokens)
    check.merges(model)
    check.special_ids(len(tokens))
    return keys


class _VocabCheck:
    """The steps of check_vocabulary, over one file's metadata."""

    def __init__(self, f: GGUFFile):
        self.path, self.meta, self.types = f.path, f.metadata, f.metadata_types

    def fail(self, key: str, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {key} {problem}")

    def is_array(self, key: str, *elements: GGUFValueType) -> bool:
        vtype, sub = self.types.get(key, (None, None))
        return vtype == GGUFValueType.ARRAY and sub in elements

    def model(self) -> str:
        key = _K + "model"
        model = self.meta.get(key)
        if model is None:
            raise self.fail(key, "is missing: the file has no vocabulary to tokenize text with")
        if not isinstance(model, str):
            raise self.fail(key, f"must be a string, got {type(model).__name__}")
        if model in _NO_VOCAB:
            raise self.fail(key, f"is {model!r}: the file carries no vocabulary, and running a model needs one")
        if model not in TOKENIZER_MODELS:
            known = ", ".join(f"{name} ({what})" for name, what in TOKENIZER_MODELS.items())
            raise self.fail(key, f"is {_short(model)}, a tokenizer this version does not run; supported: {known}")
        return model

    def tokens(self) -> tuple[Sequence[str], set[str]]:
        key = _K + "tokens"
        tokens = self.meta.get(key)
        if tokens is None:
            raise self.fail(key, "is missing: the file has no vocabulary")
        if not self.is_array(key, GGUFValueType.STRING):
            raise self.fail(key, "must be an array of strings")
        if len(tokens) == 0:
            raise self.fail(key, "is empty")
        keys = _token_keys(tokens)
        distinct = set(keys)
        if len(distinct) != len(tokens):
            seen: dict[str, int] = {}
            for i, k in enumerate(keys):
                j = seen.setdefault(k, i)
                if j != i:
                    how = "" if tokens[i] == k else " (up to its first NUL byte)" if "\0" in tokens[i] else " (empty)"
                    raise self.fail(key, f"has the token {_short(k)}{how} twice, ids {j} and {i}: every token "
                                         "must be distinct")
        return tokens, distinct

    def arrays(self, tokens: Sequence[str]) -> None:
        n = len(tokens)
        for name, elements in (("scores", (GGUFValueType.FLOAT32, GGUFValueType.INT32)),
                               ("token_type", (GGUFValueType.INT32,))):
            key = _K + name
            if key not in self.meta:
                continue
            if not self.is_array(key, *elements):
                raise self.fail(key, f"must be an array of {' or '.join(e.name.lower() for e in elements)}")
            if len(self.meta[key]) != n:
                raise self.fail(key, f"has {len(self.meta[key])} entries for {n} tokens")
        token_types = self.meta.get(_K + "token_type")
        if token_types is not None:
            for i in np.flatnonzero(np.asarray(token_types, dtype=np.int64) == _TOKEN_TYPE_BYTE):
                if not _is_byte_token(tokens[i]):
                    raise self.fail(_K + "token_type", f"marks token {i} ({_short(tokens[i])}) as a byte token, "
                                                       "which must read <0x00> to <0xFF>")

    def merges(self, model: str) -> None:
        key = _K + "merges"
        if model != "llama" and key not in self.meta and self.meta.get(_K + "pre") != "kimi-k2":
            raise self.fail(key, f"is missing: a {model} vocabulary needs its BPE merges")
        if key in self.meta and not self.is_array(key, GGUFValueType.STRING):
            raise self.fail(key, "must be an array of strings")

    def special_ids(self, n: int) -> None:
        for name in ("bos_token_id", "eos_token_id"):
            key = _K + name
            value = self.meta.get(key)
            if value is None:
                continue
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise self.fail(key, f"must be a token id (an integer), got {type(value).__name__}")
            if not 0 <= value < n:
                raise self.fail(key, f"is {value}, outside the vocabulary (ids 0 to {n - 1})")


def _is_byte_token(text: str) -> bool:
    return len(text) == 6 and text.startswith("<0x") and text.endswith(">") and all(
        c in "0123456789ABCDEFabcdef" for c in text[3:5])


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _missing_bytes(keys: set[str]) -> frozenset[int]:
    """Bytes a SentencePiece vocabulary (its tokens as _token_keys gives them) cannot spell: neither a <0xXX>
    token nor the byte alone as a token. llama.cpp's SentencePiece tokenizer falls back to those for a
    character that is not a token, and aborts when both are missing, so encode() refuses such text instead.
    Empty for real vocabularies."""
    return frozenset(b for b in range(256) if f"<0x{b:02X}>" not in keys
                     and bytes([b]).decode("utf-8", "surrogateescape") not in keys)


def metadata_hash(f: GGUFFile) -> str:
    """A short content hash of a file's metadata (keys, value types and values), for cache file names."""
    h = hashlib.sha256()
    for key, value in f.metadata.items():
        vtype, sub = f.metadata_types.get(key, (None, None))
        h.update(f"{key}\0{vtype}\0{sub}\0".encode("utf-8", "surrogateescape"))
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], str):
            h.update("\0".join(value).encode("utf-8", "surrogateescape"))
        elif isinstance(value, (list, tuple, np.ndarray)):
            h.update(np.asarray(value).tobytes())
        else:
            h.update(repr(value).encode("utf-8", "surrogateescape"))
        h.update(b"\1")
    return h.hexdigest()[:24]


def write_vocab_copy(f: GGUFFile, cache_dir: Path, arch: str | None = None, digest: str | None = None) -> Path:
    """A GGUF with f's metadata and no tensors in cache_dir (reused if present); arch overrides the
    general.architecture it declares. `digest` is metadata_hash(f) if the caller has it already."""
    path = _copy_path(f, cache_dir, arch, digest)
    if path.exists():
        return path
    metadata = dict(f.metadata)
    if arch:
        metadata["general.architecture"] = arch
    cache_dir.mkdir(parents=True, exist_ok=True)
    return write_gguf(path, metadata, [], types=f.metadata_types)  # atomic: concurrent writers are safe


def _copy_path(f: GGUFFile, cache_dir: Path, arch: str | None, digest: str | None) -> Path:
    return cache_dir / f"{digest or metadata_hash(f)}{f'-{arch}' if arch else ''}.gguf"


class Tokenizer:
    """llama.cpp's tokenizer for a model file (a GGUFFile or a path to a GGUF or PWRI file)."""

    def __init__(self, gguf_file: GGUFFile | str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        f = gguf_file if isinstance(gguf_file, GGUFFile) else read_metadata_only(gguf_file)
        self.path = Path(f.path)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        keys = check_vocabulary(f)
        self.vocab_path, self._model = self._load(f)
        lc = _llama()
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self.bos_id = int(lc.llama_vocab_bos(self._vocab))  # -1 if the vocabulary has none
        self.eos_id = int(lc.llama_vocab_eos(self._vocab))
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self._vocab))
        self._pieces: dict[tuple[int, bool], bytes] = {}
        try:
            self._check_loaded()
        except ModelFileError:
            self.close()
            raise
        # a SentencePiece vocabulary that cannot spell some bytes keeps its tokens, for _check_spellable
        self._missing_bytes = _missing_bytes(keys) if f.metadata[_K + "model"] == "llama" else frozenset()
        self._keys = keys if self._missing_bytes else set()
        self._space_prefix = f.metadata.get(_K + "add_space_prefix", True) is not False

    def _check_loaded(self) -> None:
        """llama.cpp asserts, when it tokenizes with special tokens, that a BOS (EOS) it must add exists: with
        the defaults it applies known only now, refuse a vocabulary where it does not."""
        lc = _llama()
        for what, add, tid in (("bos", self.add_bos, self.bos_id),
                               ("eos", lc.llama_vocab_get_add_eos(self._vocab), self.eos_id)):
            if add and tid < 0:
                raise ModelFileError(f"{self.path}: {_K}add_{what}_token: the vocabulary adds a {what.upper()} "
                                     f"token to every text but has none ({_K}{what}_token_id names no token)")

    def _load(self, f: GGUFFile) -> tuple[Path, object]:
        """Try the file itself (GGUF only), then a vocab-only copy, then a copy declaring a known arch.
        A copy llama.cpp cannot load is deleted again, so broken files leave nothing in the cache."""
        digest = metadata_hash(f)
        arch = f.metadata.get("general.architecture")
        fallback_known = _copy_path(f, self.cache_dir, _FALLBACK_ARCH, digest).exists()
        candidates: list[tuple[str | None, bool]] = []  # (arch override, is a copy)
        if f.magic == "GGUF":
            candidates.append((None, False))
        elif not fallback_known:
            candidates.append((None, True))
        if arch != _FALLBACK_ARCH:
            candidates.append((_FALLBACK_ARCH, True))
        tried: list[str] = []
        for override, is_copy in candidates:
            path = self.path
            if is_copy:
                try:
                    path = write_vocab_copy(f, self.cache_dir, override, digest)
                except OSError as e:
                    raise ModelFileError(f"{self.path}: cannot write a vocab-only copy into {self.cache_dir}: "
                                         f"{e} (set POWERINFER_CACHE to a writable folder)") from None
            model, errors = _load_vocab_model(path)
            if model is not None:
                return path, model
            what = ("the file itself" if not is_copy else "a vocab-only copy" if override is None
                    else f"a vocab-only copy declaring architecture {override!r}")
            errors = [e for e in errors if "failed to load model" not in e] or ["no message"]
            tried.append(f"{what}: {'; '.join(errors)}")
            if is_copy:
                path.unlink(missing_ok=True)
        raise ModelFileError(f"{self.path}: llama.cpp cannot load the vocabulary. Tried " + " | ".join(tried))

    # -- text <-> ids -------------------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        """Token ids of `text`. add_bos adds the vocabulary's BOS (if it uses one); special=True parses
        control-token text such as <start_of_turn> into its single id."""
        lc = _llama()
        raw = text.encode("utf-8")
        if self._missing_bytes:
            self._check_spellable(text)
        n_max = len(raw) + 8
        while True:
            buf = (lc.llama_token * n_max)()
            n = lc.llama_tokenize(self._live(), raw, len(raw), buf, n_max, add_bos, special)
            if n >= 0:
                return list(buf[:n])
            if -n <= n_max:  # a negative count is the size needed; anything else is a failure
                raise ValueError(f"llama.cpp failed to tokenize {len(raw)} bytes of text")
            n_max = -n

    def _check_spellable(self, text: str) -> None:
        """For a SentencePiece vocabulary without some byte tokens (_missing_bytes): every character of the
        text (spaces as U+2581, as llama.cpp escapes them) must be a token or be spelt by byte tokens.
        Conservative: a character inside special-token text is checked too."""
        chars = set(text.replace(" ", "\u2581")) | ({"\u2581"} if self._space_prefix else set())
        for c in sorted(chars):
            if c not in self._keys and self._missing_bytes.intersection(c.encode("utf-8", "surrogateescape")):
                raise ModelFileError(f"{self.path}: {_K}tokens has no token for {c!r} and no byte tokens "
                                     "(<0x00> to <0xFF>) to spell it with, so llama.cpp cannot tokenize this text")

    def piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes token_id stands for. Control tokens (BOS, <end_of_turn>) give b"" unless special."""
        key = (token_id, special)
        cached = self._pieces.get(key)
        if cached is not None:
            return cached
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})")
        lc = _llama()
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_token_to_piece(self._live(), token_id, buf, size, 0, special)
            if n >= 0:
                self._pieces[key] = buf.raw[:n]
                return self._pieces[key]
            size = -n

    def decode(self, ids: Sequence[int], special: bool = False) -> str:
        """Text of a whole sequence, so that decode(encode(text)) == text: control tokens vanish (unless
        special) and the space a SentencePiece vocabulary put in front of the text is dropped again.
        Invalid UTF-8 becomes U+FFFD. For the text of generated tokens, which continue a prompt and keep
        their leading space, use a StreamDecoder."""
        lc = _llama()
        ids = [int(i) for i in ids]
        if ids and not special and ids[0] == self.bos_id:
            # llama.cpp strips the added space from the first token only, and a leading BOS would take
            # that turn; it renders as nothing here anyway.
            ids = ids[1:]
        for i in ids:
            if not 0 <= i < self.n_vocab:
                raise ValueError(f"token id {i} is outside the vocabulary (0..{self.n_vocab - 1})")
        arr = (lc.llama_token * max(len(ids), 1))(*ids)
        size = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_detokenize(self._live(), arr, len(ids), buf, size, False, special)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            size = -n

    def is_eog(self, token_id: int) -> bool:
        """True for tokens that end generation (EOS, EOT, <|im_end|> ...), as llama.cpp decides it."""
        return 0 <= token_id < self.n_vocab and bool(_llama().llama_vocab_is_eog(self._live(), int(token_id)))

    def stream(self, special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, special)

    def _live(self):
        """The llama.cpp vocabulary handle; after close() a clear error (a NULL handle would crash llama.cpp)."""
        if self._vocab is None:
            raise ValueError(f"the tokenizer of {self.path} is closed (the model was closed)")
        return self._vocab

    def close(self) -> None:
        if self._model is not None:
            _llama().llama_model_free(self._model)
            self._model = self._vocab = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: llama_cpp may already be gone
            pass


class StreamDecoder:
    """Incremental detokenizer for generated tokens: feed(id) returns the text that became printable.

    Bytes of a character split over several tokens (byte-fallback tokens, or BPE pieces of an emoji) are
    held back until the character is complete, so no piece ever ends inside a UTF-8 sequence. Pieces are
    concatenated as they are: generated text continues a prompt, so a leading space is kept.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self.tokenizer = tokenizer
        self.special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.piece(int(token_id), self.special))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character becomes U+FFFD); resets the decoder."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
