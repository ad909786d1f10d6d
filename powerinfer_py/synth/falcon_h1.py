"""Tiny random Falcon-H1 files (GGUF arch "falcon-h1") that llama.cpp loads, for tests; synth.write_synthetic_model
hands this arch to write_falcon_h1 (models/falcon_h1.py has the math).

Every layer has attention (NeoX RoPE, grouped-query), a Mamba-2 mixer (synth/nemotron_h.py's defaults: 8 heads of 16,
2 groups of B and C, a state of 16, a conv of 4 taps) and a SwiGLU FFN whose norm is named "blk.N.ffn_norm" (no
".weight"), as llama.cpp's converter writes it. Options: ssm_norm (default True; False leaves the optional grouped
norm out), conv_bias (True), tied (False), conv_kernel, d_state, n_group, n_ssm_head, ssm_head_dim, rope_base
(10000), n_ctx_train (512), norm_eps (1e-5).

Scales as synth/nemotron_h: decays of about 0.4 .. 0.95 per token so the state matters, D ~ 1, a conv bias ~ N(0, 0.3),
the grouped norm's weights 1 + N(0, 0.1) scaled by 2 so a file without it differs visibly; the mixer's output is
about as large as the attention's so dropping either branch shows.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ARCH = "falcon-h1"


def _options(o: dict) -> dict:
    opts = {"ssm_norm": o.pop("ssm_norm", True), "conv_bias": o.pop("conv_bias", True), "tied": o.pop("tied", False),
            "kernel": o.pop("conv_kernel", 4), "d_state": o.pop("d_state", 16), "n_group": o.pop("n_group", 2),
            "n_ssm_head": o.pop("n_ssm_head", 8), "head_dim": o.pop("ssm_head_dim", 16),
            "rope_base": o.pop("rope_base", 10000.0), "n_ctx_train": o.pop("n_ctx_train", 512),
            "norm_eps": o.pop("norm_eps", 1e-5)}
    if o:
        raise TypeError(f"unknown {ARCH} synthetic model option(s): {', '.join(sorted(o))}")
    if opts["n_ssm_head"] % opts["n_group"]:
        raise ValueError("n_ssm_head must be a multiple of n_group")
    return opts


def write_falcon_h1(path: str | os.PathLike, *, dtype: str, n_layer: int, n_embd: int, n_ff: int, n_head: int,
                    n_head_kv: int, n_vocab: int, seed: int, **overrides) -> Path:
    """Write a tiny random falcon-h1 model (module docstring lists the overrides)."""
    from ..gguf import write_gguf
    from ..gguf.types import GGMLType
    from .common import _FILE_TYPE, DTYPES, _encode, tokenizer_metadata

    o = _options(dict(overrides))
    a, E, hd = ARCH, n_embd, n_embd // n_head
    N, G, H, P, K = o["d_state"], o["n_group"], o["n_ssm_head"], o["head_dim"], o["kernel"]
    d_inner = H * P
    conv_dim = d_inner + 2 * G * N
    meta = {
        "general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": o["n_ctx_train"], f"{a}.embedding_length": E, f"{a}.block_count": n_layer,
        f"{a}.feed_forward_length": n_ff, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.key_length": hd,
        f"{a}.attention.value_length": hd, f"{a}.attention.layer_norm_rms_epsilon": float(o["norm_eps"]),
        f"{a}.rope.freq_base": float(o["rope_base"]),
        f"{a}.ssm.conv_kernel": K, f"{a}.ssm.state_size": N, f"{a}.ssm.group_count": G,
        f"{a}.ssm.time_step_rank": H, f"{a}.ssm.inner_size": d_inner,
    }
    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta.update(tok_meta)
    types = {**tok_types}
    rng = np.random.default_rng(seed)

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(*shape):
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)

    out = [("token_embd.weight", rng.standard_normal((n_vocab, E), dtype=np.float32))]
    for il in range(n_layer):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", norm(E)), (p + "attn_q.weight", linear(n_head * hd, E)),
                (p + "attn_k.weight", 2.0 * linear(n_head_kv * hd, E)), (p + "attn_v.weight", linear(n_head_kv * hd, E)),
                (p + "attn_output.weight", linear(E, n_head * hd)),
                (p + "ssm_in.weight", linear(2 * d_inner + 2 * G * N + H, E)), (p + "ssm_conv1d.weight", linear(conv_dim, K))]
        if o["conv_bias"]:
            out.append((p + "ssm_conv1d.bias", 0.3 * rng.standard_normal(conv_dim, dtype=np.float32)))
        out += [(p + "ssm_dt.bias", rng.uniform(0.0, 0.5, H).astype(np.float32)),
                (p + "ssm_a", -np.exp(rng.uniform(np.log(0.1), 0.0, (H, 1))).astype(np.float32)),
                (p + "ssm_d", (1.0 + 0.3 * rng.standard_normal((H, 1))).astype(np.float32))]
        if o["ssm_norm"]:
            out.append((p + "ssm_norm.weight", 2.0 * norm(G, d_inner // G)))
        out += [(p + "ssm_out.weight", linear(E, d_inner)), (p + "ffn_norm", norm(E)),
                (p + "ffn_gate.weight", linear(n_ff, E)), (p + "ffn_up.weight", linear(n_ff, E)),
                (p + "ffn_down.weight", linear(E, n_ff))]
    out.append(("output_norm.weight", norm(E)))
    if not o["tied"]:
        out.append(("output.weight", 2.5 * linear(n_vocab, E)))
    # 1-D tensors, the conv taps, A, D and the grouped norm stay F32 (as in llama.cpp's files); the rest take dtype
    keep = ("ssm_conv1d", "ssm_a", "ssm_d", "ssm_norm")
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and not any(s in name for s in keep) else GGMLType.F32)
               for name, x in out]
    return write_gguf(path, meta, tensors, types=types)
