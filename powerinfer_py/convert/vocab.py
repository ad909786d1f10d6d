"""Tokenizer of a Hugging Face checkpoint -> llama.cpp's tokenizer.ggml.* metadata (and the chat template).

Two sources, in this order:
  - tokenizer.model, a SentencePiece ModelProto (protobuf), parsed here with a minimal wire-format reader (no
    sentencepiece package): pieces, scores and piece types become tokenizer.ggml.model "llama";
  - tokenizer.json (the `tokenizers` library's file) with a BPE model: byte-level BPE becomes "gpt2"
    (tokens + merges); BPE with byte_fallback (LLaMA/Mistral exported without tokenizer.model) becomes
    "llama" with scores that follow the token ids (SentencePiece-BPE vocabularies are ordered by merge).
Special tokens (bos/eos/unk/pad), add_bos/add_eos and the chat template come from tokenizer_config.json,
falling back to config.json ids. The token list is padded with unused "[PADn]" tokens to the embedding size.
"""
from __future__ import annotations

import struct
import warnings
from pathlib import Path
from typing import Any

from ..errors import ModelFileError, UnsupportedError
from .checkpoint import read_json

# llama.cpp token types (the same numbers as SentencePiece piece types)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


# ---- protobuf wire format ----------------------------------------------------------------------------------

def _varint(buf: bytes, pos: int, path: Path) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ModelFileError(f"{path}: corrupt protobuf (bad varint at byte {pos})")
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not b & 0x80:
            return value, pos


def _fields(buf: bytes, path: Path):
    """Yield (field number, wire type, value) of one message; value is int (varint, fixed) or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, path)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, path)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos, path)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ModelFileError(f"{path}: unsupported protobuf wire type {wire} (field {field})")
        if pos > len(buf):
            raise ModelFileError(f"{path}: corrupt protobuf (field {field} runs past the end)")
        yield field, wire, value


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def read_sentencepiece(path: Path) -> dict[str, Any]:
    """{tokens, scores, types, unk_id, bos_id, eos_id, pad_id, add_dummy_prefix, model_type} of a
    SentencePiece model file. Field numbers are those of sentencepiece_model.proto."""
    buf = path.read_bytes()
    out: dict[str, Any] = {"tokens": [], "scores": [], "types": [], "unk_id": 0, "bos_id": 1, "eos_id": 2,
                           "pad_id": -1, "add_dummy_prefix": True, "model_type": 1}
    for field, wire, value in _fields(buf, path):
        if field == 1 and wire == 2:  # repeated SentencePiece {1: piece, 2: score, 3: type}
            piece, score, kind = "", 0.0, NORMAL
            for f, w, v in _fields(value, path):
                if f == 1 and w == 2:
                    piece = v.decode("utf-8", "surrogateescape")
                elif f == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif f == 3 and w == 0:
                    kind = v
            out["tokens"].append(piece)
            out["scores"].append(score)
            out["types"].append(kind)
        elif field == 2 and wire == 2:  # TrainerSpec
            names = {3: "model_type", 40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}
            for f, w, v in _fields(value, path):
                if f in names and w == 0:
                    out[names[f]] = _signed(v)
        elif field == 3 and wire == 2:  # NormalizerSpec
            for f, w, v in _fields(value, path):
                if f == 3 and w == 0:
                    out["add_dummy_prefix"] = bool(v)
    if not out["tokens"]:
        raise ModelFileError(f"{path}: no pieces: not a SentencePiece model")
    return out


# ---- assembling the metadata -------------------------------------------------------------------------------

def _token_text(tok: Any) -> str | None:
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) else None


def _added_tokens(folder: Path, tok_json: dict | None, tok_config: dict) -> dict[int, tuple[str, bool]]:
    """{id: (text, special)} from tokenizer.json's added_tokens, tokenizer_config's added_tokens_decoder and
    added_tokens.json."""
    added: dict[int, tuple[str, bool]] = {}
    for entry in (tok_json or {}).get("added_tokens", []):
        added[int(entry["id"])] = (entry["content"], bool(entry.get("special", False)))
    for tid, entry in (tok_config.get("added_tokens_decoder") or {}).items():
        added.setdefault(int(tid), (entry["content"], bool(entry.get("special", False))))
    if (folder / "added_tokens.json").exists():
        for text, tid in read_json(folder / "added_tokens.json").items():
            added.setdefault(int(tid), (text, True))
    return added


def _place_added(tokens: list, scores: list, types: list, added: dict[int, tuple[str, bool]]) -> None:
    for tid in sorted(added):
        text, special = added[tid]
        while len(tokens) < tid:
            tokens.append(f"[PAD{len(tokens)}]"), scores.append(-1000.0), types.append(UNUSED)
        kind = CONTROL if special else USER_DEFINED
        if tid == len(tokens):
            tokens.append(text), scores.append(-1000.0), types.append(kind)
        elif tokens[tid] == text:
            types[tid] = kind if types[tid] == NORMAL else types[tid]


def _spm_from_json(model: dict) -> tuple[list, list, list]:
    vocab = model["vocab"]
    tokens = [""] * len(vocab)
    for text, tid in vocab.items():
        tokens[tid] = text
    types = [BYTE if len(t) == 6 and t.startswith("<0x") and t.endswith(">") else NORMAL for t in tokens]
    return tokens, [-float(i) for i in range(len(tokens))], types


def _bpe_from_json(model: dict) -> tuple[list, list, list, list[str]]:
    vocab = model["vocab"]
    tokens = [f"[PAD{i}]" for i in range(max(vocab.values()) + 1)]
    types = [UNUSED] * len(tokens)
    for text, tid in vocab.items():
        tokens[tid], types[tid] = text, NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, [0.0] * len(tokens), types, merges


# ---- pre-tokenizer ---------------------------------------------------------------------------------------
# A byte-level BPE splits text into chunks before merging, by a regex that differs between model families, and
# llama.cpp picks its own copy of that regex by the name in tokenizer.ggml.pre. llama.cpp's converter finds the
# name by hashing how the `tokenizers` library tokenizes a test text; without that library we read the split
# rules in tokenizer.json and tell the families apart by the pieces of their regexes that differ.
_CASED = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"  # letters split at case changes (GPT-4o's o200k, Mistral's tekken)
_DIGITS_3 = r"\p{N}{1,3}"                 # numbers in chunks of up to three digits (Llama 3, o200k)
_DIGIT_1 = r"|\p{N}|"                     # one digit per chunk (Qwen2, tekken)
_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"


def _pre_tokenizer_steps(node: Any) -> list[dict]:
    """The steps of a tokenizer.json pre_tokenizer, Sequences flattened."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [step for child in node.get("pretokenizers") or [] for step in _pre_tokenizer_steps(child)]
    return [node]


