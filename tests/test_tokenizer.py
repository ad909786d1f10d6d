"""Tokenizer: llama.cpp's vocab-only tokenizer, UTF-8-safe streaming, and vocab-only copies of PWRI files."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf, read_metadata_only, write_gguf
from powerinfer_py.tokenizer import StreamDecoder, Tokenizer, _load_vocab_model


TEXTS = ["Hello world", "héllo wörld, çà et là", "你好，世界", "emoji 🤗🎉 and ZWJ 👩‍💻",
         "a\nb\ttabs  spaces", "numbers 12345 and punctuation!?"]


@pytest.fixture(scope="module")
def gemma(real_model):
    tok = Tokenizer(real_model)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def synth(synthetic_model):
    tok = Tokenizer(synthetic_model("llama"))
    yield tok
    tok.close()


def _stream(tok: Tokenizer, ids) -> list[str]:
    dec = tok.stream()
    pieces = [dec.feed(i) for i in ids]
    return pieces + [dec.flush()]


def test_gemma_special_ids_and_eog(gemma, real_model):
    assert gemma.n_vocab == 262144
    assert (gemma.bos_id, gemma.eos_id) == (2, 1)
    meta = read_metadata_only(real_model).metadata
    tokens = meta["tokenizer.ggml.tokens"]
    assert tokens[gemma.bos_id] == "<bos>" and tokens[gemma.eos_id] == "<eos>"
    assert gemma.is_eog(1) and gemma.is_eog(tokens.index("<end_of_turn>"))
    assert not gemma.is_eog(2) and not gemma.is_eog(9259) and not gemma.is_eog(-1)


def test_gemma_ids_are_vocabulary_pieces(gemma, real_model):
    tokens = read_metadata_only(real_model).metadata["tokenizer.ggml.tokens"]
    ids = gemma.encode("Hello world, how are you?")
    assert ids[0] == gemma.bos_id
    # SentencePiece pieces spell the text with U+2581 for spaces
    assert "".join(tokens[i] for i in ids[1:]).replace("\u2581", " ") == "Hello world, how are you?"
    assert gemma.encode("Hello", add_bos=False) == [tokens.index("Hello")]


@pytest.mark.parametrize("text", TEXTS)
def test_gemma_round_trip_and_stream(gemma, text):
    ids = gemma.encode(text)
    assert gemma.decode(ids) == text
    pieces = _stream(gemma, ids)
    assert "".join(pieces) == text  # no space prefix in Gemma's vocabulary: stream == decode
    assert not any("\ufffd" in p for p in pieces)


def test_gemma_special_token_parsing(gemma):
    ids = gemma.encode("<start_of_turn>user", add_bos=False)
    assert len(ids) == 2 and gemma.decode(ids) == "user"
    assert gemma.decode(ids, special=True) == "<start_of_turn>user"
    plain = gemma.encode("<start_of_turn>user", add_bos=False, special=False)
    assert len(plain) > 2 and gemma.decode(plain) == "<start_of_turn>user"


@pytest.mark.parametrize("text", TEXTS)
def test_synthetic_round_trip(synth, text):
    ids = synth.encode(text)
    assert ids[0] == synth.bos_id == 1
    assert synth.decode(ids) == text
    # generated text continues a prompt: the stream keeps the space SentencePiece put in front
    assert "".join(_stream(synth, ids)) == " " + text


def test_stream_decoder_never_splits_a_character(synth):
    meta = read_metadata_only(synth.path).metadata
    byte_id = {tok: i for i, tok in enumerate(meta["tokenizer.ggml.tokens"]) if tok.startswith("<0x")}
    text = "é你🤗x"
    ids = [byte_id[f"<0x{b:02X}>"] for b in text.encode("utf-8")]
    dec = StreamDecoder(synth)
    out = [dec.feed(i) for i in ids]
    # 2 + 3 + 4 + 1 bytes: a character appears exactly when its last byte arrives
    assert out == ["", "é", "", "", "你", "", "", "", "🤗", "x"]
    assert dec.flush() == ""
    # an incomplete character at the end becomes U+FFFD on flush
    assert dec.feed(byte_id["<0xF0>"]) == "" and dec.flush() == "\ufffd"
    # byte tokens that the encoder itself produced for characters outside the vocabulary
    ids = synth.encode("你好🤗", add_bos=False)
    pieces = _stream(synth, ids)
    assert "".join(pieces) == " 你好🤗" and not any("\ufffd" in p for p in pieces)


def test_decode_rejects_ids_outside_the_vocabulary(synth):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        synth.decode([5, synth.n_vocab])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        synth.piece(-1)


def _pwri_copy(src: Path, dst: Path, arch: str | None = None) -> Path:
    """A PWRI file with src's metadata (and no tensors: the tokenizer only needs the metadata)."""
    f = open_gguf(src)
    meta = dict(f.metadata)
    if arch:
        meta["general.architecture"] = arch
    out = write_gguf(dst, meta, [], types=f.metadata_types, magic="PWRI")
    f.close()
    return out


