"""write_cohere_model: a tiny random Cohere file (GGUF arch "command-r" or "cohere2") that llama.cpp loads.

The tensors and keys are those llama.cpp's command-r / cohere2 loaders read (models/command_r.py has the math):
token_embd (tied head: no output.weight, as the real files), output_norm, and per layer attn_norm, attn_q/k/v/output
and ffn_gate/up/down; no biases, no ffn_norm. command-r files of 64 or more layers also get the per-head
attn_q_norm / attn_k_norm (f32 [n_head, head_dim] / [n_head_kv, head_dim]), which llama.cpp requires at that
depth (Command R+). Matrices ~ N(0, 1/K) for K inputs, norms ~ 1 + N(0, 0.1^2); the embeddings are small
(std 0.1, the head is tied) and the output norm's gain is 3 / logit_scale, so the scaled logits have a spread of
about 2 whatever the scale. The vocabulary is synth.tokenizer_metadata's.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from ..gguf import write_gguf
from ..gguf.types import GGMLType
from .common import DTYPES, _encode, tokenizer_metadata

_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}
QK_NORM_DEPTH = 64  # llama.cpp reads command-r's Q/K norms from this depth on


def write_cohere_model(path: str | os.PathLike, arch: str = "command-r", *, dtype: str = "f32", n_layer: int = 2,
                       n_embd: int = 64, n_ff: int = 128, n_head: int = 4, n_head_kv: int = 2, n_vocab: int = 512,
                       seed: int = 0, logit_scale: float | None = 0.25, sliding_window: int = 4,
                       swa_pattern: int | tuple | None = None, n_rot: int | None = None, norm_eps: float = 1e-5,
                       n_ctx_train: int = 512, rope_freq_base: float = 10000.0) -> Path:
    """Write the model to path and return it. logit_scale None leaves {arch}.logit_scale out (command-r only:
    cohere2 requires it). cohere2: sliding_window (tokens), swa_pattern (a period or one flag per layer; None
    leaves the key out: llama.cpp's period 4), n_rot (rotated dims per head; default head_dim). The heads are
    n_embd / n_head wide (llama.cpp's attn_output is [n_embd, n_embd])."""
    if arch not in ("command-r", "cohere2"):
        raise ValueError(f"write_cohere_model writes command-r or cohere2, not {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    rng = np.random.default_rng(seed)
    a, hd, E, F = arch, n_embd // n_head, n_embd, n_ff

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(*shape):
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)

    weights = [("token_embd.weight", 0.1 * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    for il in range(n_layer):
        p = f"blk.{il}."
        weights += [(p + "attn_norm.weight", norm(E)),
                    (p + "attn_q.weight", linear(n_head * hd, E)),
                    (p + "attn_k.weight", linear(n_head_kv * hd, E)),
                    (p + "attn_v.weight", linear(n_head_kv * hd, E))]
        if arch == "command-r" and n_layer >= QK_NORM_DEPTH:
            weights += [(p + "attn_q_norm.weight", norm(n_head, hd)), (p + "attn_k_norm.weight", norm(n_head_kv, hd))]
        weights += [(p + "attn_output.weight", linear(E, n_head * hd)),
                    (p + "ffn_gate.weight", linear(F, E)),
                    (p + "ffn_up.weight", linear(F, E)),
                    (p + "ffn_down.weight", linear(E, F))]
    weights.append(("output_norm.weight", norm(E) * np.float32(3.0 / (logit_scale or 1.0))))

    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta = {
        "general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": n_ctx_train, f"{a}.embedding_length": E, f"{a}.block_count": n_layer,
        f"{a}.feed_forward_length": F, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.layer_norm_epsilon": float(norm_eps),
        f"{a}.rope.freq_base": float(rope_freq_base), f"{a}.rope.dimension_count": hd if n_rot is None else n_rot,
        **tok_meta,
    }
    kinds = {**tok_types}
    if logit_scale is not None:
        meta[f"{a}.logit_scale"] = float(logit_scale)
    if arch == "cohere2":
        meta[f"{a}.attention.sliding_window"] = sliding_window
        if swa_pattern is not None:
            meta[f"{a}.attention.sliding_window_pattern"] = swa_pattern
            if isinstance(swa_pattern, (list, tuple)):
                meta[f"{a}.attention.sliding_window_pattern"] = [bool(v) for v in swa_pattern]
                kinds[f"{a}.attention.sliding_window_pattern"] = (GGUFValueType.ARRAY, GGUFValueType.BOOL)
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and "norm" not in name else GGMLType.F32)
               for name, x in weights]
    return write_gguf(path, meta, tensors, types=kinds)
