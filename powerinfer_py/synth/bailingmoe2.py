"""write_ling_trinity: tiny random bailingmoe2 (Ling / Ring 2.0) and afmoe (Trinity) files that llama.cpp loads.

The tensors and keys are those llama.cpp's loaders read (models/bailingmoe2.py and models/afmoe.py have the math):
leading_dense_block_count dense SwiGLU layers, then layers with a router (F32, as real files), a selection bias
exp_probs_b.bias, the 3-D expert stacks and a shared expert. Every matrix is ~ N(0, 1/K) for K inputs so the
activations stay O(1); the vocabulary is synth.tokenizer_metadata's.

bailingmoe2 as Ling mini 2.0 (scaled down): a fused attn_qkv, per-head Q/K norms, NeoX RoPE over half of each
head, sigmoid routing within groups (4 groups of 2 experts, 2 groups used), weights renormalized and scaled by 2.5;
`nextn` trailing multi-token-prediction blocks (whole blocks plus their nextn.* tensors, never run).
afmoe as Trinity Nano: separate q/k/v plus the attention output gate attn_gate, post-norms after attention and
FFN, embeddings that the model multiplies by sqrt(n_embd) (written small to match), a sliding window on 3 of
every 4 layers (the 4th is global and has no RoPE), sigmoid routing (the gating key left out unless `gating`
says), weights renormalized and scaled by 2.826.
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


def write_ling_trinity(path: str | os.PathLike, arch: str, *, dtype: str = "f32", n_layer: int = 4,
                       n_embd: int = 64, n_ff: int = 96, n_ff_exp: int = 32, n_head: int = 4, n_head_kv: int = 2,
                       n_vocab: int = 512, n_expert: int = 8, n_expert_used: int = 2,
                       groups: tuple = (4, 2),
                       dense_lead: int = 1, n_shared: int = 1, gating: str | None = None,
                       weights_scale: float | None = None, weights_norm: bool = True, probs_bias: bool = True,
                       nextn: int = 1, sliding_window: int = 6, tied: bool = False, seed: int = 0,
                       extra_meta: dict | None = None) -> Path:
    """Write the model to path and return it. groups: (expert_group_count, expert_group_used_count), () for none.
    gating None: sigmoid, the key written for bailingmoe2 (where llama.cpp requires it) and left out for afmoe.
    weights_scale None: 2.5 (bailingmoe2) or 2.826 (afmoe); 0 leaves the key out. nextn: bailingmoe2's trailing
    MTP blocks. sliding_window: afmoe's window (0 leaves the key out, which llama.cpp cannot run). extra_meta:
    more keys."""
    if arch not in ("bailingmoe2", "afmoe"):
        raise ValueError(f"write_ling_trinity writes bailingmoe2 or afmoe, not {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    rng = np.random.default_rng(seed)
    a, E, hd, ling = arch, n_embd, n_embd // n_head, arch == "bailingmoe2"
    kv = n_head_kv * hd
    nextn = nextn if ling else 0

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d):
        return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

    def stack(m, k):
        return np.stack([linear(m, k) for _ in range(n_expert)])

    # afmoe's model multiplies the embeddings by sqrt(E): written that much smaller
    embd_std = (1.0 if ling else 1.0 / np.sqrt(E)) * (0.1 if tied else 1.0)
    weights = [("token_embd.weight", embd_std * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    for il in range(n_layer + nextn):
        p = f"blk.{il}."
        q, k, v = linear(n_head * hd, E), linear(kv, E), linear(kv, E)
        weights += [(p + "attn_norm.weight", norm(E))]
        weights += [(p + "attn_qkv.weight", np.concatenate([q, k, v]))] if ling else [
            (p + "attn_q.weight", q), (p + "attn_k.weight", k), (p + "attn_v.weight", v),
            (p + "attn_gate.weight", linear(n_head * hd, E)), (p + "post_attention_norm.weight", norm(E))]
        weights += [(p + "attn_output.weight", linear(E, n_head * hd)), (p + "attn_q_norm.weight", norm(hd)),
                    (p + "attn_k_norm.weight", norm(hd)), (p + "ffn_norm.weight", norm(E))]
        if not ling:
            weights.append((p + "post_ffw_norm.weight", norm(E)))
        if il < dense_lead:
            weights += [(p + "ffn_gate.weight", linear(n_ff, E)), (p + "ffn_up.weight", linear(n_ff, E)),
                        (p + "ffn_down.weight", linear(E, n_ff))]
        else:
            weights += [(p + "ffn_gate_inp.weight", linear(n_expert, E)),
                        (p + "ffn_gate_exps.weight", stack(n_ff_exp, E)),
                        (p + "ffn_up_exps.weight", stack(n_ff_exp, E)),
                        (p + "ffn_down_exps.weight", stack(E, n_ff_exp))]
            if probs_bias:
                weights.append((p + "exp_probs_b.bias", 0.1 * rng.standard_normal(n_expert, dtype=np.float32)))
            if n_shared:
                F_sh = n_ff_exp * n_shared
                weights += [(p + "ffn_gate_shexp.weight", linear(F_sh, E)),
                            (p + "ffn_up_shexp.weight", linear(F_sh, E)),
                            (p + "ffn_down_shexp.weight", linear(E, F_sh))]
        if il >= n_layer:  # a multi-token-prediction block: its own extras (llama.cpp loads, never runs them)
            weights += [(p + "nextn.eh_proj.weight", linear(E, 2 * E)), (p + "nextn.enorm.weight", norm(E)),
                        (p + "nextn.hnorm.weight", norm(E)), (p + "layer_output_norm.weight", norm(E))]
    weights.append(("output_norm.weight", (3.0 if tied else 1.0) * norm(E)))
    if not tied:
        weights.append(("output.weight", linear(n_vocab, E)))

    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta = {
        "general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": 4096, f"{a}.embedding_length": E, f"{a}.block_count": n_layer + nextn,
        f"{a}.feed_forward_length": n_ff, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.rope.freq_base": 10000.0, f"{a}.rope.dimension_count": hd // 2 if ling else hd,
        f"{a}.expert_count": n_expert, f"{a}.expert_used_count": n_expert_used,
        f"{a}.expert_feed_forward_length": n_ff_exp, f"{a}.expert_shared_count": n_shared,
        f"{a}.leading_dense_block_count": dense_lead, f"{a}.expert_weights_norm": bool(weights_norm),
        **tok_meta,
    }
    if gating is not None or ling:
        meta[f"{a}.expert_gating_func"] = GATING[gating or "sigmoid"]
    scale = weights_scale if weights_scale is not None else 2.5 if ling else 2.826
    if scale:
        meta[f"{a}.expert_weights_scale"] = float(scale)
    if groups:
        meta[f"{a}.expert_group_count"], meta[f"{a}.expert_group_used_count"] = groups
    if ling:
        meta[f"{a}.expert_shared_feed_forward_length"] = n_ff_exp
        if nextn:
            meta[f"{a}.nextn_predict_layers"] = nextn
    elif sliding_window:
        meta[f"{a}.attention.sliding_window"] = sliding_window
    meta.update(extra_meta or {})
    kinds = {**tok_types}
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and "gate_inp" not in name else GGMLType.F32)
               for name, x in weights]
    return write_gguf(path, meta, tensors, types=kinds)