def test_pwri_vocab_copy_tokenizes_like_the_original(synthetic_model, tmp_path):
    src = synthetic_model("llama")
    pwri = _pwri_copy(src, tmp_path / "model.powerinfer.gguf")
    model, errors = _load_vocab_model(pwri)
    assert model is None and errors  # llama.cpp itself refuses the PWRI magic: that is why copies exist
    cache = tmp_path / "cache"
    orig, tok = Tokenizer(src), Tokenizer(pwri, cache_dir=cache)
    assert tok.vocab_path.parent == cache and tok.vocab_path.read_bytes()[:4] == b"GGUF"
    assert open_gguf(tok.vocab_path).tensors == {}
    for text in TEXTS:
        assert tok.encode(text) == orig.encode(text)
    assert (tok.n_vocab, tok.bos_id, tok.eos_id) == (orig.n_vocab, orig.bos_id, orig.eos_id)
    # a second load reuses the cached copy rather than writing a new one
    mtime = tok.vocab_path.stat().st_mtime_ns
    again = Tokenizer(open_gguf(pwri), cache_dir=cache)
    assert again.vocab_path == tok.vocab_path and again.vocab_path.stat().st_mtime_ns == mtime
    assert len(list(cache.iterdir())) == 1


def test_pwri_with_an_architecture_llama_cpp_does_not_know(synthetic_model, tmp_path, monkeypatch):
    src = synthetic_model("llama")
    pwri = _pwri_copy(src, tmp_path / "bamboo.gguf", arch="bamboo")
    monkeypatch.setenv("POWERINFER_CACHE", str(tmp_path / "env-cache"))
    tok = Tokenizer(pwri)
    assert tok.vocab_path.parent == tmp_path / "env-cache" / "vocab"
    assert read_metadata_only(tok.vocab_path).metadata["general.architecture"] == "llama"
    assert tok.encode("héllo world") == Tokenizer(src).encode("héllo world")
    assert Tokenizer(pwri).vocab_path == tok.vocab_path  # the fallback copy is found directly next time


def test_a_broken_vocabulary_is_a_clear_error(synthetic_model, tmp_path):
    f = open_gguf(synthetic_model("llama"))
    meta = dict(f.metadata)
    meta["tokenizer.ggml.model"] = "no-such-tokenizer"  # refused before llama.cpp sees it (test_hostile_vocab.py)
    bad = write_gguf(tmp_path / "bad.gguf", meta, [], types=f.metadata_types)
    with pytest.raises(ModelFileError, match="bad.gguf: tokenizer.ggml.model is 'no-such-tokenizer'"):
        Tokenizer(bad, cache_dir=tmp_path / "cache")
    # what only llama.cpp refuses (an unknown pre-tokenizer) comes with its own message
    meta.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.pre": "no-such-pre"})
    bad = write_gguf(tmp_path / "bad.gguf", meta, [], types=f.metadata_types)
    with pytest.raises(ModelFileError, match="bad.gguf.*cannot load the vocabulary.*no-such-pre"):
        Tokenizer(bad, cache_dir=tmp_path / "cache")
    # a PWRI file of an unknown architecture: both copies are tried, and removed again when they fail
    meta["general.architecture"] = "bamboo"
    bad = write_gguf(tmp_path / "bad.pwri", meta, [], types=f.metadata_types, magic="PWRI")
    with pytest.raises(ModelFileError, match="bad.pwri.*'bamboo'.*architecture 'llama'.*no-such-pre"):
        Tokenizer(bad, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_unwritable_cache_is_a_clear_error(synthetic_model, tmp_path):
    pwri = _pwri_copy(synthetic_model("llama"), tmp_path / "m.gguf")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ModelFileError, match="vocab-only copy"):
        Tokenizer(pwri, cache_dir=blocker / "sub")
    assert os.path.exists(blocker)


def test_a_metadata_key_that_is_not_utf8_does_not_stop_the_tokenizer(synthetic_model, tmp_path):
    """A corrupt byte in a key the tokenizer does not need (found by fuzzing: the cache-name hash used to raise
    UnicodeEncodeError on it); both the plain GGUF and the PWRI copy path still tokenize as the original."""
    src = synthetic_model("llama")
    data = Path(src).read_bytes()
    assert data.count(b"general.name") == 1
    bad = tmp_path / "odd-key.gguf"
    bad.write_bytes(data.replace(b"general.name", b"general.n\x80me"))
    assert "general.n\udc80me" in open_gguf(bad).metadata
    orig = Tokenizer(src)
    for path in (bad, _pwri_copy(bad, tmp_path / "odd-key.powerinfer.gguf")):
        tok = Tokenizer(path, cache_dir=tmp_path / "cache")
        assert tok.encode("héllo world") == orig.encode("héllo world")