def pre_tokenizer_name(tok_json: dict, arch: str, path: Path) -> str:
    """llama.cpp's pre-tokenizer name for the byte-level BPE tokenizer.json `tok_json`: llama-bpe (Llama 3),
    qwen2, gpt-4o (Phi-4-mini), tekken, smollm, falcon or gpt-2 (plain ByteLevel). A split rule we do not
    recognize keeps the name by architecture (qwen2 for qwen2/qwen3, else default) with a warning: text then
    splits as llama.cpp's default does, which may differ from the model's own tokenizer."""
    steps = _pre_tokenizer_steps(tok_json.get("pre_tokenizer"))
    kinds = [step.get("type") for step in steps]
    regex = "|".join(str((step.get("pattern") or {}).get("Regex", "")) for step in steps if step.get("type") == "Split")
    if _CASED in regex:
        if _DIGITS_3 in regex:
            return "gpt-4o"
        if _DIGIT_1 in regex:
            return "tekken"
    elif _CONTRACTIONS in regex:
        if _DIGITS_3 in regex:
            return "llama-bpe"
        if _DIGIT_1 in regex:
            return "qwen2"
    if "Punctuation" in kinds and "ByteLevel" in kinds and "[0-9][0-9][0-9]" in regex:
        return "falcon"
    if not regex and "ByteLevel" in kinds and all(step.get("use_regex", True) for step in steps
                                                   if step.get("type") == "ByteLevel"):
        if kinds == ["ByteLevel"]:
            return "qwen2" if arch in ("qwen2", "qwen3", "qwen2moe", "qwen3moe") else "gpt-2"
        if sorted(kinds) == ["ByteLevel", "Digits"] and all(step.get("individual_digits") for step in steps
                                                            if step.get("type") == "Digits"):
            return "smollm"
    fallback = "qwen2" if arch in ("qwen2", "qwen3", "qwen2moe", "qwen3moe") else "default"
    warnings.warn(f"{path}: pre-tokenizer {kinds or 'none'} {regex!r} is not one we recognize; writing "
                  f"tokenizer.ggml.pre = {fallback!r}, so text may split into tokens differently than the model's "
                  "own tokenizer does", stacklevel=2)
    return fallback


