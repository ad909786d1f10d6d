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
        self.vocab_path, self._model = self._load(f)
        lc = _llama()
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self.bos_id = int(lc.llama_vocab_bos(self._vocab))  # -1 if the vocabulary has none
        self.eos_id = int(lc.llama_vocab_eos(self._vocab))
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self._vocab))
        self._pieces: dict[tuple[int, bool], bytes] = {}

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
        n_max = len(raw) + 8
        while True:
            buf = (lc.llama_token * n_max)()
            n = lc.llama_tokenize(self._live(), raw, len(raw), buf, n_max, add_bos, special)
            if n >= 0:
                return list(buf[:n])
            if -n <= n_max:  # a negative count is the size needed; anything else is a failure
                raise ValueError(f"llama.cpp failed to tokenize {len(raw)} bytes of text")
            n_max = -n

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
