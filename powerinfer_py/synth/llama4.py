"""write_llama4_model: a tiny random Llama 4 text file (GGUF arch "llama4") that llama.cpp loads.

The tensors and keys are the ones llama.cpp's llama4 loader reads (models/llama4.py has the math): token_embd,
output_norm, output (untied unless told), and per layer attn_norm, attn_q/k/v/output, ffn_norm, then on the MoE
layers ((il + 1) % moe_step == 0) the router ffn_gate_inp (F32, as real files), the 3-D expert stacks
ffn_gate/up/down_exps and the shared expert ffn_gate/up/down_shexp (the experts' width), on the others a dense
ffn_gate/up/down. No attention.sliding_window key: llama.cpp's chunked layout (chunks of 8192 positions on layers
il % 4 < 3, NoPE + temperature on (il + 1) % 4 == 0) applies, as in the real Scout / Maverick files. Every matrix
is ~ N(0, 1/K) for K inputs, so activations stay O(1); the vocabulary is synth.tokenizer_metadata's.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..gguf import write_gguf
from ..gguf.types import GGMLType
from .common import DTYPES, _encode, tokenizer_metadata

_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}


def write_llama4_model(path: str | os.PathLike, *, dtype: str = "f32", n_layer: int = 4, n_embd: int = 64,
                       n_ff: int = 96, n_ff_exp: int = 64, n_head: int = 4, n_head_kv: int = 2, n_vocab: int = 512,
                       n_expert: int = 4, n_expert_used: int = 1, moe_step: int = 2, tied: bool = False,
                       rope_freqs: bool = True, n_ctx_train: int = 16384, seed: int = 0,
                       extra_meta: dict | None = None) -> Path:
    """Write the model to path and return it. rope_freqs: write a rope_freqs.weight (Llama 3 style per-pair
    frequency divisors, 1 to 8) as the real files carry. extra_meta: more keys ({arch} spelled out)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    rng = np.random.default_rng(seed)
    a, hd = "llama4", n_embd // n_head
    E = n_embd

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d):
        return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

    def stack(m, k):
        return np.stack([linear(m, k) for _ in range(n_expert)])

    weights = [("token_embd.weight", (0.1 if tied else 1.0) * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    if rope_freqs:
        weights.append(("rope_freqs.weight", np.geomspace(1.0, 8.0, hd // 2).astype(np.float32)))
    for il in range(n_layer):
        p = f"blk.{il}."
        weights += [(p + "attn_norm.weight", norm(E)),
                    (p + "attn_q.weight", linear(n_head * hd, E)),
                    (p + "attn_k.weight", linear(n_head_kv * hd, E)),
                    (p + "attn_v.weight", linear(n_head_kv * hd, E)),
                    (p + "attn_output.weight", linear(E, n_head * hd)),
                    (p + "ffn_norm.weight", norm(E))]
        if (il + 1) % moe_step == 0:
            # router scaled up so the chosen expert is a clear pick and sigmoid weights spread over (0, 1)
            weights += [(p + "ffn_gate_inp.weight", 2.0 * linear(n_expert, E)),
                        (p + "ffn_gate_exps.weight", stack(n_ff_exp, E)),
                        (p + "ffn_up_exps.weight", stack(n_ff_exp, E)),
                        (p + "ffn_down_exps.weight", stack(E, n_ff_exp)),
                        (p + "ffn_gate_shexp.weight", linear(n_ff_exp, E)),
                        (p + "ffn_up_shexp.weight", linear(n_ff_exp, E)),
                        (p + "ffn_down_shexp.weight", linear(E, n_ff_exp))]
        else:
            weights += [(p + "ffn_gate.weight", linear(n_ff, E)), (p + "ffn_up.weight", linear(n_ff, E)),
                        (p + "ffn_down.weight", linear(E, n_ff))]
    weights.append(("output_norm.weight", (3.0 if tied else 1.0) * norm(E)))
    if not tied:
        weights.append(("output.weight", linear(n_vocab, E)))

    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta = {
        "general.architecture": a, "general.name": f"synthetic-llama4-{dtype}",
        "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": n_ctx_train, f"{a}.embedding_length": E, f"{a}.block_count": n_layer,
        f"{a}.feed_forward_length": n_ff, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{a}.rope.freq_base": 500_000.0, f"{a}.rope.dimension_count": hd,
        f"{a}.expert_count": n_expert, f"{a}.expert_used_count": n_expert_used,
        f"{a}.expert_feed_forward_length": n_ff_exp, f"{a}.interleave_moe_layer_step": moe_step,
        **tok_meta,
    }
    meta.update(extra_meta or {})
    kinds = {**tok_types}
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and "gate_inp" not in name else GGMLType.F32)
               for name, x in weights]
    return write_gguf(path, meta, tensors, types=kinds)