def tokenizer_metadata(folder: Path, config: dict, n_vocab: int, arch: str) -> dict[str, Any]:
    """tokenizer.ggml.* and tokenizer.chat_template keys for the checkpoint in `folder`."""
    tok_config = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").exists() else {}
    tok_json = read_json(folder / "tokenizer.json") if (folder / "tokenizer.json").exists() else None
    meta: dict[str, Any] = {}
    merges: list[str] = []
    spm = folder / "tokenizer.model"
    if spm.exists():
        sp = read_sentencepiece(spm)
        tokens, scores, types = sp["tokens"], sp["scores"], sp["types"]
        meta["tokenizer.ggml.model"] = "llama"
        meta["tokenizer.ggml.add_space_prefix"] = sp["add_dummy_prefix"]
        ids = {"bos": sp["bos_id"], "eos": sp["eos_id"], "unknown": sp["unk_id"], "padding": sp["pad_id"]}
    elif tok_json is not None:
        model = tok_json.get("model") or {}
        if model.get("type") != "BPE":
            raise UnsupportedError(f"{folder / 'tokenizer.json'}: tokenizer model {model.get('type')!r} is not "
                                   "supported (BPE, or a tokenizer.model)")
        if model.get("byte_fallback"):
            tokens, scores, types = _spm_from_json(model)
            meta["tokenizer.ggml.model"] = "llama"
        else:
            tokens, scores, types, merges = _bpe_from_json(model)
            meta["tokenizer.ggml.model"] = "gpt2"
            meta["tokenizer.ggml.pre"] = pre_tokenizer_name(tok_json, arch, folder / "tokenizer.json")
        ids = {}
    else:
        raise ModelFileError(f"{folder}: no tokenizer.model or tokenizer.json")
    tokens, scores, types = list(tokens), list(scores), list(types)
    _place_added(tokens, scores, types, _added_tokens(folder, tok_json, tok_config))
    if len(tokens) > n_vocab:
        raise ModelFileError(f"{folder}: the tokenizer has {len(tokens)} tokens, the embedding only {n_vocab} rows")
    while len(tokens) < n_vocab:  # llama.cpp wants exactly one token per embedding row
        tokens.append(f"[PAD{len(tokens)}]"), scores.append(-1000.0), types.append(UNUSED)
    index = {t: i for i, t in enumerate(tokens)}
    for kind in ("bos", "eos", "unk", "pad"):  # the names in tokenizer_config.json win over the model's ids
        tid = index.get(_token_text(tok_config.get(f"{kind}_token")))
        if tid is not None:
            ids[{"unk": "unknown", "pad": "padding"}.get(kind, kind)] = tid
    for kind in ("bos", "eos", "pad"):
        value = config.get(f"{kind}_token_id")
        value = value[0] if isinstance(value, list) and value else value
        key = {"pad": "padding"}.get(kind, kind)
        if isinstance(value, int) and key not in ids:
            ids[key] = value
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.scores"] = scores
    meta["tokenizer.ggml.token_type"] = types
    if merges:
        meta["tokenizer.ggml.merges"] = merges
    for key, tid in ids.items():
        if isinstance(tid, int) and 0 <= tid < len(tokens):
            meta[f"tokenizer.ggml.{key}_token_id"] = tid
    for flag in ("add_bos_token", "add_eos_token"):
        if isinstance(tok_config.get(flag), bool):
            meta[f"tokenizer.ggml.{flag}"] = tok_config[flag]
    meta.update(chat_templates(folder, tok_config))
    return meta


def chat_templates(folder: Path, tok_config: dict) -> dict[str, str]:
    """tokenizer.chat_template (and tokenizer.chat_template.NAME for named extra templates)."""
    template = tok_config.get("chat_template")
    if template is None and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    elif template is None and (folder / "chat_template.json").exists():
        template = read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, str):
        return {"tokenizer.chat_template": template}
    if template is not None and not isinstance(template, list):
        raise ModelFileError(f"{folder}: chat_template must be a string or a list of named templates, got "
                             f"{type(template).__name__}")
    out = {}
    for entry in template or []:
        if not isinstance(entry, dict):
            raise ModelFileError(f"{folder}: chat_template entries must be objects with name and template, got "
                                 f"{type(entry).__name__}")
        name, text = entry.get("name"), entry.get("template")
        if isinstance(name, str) and isinstance(text, str):
            out["tokenizer.chat_template" if name == "default" else f"tokenizer.chat_template.{name}"] = text
    return out
