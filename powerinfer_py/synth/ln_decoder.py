"""write_ln_decoder_model: a tiny random phi2, stablelm, starcoder2 or gpt2 file that llama.cpp loads.

The tensors and keys are those llama.cpp's loaders read (models/ln_decoder.py has the math). Options, with the
defaults taken from the real files:
  fused_qkv   one attn_qkv (+ attn_qkv.bias) instead of attn_q/k/v; phi2 files converted from the original
              checkpoint have it, those from HF's PhiForCausalLM format do not (default False; gpt2 always)
  qkv_bias    q/k/v biases (default: phi2 and starcoder2 True, stablelm True as StableLM 2 1.6B; 3B has none)
  n_rot       rotated dims per head (default: phi2 0.4 of head_dim as Phi-2's 32 of 80, stablelm 1/4, starcoder2 all)
  parallel    stablelm without ffn_norm (StableLM 2 12B's parallel residual; default False)
  qk_norm     stablelm's per-head Q/K LayerNorm weights (StableLM 2 12B; default False)
  tied        no output.weight (starcoder2, default False; gpt2, default True as GPT-2; llama.cpp requires it
              for phi2 and stablelm)
gpt2 also gets position_embd (n_ctx_train rows, ~ N(0, 0.5^2)), no rope.dimension_count and no head_count_kv
key (its converter writes neither: no RoPE, no GQA).
Matrices ~ N(0, 1/K) for K inputs, norm weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2) (0.3 for the output
bias), embeddings ~ N(0, 1) (0.1 when tied). The vocabulary is synth.tokenizer_metadata's.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..gguf import write_gguf
from ..gguf.types import GGMLType
from .common import DTYPES, _encode, tokenizer_metadata

LN_DECODER_ARCHS = ("phi2", "stablelm", "starcoder2", "gpt2")
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}


def write_ln_decoder_model(path: str | os.PathLike, arch: str = "phi2", *, dtype: str = "f32", n_layer: int = 2,
                           n_embd: int = 64, n_ff: int = 128, n_head: int = 4, n_head_kv: int | None = None,
                           n_vocab: int = 512, seed: int = 0, fused_qkv: bool = False, qkv_bias: bool = True,
                           n_rot: int | None = None, parallel: bool = False, qk_norm: bool = False,
                           tied: bool | None = None, norm_eps: float = 1e-5, n_ctx_train: int = 512,
                           rope_freq_base: float = 10000.0) -> Path:
    """Write the model to path and return it (options: module docstring). phi2 has no GQA: n_head_kv defaults to
    n_head (starcoder2 and stablelm: n_head // 2)."""
    if arch not in LN_DECODER_ARCHS:
        raise ValueError(f"write_ln_decoder_model writes {', '.join(LN_DECODER_ARCHS)}, not {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    tied = arch == "gpt2" if tied is None else tied
    fused_qkv = fused_qkv or arch == "gpt2"
    if (parallel or qk_norm) and arch != "stablelm" or tied and arch not in ("starcoder2", "gpt2"):
        raise ValueError(f"{arch}: parallel and qk_norm are stablelm options, tied a starcoder2 and gpt2 one")
    rng = np.random.default_rng(seed)
    a, E, F, hd = arch, n_embd, n_ff, n_embd // n_head
    n_head_kv = n_head if arch == "gpt2" else n_head_kv or (n_head if arch == "phi2" else max(1, n_head // 2))
    if n_rot is None:
        n_rot = {"phi2": int(0.4 * hd) // 2 * 2, "stablelm": hd // 4 // 2 * 2, "starcoder2": hd, "gpt2": 0}[arch]
    q_dim, kv_dim = n_head * hd, n_head_kv * hd

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(*shape):
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)

    def bias(m, std=0.1):
        return std * rng.standard_normal(m, dtype=np.float32)

    weights = [("token_embd.weight", (0.1 if tied else 1.0) * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    if arch == "gpt2":
        weights.append(("position_embd.weight", 0.5 * rng.standard_normal((n_ctx_train, E), dtype=np.float32)))
    for il in range(n_layer):
        p = f"blk.{il}."
        weights += [(p + "attn_norm.weight", norm(E)), (p + "attn_norm.bias", bias(E))]
        wq, wk, wv = linear(q_dim, E), linear(kv_dim, E), linear(kv_dim, E)
        bq, bk, bv = bias(q_dim), bias(kv_dim), bias(kv_dim)
        if fused_qkv:
            weights.append((p + "attn_qkv.weight", np.concatenate([wq, wk, wv])))
            if qkv_bias:
                weights.append((p + "attn_qkv.bias", np.concatenate([bq, bk, bv])))
        else:
            weights += [(p + "attn_q.weight", wq), (p + "attn_k.weight", wk), (p + "attn_v.weight", wv)]
            if qkv_bias:
                weights += [(p + "attn_q.bias", bq), (p + "attn_k.bias", bk), (p + "attn_v.bias", bv)]
        if qk_norm:
            weights += [(p + "attn_q_norm.weight", norm(n_head, hd)), (p + "attn_k_norm.weight", norm(n_head_kv, hd))]
        weights.append((p + "attn_output.weight", linear(E, q_dim)))
        if arch != "stablelm":
            weights.append((p + "attn_output.bias", bias(E)))
        if arch in ("starcoder2", "gpt2") or arch == "stablelm" and not parallel:
            weights += [(p + "ffn_norm.weight", norm(E)), (p + "ffn_norm.bias", bias(E))]
        if arch == "stablelm":
            weights.append((p + "ffn_gate.weight", linear(F, E)))
        weights += [(p + "ffn_up.weight", linear(F, E)), (p + "ffn_down.weight", linear(E, F))]
        if arch != "stablelm":
            weights += [(p + "ffn_up.bias", bias(F)), (p + "ffn_down.bias", bias(E))]
    weights += [("output_norm.weight", norm(E) * np.float32(3.0 if tied else 1.0)), ("output_norm.bias", bias(E))]
    if not tied:
        weights.append(("output.weight", linear(n_vocab, E)))
    if arch == "phi2":
        weights.append(("output.bias", bias(n_vocab, 0.3)))

    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta = {
        "general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": n_ctx_train, f"{a}.embedding_length": E, f"{a}.block_count": n_layer,
        f"{a}.feed_forward_length": F, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.layer_norm_epsilon": float(norm_eps),
        f"{a}.rope.freq_base": float(rope_freq_base), f"{a}.rope.dimension_count": n_rot,
        **tok_meta,
    }
    if arch == "stablelm":
        meta[f"{a}.use_parallel_residual"] = bool(parallel)
    if arch == "gpt2":  # its converter writes no RoPE or GQA keys
        for key in ("attention.head_count_kv", "rope.freq_base", "rope.dimension_count"):
            del meta[f"{a}.{key}"]
    kinds = {**tok_types}
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and "norm" not in name else GGMLType.F32)
               for name, x in weights]
    return write_gguf(path, meta, tensors, types=kinds)
