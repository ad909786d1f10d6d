"""What every synthetic writer shares: the dtypes, the SentencePiece-style vocabulary and the tensor encoding.

Weights are random but scaled so every activation stays O(1): matrices ~ N(0, 1/K) for K inputs, norm
weights ~ 1 + N(0, 0.1^2), embeddings ~ N(0, 1). Greedy outputs then depend on the input in a non-trivial way.
2-D weights take `dtype`; 1-D tensors (norms, biases) are always F32, as in real files.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFValueType

from ..gguf.types import GGMLType, Tensor

DTYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16,
          "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}  # llama.cpp's general.file_type codes

# token types of the SentencePiece vocabulary (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPACE = "\u2581"  # SentencePiece's visible space

_WORDS = """the a an and of to in is it that was for on are as with his they at be this from have or by one
had not but what all were when we there can your which their said if do will each about how up out them then
she many some so these would other into has more her two like him see time could no make than first been its
who now people my made over did down only way find use may water long little very after words called just
where most know get through back much go good new write our me man too any day same right look think also
around another came come work three word must because does part even place well such here take why things help
put years different away again off went old number hello world story once upon cat dog house tree sun day night
red blue green big small happy sad run walk talk say""".split()
# granite's scalars ({arch}.embedding_scale, residual_scale, attention.scale, logit_scale), far from 1 and from
# each default so that leaving one out shows (attention.scale: head_dim 16 would give 1/sqrt(16) = 0.25)
GRANITE_SCALES = {"embedding_scale": 10.0, "residual_scale": 0.5, "attention_scale": 0.6, "logit_scale": 4.0}
_CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()") + [SPACE]


def tokenizer_metadata(n_vocab: int) -> tuple[dict, dict]:
    """(metadata, value types) of synthetic_vocab(n_vocab) as a llama (SentencePiece) tokenizer with BOS added:
    the tokenizer keys every synthetic writer puts in its files, and the GGUF types its arrays need."""
    tokens, scores, token_types = synthetic_vocab(n_vocab)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": token_types, "tokenizer.ggml.unknown_token_id": UNK_ID,
            "tokenizer.ggml.bos_token_id": BOS_ID, "tokenizer.ggml.eos_token_id": EOS_ID,
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False}
    types = {"tokenizer.ggml.token_type": (GGUFValueType.ARRAY, GGUFValueType.INT32),
             "tokenizer.ggml.scores": (GGUFValueType.ARRAY, GGUFValueType.FLOAT32)}
    return meta, types


def synthetic_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a SentencePiece-style vocabulary of exactly n_vocab entries.

    Word pieces come with every prefix ("▁t", "▁th", "▁the"), because SentencePiece builds a word by merging
    adjacent pieces whose concatenation is in the vocabulary. Later pieces score lower."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    if n_vocab < len(tokens) + len(_CHARS):
        raise ValueError(f"n_vocab must be at least {len(tokens) + len(_CHARS)}, got {n_vocab}")
    pieces = dict.fromkeys(_CHARS)
    pieces.update(dict.fromkeys(SPACE + c for c in "abcdefghijklmnopqrstuvwxyz"))
    for w in _WORDS:
        word = SPACE + w
        pieces.update(dict.fromkeys(word[:i] for i in range(2, len(word) + 1)))
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pieces.update(dict.fromkeys(a + b for a in letters for b in letters))  # filler: letter pairs
    words = list(pieces)[: n_vocab - len(tokens)]
    while len(tokens) + len(words) < n_vocab:  # very large vocabularies: numbered filler pieces
        words.append(f"{SPACE}w{len(words)}")
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(words))]
    return tokens + words, scores, types + [TOKEN_NORMAL] * len(words)


def _encode(name: str, x: np.ndarray, ggml_type: GGMLType) -> Tensor:
    """x f32 of any rank -> Tensor of ggml_type in the project's Tensor layout."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if ggml_type == GGMLType.F32:
        data = x
    elif ggml_type == GGMLType.F16:
        data = x.astype(np.float16)
    elif ggml_type == GGMLType.BF16:
        bits = x.view(np.uint32).astype(np.uint64)
        data = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    else:
        data = _quantize(x.reshape(-1, x.shape[-1]), ggml_type).reshape(*x.shape[:-1], -1)
    return Tensor(name, ggml_type, tuple(x.shape), data)


def _quantize(x: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """llama.cpp's block quantization of rows x f32 [R, K]: the project's numpy reference when present."""
    try:
        from ..kernels.ref import quantize
    except ImportError:
        quantize = None
    if quantize is None:
        from gguf import quants
        return quants.quantize(x, ggml_type)
    return quantize(x, ggml_type)


