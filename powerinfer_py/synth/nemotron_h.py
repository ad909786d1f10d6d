"""Tiny random Nemotron-H files (GGUF arch "nemotron_h") that llama.cpp loads, for tests and benchmarks;
synth.write_synthetic_model hands this arch to write_nemotron_h (models/nemotron_h.py has the math).

Layout: a pattern string with one letter per layer, as Nemotron-H's hybrid_override_pattern: "M" a Mamba-2 mixer,
"*" attention, "-" a squared-ReLU FFN. The default "M-M*M-" makes every kind feed every kind. The mixer defaults:
8 heads of 16 (d_inner 128), 2 groups of B and C (4 heads each), a state of 16, a conv of 4 taps (the real files'
ssm.conv_kernel).

Scales keep every activation O(1) and make the recurrent state matter: A = -exp(A_log) in [-1, -0.1] (ssm_a is
stored as A, already negative, as the converter writes it) with softplus(dt + dt_bias) ~ 0.5 .. 1 gives per-token
decays of about 0.4 .. 0.95, so a token is still visible several tokens later; D ~ 1 makes the skip term as large
as the scan's output; the conv bias ~ N(0, 0.3) so a file without it would differ visibly.

granitehybrid (IBM Granite 4.0-H): the pattern has only "M" and "*" (default "M*MM*M"), every layer then has
ffn_norm and a SwiGLU FFN, or with n_expert > 0 experts (n_expert_used chosen, n_ff wide, as feed_forward_length)
and an optional ungated shared expert n_ff_shexp wide; Granite's scalars (synth.common.GRANITE_SCALES, or None to leave
a key out) and rope_finetuned (default False, as the Granite 4.0-H files: no RoPE). The embeddings are drawn with
std 1 / embedding_scale and the output head times logit_scale, so both scales cancel in a right model.

nemotron_h_moe (Nemotron 3 Nano): nemotron_h's pattern, every "-" layer then experts: n_expert (default 8),
n_expert_used (2) chosen, n_ff wide (expert_feed_forward_length; feed_forward_length marks the layer), a shared
expert n_ff_shexp (default n_ff) wide, a selection bias exp_probs_b large enough to change some choices,
expert_weights_norm (True), expert_weights_scale (2.5), moe_latent (0: none; else the latent width, with
ffn_latent_down / ffn_latent_up), n_nextn (0; 1 appends an MTP block's tensors that must not be run).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

DEFAULT_PATTERN = "M-M*M-"
GRANITE_PATTERN = "M*MM*M"  # granitehybrid's default: attention after one and after two mixers


def _options(o: dict, n_layer: int, arch: str) -> dict:
    granite = arch == "granitehybrid"
    default = DEFAULT_PATTERN
    if granite:  # GRANITE_PATTERN at its 6 layers, else mixers and attention layers alternating
        default = GRANITE_PATTERN if n_layer == len(GRANITE_PATTERN) else ("M*" * n_layer)[:n_layer]
    opts = {"pattern": "M" * n_layer if arch == "mamba2" else o.pop("pattern", default), "d_state": o.pop("d_state", 16),
            "n_group": o.pop("n_group", 2), "n_ssm_head": o.pop("n_ssm_head", 8), "head_dim": o.pop("ssm_head_dim", 16),
            "kernel": o.pop("conv_kernel", 4), "n_ctx_train": o.pop("n_ctx_train", 512),
            "norm_eps": o.pop("norm_eps", 1e-5), "ln_eps": o.pop("ln_eps", 1e-5), "tied": o.pop("tied", False), "conv_bias": o.pop("conv_bias", True)}
    if granite:
        from .common import GRANITE_SCALES
        opts["scales"] = {k: o.pop(k, v) for k, v in GRANITE_SCALES.items()}
        opts.update(rope=o.pop("rope_finetuned", False), n_expert=o.pop("n_expert", 0),
                    n_used=o.pop("n_expert_used", 2), n_ff_shexp=o.pop("n_ff_shexp", 0))
    if arch == "nemotron_h_moe":
        opts.update(n_expert=o.pop("n_expert", 8), n_used=o.pop("n_expert_used", 2), n_ff_shexp=o.pop("n_ff_shexp", 0),
                    w_norm=o.pop("expert_weights_norm", True), w_scale=o.pop("expert_weights_scale", 2.5),
                    latent=o.pop("moe_latent", 0), n_nextn=o.pop("n_nextn", 0))
    if o:
        raise TypeError(f"unknown {arch} synthetic model option(s): {', '.join(sorted(o))}")
    kinds = "M*" if granite else "M*-"
    if len(opts["pattern"]) != n_layer or set(opts["pattern"]) - set(kinds):
        raise ValueError(f"pattern {opts['pattern']!r} must have one of {', '.join(kinds)} per layer ({n_layer})")
    if opts["n_ssm_head"] % opts["n_group"]:
        raise ValueError("n_ssm_head must be a multiple of n_group")
    return opts


def write_nemotron_h(path: str | os.PathLike, arch: str, *, dtype: str, n_layer: int, n_embd: int, n_ff: int,
                     n_head: int, n_head_kv: int, n_vocab: int, seed: int, **overrides) -> Path:
    """Write a tiny random nemotron_h (or mamba2: every layer a mixer) model; overrides: pattern (one of "M*-" per layer, default "M-M*M-"),
    d_state (16), n_group (2), n_ssm_head (8), ssm_head_dim (16), conv_kernel (4), n_ctx_train, norm_eps,
    tied (default False), conv_bias (default True)."""
    from ..gguf import write_gguf
    from ..gguf.types import GGMLType
    from .common import _FILE_TYPE, DTYPES, _encode, tokenizer_metadata

    o = _options(dict(overrides), n_layer, arch)
    a, E, hd = arch, n_embd, n_embd // n_head
    N, G, H, P, K = o["d_state"], o["n_group"], o["n_ssm_head"], o["head_dim"], o["kernel"]
    d_inner = H * P
    conv_dim = d_inner + 2 * G * N
    pat = o["pattern"]
    meta = {
        "general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": o["n_ctx_train"], f"{a}.embedding_length": E, f"{a}.block_count": n_layer,
        f"{a}.feed_forward_length": [n_ff if c == "-" else 0 for c in pat], f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": [n_head_kv if c == "*" else 0 for c in pat],
        f"{a}.attention.layer_norm_rms_epsilon": float(o["norm_eps"]),
        f"{a}.attention.layer_norm_epsilon": float(o["ln_eps"]),
        f"{a}.attention.key_length": hd, f"{a}.attention.value_length": hd,
        f"{a}.ssm.conv_kernel": K, f"{a}.ssm.state_size": N, f"{a}.ssm.group_count": G,
        f"{a}.ssm.time_step_rank": H, f"{a}.ssm.inner_size": d_inner,
    }
    granite = o.get("scales")
    if granite is not None:  # every layer has an FFN: feed_forward_length is its width
        meta[f"{a}.feed_forward_length"] = n_ff
        meta.update({f"{a}.{k.replace('attention_', 'attention.')}": float(v) for k, v in granite.items()
                     if v is not None})
        meta[f"{a}.rope.scaling.finetuned"] = bool(o["rope"])
        if o["n_expert"]:
            meta.update({f"{a}.expert_count": o["n_expert"], f"{a}.expert_used_count": o["n_used"]})
            if o["n_ff_shexp"]:
                meta[f"{a}.expert_shared_feed_forward_length"] = o["n_ff_shexp"]
    moe = a == "nemotron_h_moe"
    if moe:
        _moe_meta(meta, a, o, n_ff)
    if a == "mamba2":
        for key in ("feed_forward_length", "attention.head_count_kv", "attention.key_length", "attention.value_length"):
            del meta[f"{a}.{key}"]
        meta.update({f"{a}.feed_forward_length": 0, f"{a}.attention.head_count": 0})
    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta.update(tok_meta)
    int32s = (GGUFValueType.ARRAY, GGUFValueType.INT32)
    types = {**tok_types}

    if a != "mamba2":  # the per-layer arrays that tell the layer kinds apart
        types.update({f"{a}.attention.head_count_kv": int32s})
        if granite is None:
            types[f"{a}.feed_forward_length"] = int32s
    rng = np.random.default_rng(seed)

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(*shape):
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)

    scale = {k: v or 1.0 for k, v in granite.items()} if granite is not None else {}
    embd_std = 1.0 / scale.get("embedding_scale", 1.0)
    out = [("token_embd.weight", embd_std * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    for il, kind in enumerate(pat):
        p = f"blk.{il}."
        out.append((p + "attn_norm.weight", norm(E)))
        if kind == "M":
            out += [(p + "ssm_in.weight", linear(2 * d_inner + 2 * G * N + H, E)),
                    (p + "ssm_conv1d.weight", linear(conv_dim, K))]
            if o["conv_bias"]:
                out.append((p + "ssm_conv1d.bias", 0.3 * rng.standard_normal(conv_dim, dtype=np.float32)))
            out += [(p + "ssm_dt.bias", rng.uniform(0.0, 0.5, H).astype(np.float32)),
                    (p + "ssm_a", -np.exp(rng.uniform(np.log(0.1), 0.0, (H, 1))).astype(np.float32)),
                    (p + "ssm_d", (1.0 + 0.3 * rng.standard_normal((H, 1))).astype(np.float32)),
                    (p + "ssm_norm.weight", norm(G, d_inner // G)), (p + "ssm_out.weight", linear(E, d_inner))]
        elif kind == "*":
            out += [(p + "attn_q.weight", linear(n_head * hd, E)), (p + "attn_k.weight", linear(n_head_kv * hd, E)),
                    (p + "attn_v.weight", linear(n_head_kv * hd, E)), (p + "attn_output.weight", linear(E, n_head * hd))]
        elif moe:
            out += _moe_ffn(p, o, E, n_ff, rng, linear)
        else:  # relu(up x)^2: scaled so the squares stay O(1)
            out += [(p + "ffn_up.weight", linear(n_ff, E)), (p + "ffn_down.weight", 0.5 * linear(E, n_ff))]
        if granite is not None:
            out += [(p + "ffn_norm.weight", norm(E))] + _granite_ffn(p, o, E, n_ff, rng, linear)
    if moe and o["n_nextn"]:  # an MTP block after the trunk: garbage that a right model never reads
        p = f"blk.{n_layer}."
        X, S, hd, M = o["n_expert"], o["n_ff_shexp"] or n_ff, E // n_head, o["latent"] or E
        out += [(p + "nextn.enorm.weight", norm(E)), (p + "nextn.hnorm.weight", norm(E)),
                (p + "nextn.eh_proj.weight", linear(E, 2 * E)), (p + "nextn.shared_head_norm.weight", norm(E)),
                (p + "attn_norm.weight", norm(E)), (p + "attn_q.weight", linear(n_head * hd, E)),
                (p + "attn_k.weight", linear(n_head * hd, E)), (p + "attn_v.weight", linear(n_head * hd, E)),
                (p + "attn_output.weight", linear(E, n_head * hd)), (p + "post_attention_norm.weight", norm(E)),
                (p + "ffn_gate_inp.weight", linear(X, E)), (p + "exp_probs_b.bias", np.zeros(X, np.float32)),
                (p + "ffn_up_exps.weight", np.stack([linear(n_ff, M) for _ in range(X)])),
                (p + "ffn_down_exps.weight", np.stack([linear(M, n_ff) for _ in range(X)])),
                (p + "ffn_up_shexp.weight", linear(S, E)), (p + "ffn_down_shexp.weight", linear(E, S))]
    out.append(("output_norm.weight", norm(E)))
    if not o["tied"]:
        out.append(("output.weight", 2.5 * scale.get("logit_scale", 1.0) * linear(n_vocab, E)))
    # 1-D tensors, the conv taps, A, D and the grouped norm stay F32 (as in llama.cpp's files); the rest take dtype
    keep = ("ssm_conv1d", "ssm_a", "ssm_d", "ssm_norm", "gate_inp", "exp_probs_b")
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and not any(s in name for s in keep) else GGMLType.F32)
               for name, x in out]
    return write_gguf(path, meta, tensors, types=types)


def _granite_ffn(p: str, o: dict, E: int, F: int, rng, linear) -> list:
    """A granitehybrid layer's FFN: SwiGLU, or experts (a router with clear but not one-hot choices) with the
    optional ungated shared expert."""
    if not o["n_expert"]:
        return [(p + "ffn_gate.weight", linear(F, E)), (p + "ffn_up.weight", linear(F, E)),
                (p + "ffn_down.weight", linear(E, F))]
    X, S = o["n_expert"], o["n_ff_shexp"]
    out = [(p + "ffn_gate_inp.weight", 2.0 * linear(X, E)),
           (p + "ffn_gate_exps.weight", np.stack([linear(F, E) for _ in range(X)])),
           (p + "ffn_up_exps.weight", np.stack([linear(F, E) for _ in range(X)])),
           (p + "ffn_down_exps.weight", np.stack([linear(E, F) for _ in range(X)]))]
    if S:
        out += [(p + "ffn_gate_shexp.weight", linear(S, E)), (p + "ffn_up_shexp.weight", linear(S, E)),
                (p + "ffn_down_shexp.weight", linear(E, S))]
    return out


def _moe_meta(meta: dict, a: str, o: dict, F: int) -> None:
    """nemotron_h_moe's expert keys (the per-layer arrays of an MTP block get one more entry)."""
    meta.update({f"{a}.expert_count": o["n_expert"], f"{a}.expert_used_count": o["n_used"],
                 f"{a}.expert_feed_forward_length": F, f"{a}.expert_shared_feed_forward_length": o["n_ff_shexp"] or F,
                 f"{a}.expert_shared_count": 1, f"{a}.expert_weights_norm": bool(o["w_norm"]),
                 f"{a}.expert_weights_scale": float(o["w_scale"]), f"{a}.expert_group_count": 1,
                 f"{a}.expert_group_used_count": 1})
    if o["latent"]:
        meta[f"{a}.moe_latent_size"] = o["latent"]
    if o["n_nextn"]:
        meta[f"{a}.nextn_predict_layers"] = o["n_nextn"]
        meta[f"{a}.block_count"] += o["n_nextn"]
        meta[f"{a}.feed_forward_length"] = meta[f"{a}.feed_forward_length"] + [F]
        meta[f"{a}.attention.head_count_kv"] = meta[f"{a}.attention.head_count_kv"] + [meta[f"{a}.attention.head_count"]]


def _moe_ffn(p: str, o: dict, E: int, F: int, rng, linear) -> list:
    """A nemotron_h_moe expert layer: router, selection bias, relu^2 experts (in the latent width when set), the
    latent projections, and the relu^2 shared expert."""
    X, S, M = o["n_expert"], o["n_ff_shexp"] or F, o["latent"] or E
    out = [(p + "ffn_gate_inp.weight", 2.0 * linear(X, E)),
           (p + "exp_probs_b.bias", 0.3 * rng.standard_normal(X, dtype=np.float32)),
           (p + "ffn_up_exps.weight", np.stack([linear(F, M) for _ in range(X)])),
           (p + "ffn_down_exps.weight", np.stack([0.5 * linear(M, F) for _ in range(X)]))]
    if o["latent"]:
        out += [(p + "ffn_latent_down.weight", linear(M, E)), (p + "ffn_latent_up.weight", linear(E, M))]
    return out + [(p + "ffn_up_shexp.weight", linear(S, E)), (p + "ffn_down_shexp.weight", 0.5 * linear(E, S))]
