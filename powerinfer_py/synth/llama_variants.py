"""Tiny random hunyuan-dense, apertus and seed_oss files that llama.cpp loads, for tests and demos;
synth.write_synthetic_model hands these archs to write_llama_variant (models/hunyuan_dense.py, apertus.py and
seed_oss.py have the math).

Shapes as the real models in miniature: heads of 2 * n_embd / n_head dims (wider than n_embd / n_head, as
Hunyuan's 128-dim heads over 1024 / 16), GQA. hunyuan-dense: tied head (the small models tie), per-head Q/K norms.
apertus: untied head (llama.cpp requires output.weight), per-head Q/K norms, no ffn_gate, per-layer xIELU
parameters that differ between layers (so that a layer reading another's shows). seed_oss: untied head, q/k/v
biases, the FFN norm stored as post_attention_norm. Weights as synth.py: matrices ~ N(0, 1/K), norms ~ 1 + N(0, 0.1^2).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

LLAMA_VARIANT_ARCHS = ("hunyuan-dense", "apertus", "seed_oss")


def default_xielu(n_layer: int) -> list[tuple[float, float, float, float]]:
    """Per-layer raw (alpha_n, alpha_p, beta, eps): near the HF initial values (softplus^-1(0.8) ~ 0.22 for
    both alphas, beta 0.5, eps -1e-6), spread over the layers."""
    return [(0.2 + 0.6 * il, -0.3 - 0.4 * il, 0.5 - 0.1 * il, -1e-6) for il in range(n_layer)]


def write_llama_variant(path: str | os.PathLike, arch: str, *, dtype: str = "f32", n_layer: int = 2,
                        n_embd: int = 64, n_ff: int = 128, n_head: int = 4, n_head_kv: int = 2, n_vocab: int = 512,
                        seed: int = 0, **overrides) -> Path:
    """Write a tiny random `arch` model (LLAMA_VARIANT_ARCHS). Overrides: head_dim (default 2 * n_embd / n_head),
    n_ctx_train (512), norm_eps (1e-6), rope_freq_base (10000), tied (hunyuan-dense: True, others False),
    rope_scaling (dict written as {arch}.rope.scaling.<key>), rope_alpha (hunyuan-dense: {arch}.rope.scaling.alpha;
    default None: no key), rope_freqs (apertus: head_dim / 2 factors as rope_freqs.weight), out_bias (apertus:
    attn_output.bias, default False), qk_norm_bias (apertus: the unused attn_q/k_norm.bias, default False), xielu
    (apertus: per-layer (alpha_n, alpha_p, beta, eps), default default_xielu; or one tuple written as scalars),
    qkv_bias (q/k/v biases; default True for seed_oss, False otherwise)."""
    from gguf import GGUFValueType

    from ..gguf import write_gguf
    from ..gguf.types import GGMLType
    from .common import _FILE_TYPE, DTYPES, _encode, tokenizer_metadata

    if arch not in LLAMA_VARIANT_ARCHS:
        raise ValueError(f"write_llama_variant writes {', '.join(LLAMA_VARIANT_ARCHS)}, not {arch!r}")
    o = dict(overrides)
    hd = o.pop("head_dim", 2 * n_embd // n_head)
    tied = o.pop("tied", arch == "hunyuan-dense")
    rope_scaling, rope_alpha = dict(o.pop("rope_scaling", None) or {}), o.pop("rope_alpha", None)
    rope_freqs = o.pop("rope_freqs", None)
    out_bias, qk_norm_bias = o.pop("out_bias", False), o.pop("qk_norm_bias", False)
    xielu = o.pop("xielu", default_xielu(n_layer))
    qkv_bias = o.pop("qkv_bias", arch == "seed_oss")
    a = arch
    meta = {
        "general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": o.pop("n_ctx_train", 512), f"{a}.embedding_length": n_embd,
        f"{a}.block_count": n_layer, f"{a}.feed_forward_length": n_ff, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv,
        f"{a}.attention.layer_norm_rms_epsilon": float(o.pop("norm_eps", 1e-6)),
        f"{a}.rope.freq_base": float(o.pop("rope_freq_base", 10000.0)), f"{a}.rope.dimension_count": hd,
        f"{a}.attention.key_length": hd, f"{a}.attention.value_length": hd,
    }
    if o:
        raise TypeError(f"unknown {arch} synthetic model option(s): {', '.join(sorted(o))}")
    types = {}
    for key, value in rope_scaling.items():
        meta[f"{a}.rope.scaling.{key}"] = value
    if rope_alpha is not None:
        meta[f"{a}.rope.scaling.alpha"] = float(rope_alpha)
    if a == "apertus":
        per_layer = isinstance(xielu[0], (tuple, list))
        for j, key in enumerate(("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps")):
            if per_layer:
                meta[key] = [float(p[j]) for p in xielu]
                types[key] = (GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
            else:
                meta[key] = float(xielu[j])
                types[key] = (GGUFValueType.FLOAT32, None)
    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta.update(tok_meta)
    types |= {**tok_types}

    rng = np.random.default_rng(seed)

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d):
        return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

    def vec(d, std=0.5):
        return std * rng.standard_normal(d, dtype=np.float32)

    E, q_dim, kv_dim = n_embd, n_head * hd, n_head_kv * hd
    out = [("token_embd.weight", (0.1 if tied else 1.0) * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    if rope_freqs is not None:
        out.append(("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32).reshape(hd // 2)))
    for il in range(n_layer):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", norm(E)), (p + "attn_q.weight", linear(q_dim, E)),
                (p + "attn_k.weight", linear(kv_dim, E)), (p + "attn_v.weight", linear(kv_dim, E))]
        if qkv_bias:
            out += [(p + "attn_q.bias", vec(q_dim)), (p + "attn_k.bias", vec(kv_dim)), (p + "attn_v.bias", vec(kv_dim))]
        if a != "seed_oss":
            out += [(p + "attn_q_norm.weight", norm(hd)), (p + "attn_k_norm.weight", norm(hd))]
            if qk_norm_bias:
                out += [(p + "attn_q_norm.bias", vec(hd)), (p + "attn_k_norm.bias", vec(hd))]
        out.append((p + "attn_output.weight", linear(E, q_dim)))
        if out_bias:
            out.append((p + "attn_output.bias", vec(E)))
        out.append((p + ("post_attention_norm.weight" if a == "seed_oss" else "ffn_norm.weight"), norm(E)))
        if a != "apertus":
            out.append((p + "ffn_gate.weight", linear(n_ff, E)))
        out += [(p + "ffn_up.weight", linear(n_ff, E)), (p + "ffn_down.weight", linear(E, n_ff))]
    out.append(("output_norm.weight", norm(E) * (3.0 if tied else 1.0)))
    if not tied:
        out.append(("output.weight", 2.5 * linear(n_vocab, E)))
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 else GGMLType.F32) for name, x in out]
    return write_gguf(path, meta, tensors, types=types)
