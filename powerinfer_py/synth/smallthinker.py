"""write_smallthinker_model: a tiny random SmallThinker file (GGUF arch "smallthinker") that llama.cpp loads.

The tensors and keys are the ones llama.cpp's smallthinker loader reads (models/smallthinker.py has the math):
token_embd, output_norm, output (untied unless told), and per layer attn_norm, attn_q/k/v/output, ffn_norm,
the router ffn_gate_inp (F32, as real files) and the 3-D expert stacks ffn_gate/up/down_exps. Every matrix is
~ N(0, 1/K) for K inputs, so activations stay O(1); the vocabulary is synth.synthetic_vocab's.

Really sparse experts (sparsity > 0): ReLU experts are sparse only when their gate pre-activations are mostly
negative. There is no gate bias in the format, so the file builds one out of a direction: every token
embedding gets a common component along a unit vector d, twice the size of its random part (the residual stream
keeps it, so each layer's normed FFN input m, of norm sqrt(n_embd), has m . d close to sqrt(n_embd)), and every
expert gate row gets -sparsity / sqrt(n_embd) * d added. The pre-activation g_i = w_i . m - (sparsity / sqrt(E))
(m . d), with w_i . m ~ N(0, 1), then sits about `sparsity` standard deviations below zero: sparsity 1.3 leaves
roughly 10% of the neurons firing. sparsity 0 writes plain random gates (about half the neurons fire).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..gguf import write_gguf
from ..gguf.types import GGMLType
from .common import DTYPES, _encode, tokenizer_metadata

_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}
GATING = {"softmax": 1, "sigmoid": 2}  # {arch}.expert_gating_func codes


def write_smallthinker_model(path: str | os.PathLike, *, dtype: str = "f32", n_layer: int = 4, n_embd: int = 64,
                             n_ff_exp: int = 64, n_head: int = 4, n_head_kv: int = 2, n_vocab: int = 512,
                             n_expert: int = 8, n_expert_used: int = 2, gating: str = "softmax",
                             sliding_window: int | None = 4096, weights_scale: float | None = None,
                             tied: bool = False, sparsity: float = 0.0, n_ctx_train: int = 8192,
                             seed: int = 0, extra_meta: dict | None = None) -> Path:
    """Write the model to path and return it. sliding_window None leaves the key out (llama.cpp then runs every
    layer with RoPE and no window); any value > 0 turns on its fixed layout (models/smallthinker.py).
    weights_scale None leaves {arch}.expert_weights_scale out. extra_meta: more keys ({arch} spelled out)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    rng = np.random.default_rng(seed)
    a, hd = "smallthinker", n_embd // n_head
    E, F = n_embd, n_ff_exp

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d):
        return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

    d = rng.standard_normal(E).astype(np.float32)
    d /= np.linalg.norm(d)
    embd = (0.1 if tied else 1.0) * rng.standard_normal((n_vocab, E), dtype=np.float32)
    if sparsity:
        embd += np.float32(2.0 * np.sqrt(E) * (0.1 if tied else 1.0)) * d  # the common component along d
    weights = [("token_embd.weight", embd)]
    for il in range(n_layer):
        p = f"blk.{il}."
        gate = np.stack([linear(F, E) for _ in range(n_expert)])
        if sparsity:
            gate -= np.float32(sparsity / np.sqrt(E)) * d  # m . d is about sqrt(E): a shift of ~sparsity std
        weights += [(p + "attn_norm.weight", norm(E)),
                    (p + "attn_q.weight", linear(n_head * hd, E)),
                    (p + "attn_k.weight", linear(n_head_kv * hd, E)),
                    (p + "attn_v.weight", linear(n_head_kv * hd, E)),
                    (p + "attn_output.weight", linear(E, n_head * hd)),
                    (p + "ffn_norm.weight", norm(E)),
                    # the router reads the raw residual (O(sqrt(E)) norm): scaled so the routing is clear, not one-hot
                    (p + "ffn_gate_inp.weight", 0.5 * linear(n_expert, E)),
                    (p + "ffn_gate_exps.weight", gate),
                    (p + "ffn_up_exps.weight", np.stack([linear(F, E) for _ in range(n_expert)])),
                    (p + "ffn_down_exps.weight", np.stack([linear(E, F) for _ in range(n_expert)]))]
    weights.append(("output_norm.weight", (3.0 if tied else 1.0) * norm(E)))
    if not tied:
        weights.append(("output.weight", linear(n_vocab, E)))

    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta = {
        "general.architecture": a, "general.name": f"synthetic-smallthinker-{dtype}",
        "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": n_ctx_train, f"{a}.embedding_length": E, f"{a}.block_count": n_layer,
        f"{a}.feed_forward_length": F, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.rope.freq_base": 1_000_000.0, f"{a}.rope.dimension_count": hd,
        f"{a}.expert_count": n_expert, f"{a}.expert_used_count": n_expert_used,
        f"{a}.expert_feed_forward_length": F, f"{a}.expert_gating_func": GATING[gating],
        **tok_meta,
    }
    if sliding_window is not None:
        meta[f"{a}.attention.sliding_window"] = sliding_window
    if weights_scale is not None:
        meta[f"{a}.expert_weights_scale"] = float(weights_scale)
    meta.update(extra_meta or {})
    kinds = tok_types
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and "gate_inp" not in name else GGMLType.F32)
               for name, x in weights]
    return write_gguf(path, meta, tensors, types=kinds)
