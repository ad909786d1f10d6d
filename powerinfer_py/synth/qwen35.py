"""Tiny random Qwen3.5 files (GGUF archs "qwen35" and "qwen35moe") and Qwen3-Next files ("qwen3next") that llama.cpp
loads, for tests and benchmarks; synth.write_synthetic_model hands these archs to write_qwen35 (models/qwen35.py and
models/qwen3next.py have the math).

Layout (defaults): n_layer 6 with full_attention_interval 3, so layers 2 and 5 attend and 0, 1, 3, 4 are gated
delta nets; 2 key heads and 4 value heads of 16 dims (each key head serves two value heads, as the 9B model's
16 / 32), a conv of 4 taps (the real files' ssm.conv_kernel); attention heads of 32 dims with RoPE on the first
16 (the real files rotate a quarter of 256) and text M-RoPE sections that sum to half of that.

Scales keep every activation O(1) and make the recurrent state matter: ssm_a = -exp(A_log) in [-0.5, -0.05] with
softplus(alpha + dt) ~ 0.7 gives per-token decays of about 0.7 .. 0.97, so a token's write is still visible ten
tokens later; beta = sigmoid(~N(0, 1)) mixes small and large updates. qwen35moe: every layer's FFN is 4 experts
(2 used) plus a shared expert behind its sigmoid gate. qwen3next: the same experts, no RoPE sections, and the
delta nets' projections fused per key head as in the real files (fuse_qkvz, fuse_ba) from the same random draws.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

QWEN35_ARCHS = ("qwen35", "qwen35moe", "qwen3next")


def fuse_qkvz(wqkv: np.ndarray, wz: np.ndarray, d: int, hk: int) -> np.ndarray:
    """qwen3next's ssm_in from qwen35's attn_qkv (rows q | k | v over all heads) and attn_gate (z): per key head g
    the rows [q_g (d) | k_g (d) | v (r d) | z (r d)], where the r = Hv / Hk value heads g r .. g r + r - 1 follow."""
    r = wz.shape[0] // (hk * d)
    q, k, v = np.split(wqkv, [hk * d, 2 * hk * d])
    per = [q.reshape(hk, d, -1), k.reshape(hk, d, -1), v.reshape(hk, r * d, -1), wz.reshape(hk, r * d, -1)]
    return np.concatenate(per, axis=1).reshape(-1, wqkv.shape[1])


def fuse_ba(w_beta: np.ndarray, w_alpha: np.ndarray, hk: int) -> np.ndarray:
    """qwen3next's ssm_ba: per key head g the rows [beta of its r value heads | alpha of them]."""
    return np.concatenate([w_beta.reshape(hk, -1, w_beta.shape[1]), w_alpha.reshape(hk, -1, w_beta.shape[1])],
                          axis=1).reshape(-1, w_beta.shape[1])


def _options(o: dict, n_embd: int, n_head: int) -> dict:
    """The qwen35-specific sizes (popped from o; see write_qwen35)."""
    hd = o.pop("head_dim", 2 * n_embd // n_head)
    n_rot = o.pop("n_rot", hd // 2)
    sections = o.pop("rope_sections", None)
    if sections is None:
        half = n_rot // 2
        sections = [half - 2 * (half // 3), half // 3, half // 3, 0]
    opts = {"head_dim": hd, "n_rot": n_rot, "sections": list(sections),
            "interval": o.pop("full_attention_interval", 3), "d_state": o.pop("d_state", 16),
            "n_k_heads": o.pop("n_k_heads", 2), "n_v_heads": o.pop("n_v_heads", 4), "kernel": o.pop("conv_kernel", 4),
            "n_ctx_train": o.pop("n_ctx_train", 512), "norm_eps": o.pop("norm_eps", 1e-6),
            "freq_base": o.pop("rope_freq_base", 10_000_000.0), "tied": o.pop("tied", True),
            "n_expert": o.pop("n_expert", 4), "n_expert_used": o.pop("n_expert_used", 2),
            "n_ff_exp": o.pop("n_ff_exp", None), "n_ff_shexp": o.pop("n_ff_shexp", None),
            "ssm_in": o.pop("ssm_in", True), "recurrent_layers": o.pop("recurrent_layers", None),
            "nextn": o.pop("nextn", 0)}
    if o:
        raise TypeError(f"unknown qwen35 synthetic model option(s): {', '.join(sorted(o))}")
    if opts["n_v_heads"] % opts["n_k_heads"]:
        raise ValueError("n_v_heads must be a multiple of n_k_heads")
    return opts


def write_qwen35(path: str | os.PathLike, arch: str, *, dtype: str, n_layer: int, n_embd: int, n_ff: int,
                 n_head: int, n_head_kv: int, n_vocab: int, seed: int, **overrides) -> Path:
    """Write a tiny random qwen35 / qwen35moe model; overrides: head_dim (default 2 n_embd / n_head), n_rot
    (default head_dim / 2), rope_sections (4 ints summing to n_rot / 2), full_attention_interval (default 3),
    d_state (16), n_k_heads (2), n_v_heads (4), conv_kernel (4), n_ctx_train, norm_eps, rope_freq_base, tied
    (default True); qwen35moe and qwen3next: n_expert (4), n_expert_used (2), n_ff_exp and n_ff_shexp (default
    n_ff); qwen3next: ssm_in (default True; False writes attn_qkv and attn_gate instead). recurrent_layers: a flag
    per layer (True = delta net) written as attention.recurrent_layers, or True to write the interval's flags as
    newer converters do (default None: no key, the interval decides). nextn (default 0): trailing
    multi-token-prediction blocks as llama.cpp's converter writes them by default (block_count counts them; each is
    a full-attention block plus nextn.* tensors, flagged not recurrent; never run for the main output)."""
    from ..gguf import write_gguf
    from ..gguf.types import GGMLType
    from .common import _FILE_TYPE, DTYPES, _encode, tokenizer_metadata

    o = _options(dict(overrides), n_embd, n_head)
    moe, nxt = arch in ("qwen35moe", "qwen3next"), arch == "qwen3next"
    E, hd, a = n_embd, o["head_dim"], arch
    dk, Hk, Hv, K = o["d_state"], o["n_k_heads"], o["n_v_heads"], o["kernel"]
    F_exp, F_sh = o["n_ff_exp"] or n_ff, o["n_ff_shexp"] or n_ff
    meta = {
        "general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
        f"{a}.context_length": o["n_ctx_train"], f"{a}.embedding_length": E, f"{a}.block_count": n_layer + o["nextn"],
        f"{a}.feed_forward_length": n_ff, f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.layer_norm_rms_epsilon": float(o["norm_eps"]),
        f"{a}.attention.key_length": hd, f"{a}.attention.value_length": hd,
        f"{a}.rope.freq_base": float(o["freq_base"]), f"{a}.rope.dimension_count": o["n_rot"],
        f"{a}.full_attention_interval": o["interval"],
        f"{a}.ssm.conv_kernel": K, f"{a}.ssm.state_size": dk, f"{a}.ssm.group_count": Hk,
        f"{a}.ssm.time_step_rank": Hv, f"{a}.ssm.inner_size": dk * Hv,
    }
    delta = [(il + 1) % o["interval"] != 0 for il in range(n_layer)]
    if o["recurrent_layers"] is not None:  # the layer kinds as flags (overriding the interval); MTP blocks attend
        if o["recurrent_layers"] is not True:
            delta = [bool(v) for v in o["recurrent_layers"]]
        meta[f"{a}.attention.recurrent_layers"] = delta + [False] * o["nextn"]
    delta += [False] * o["nextn"]
    if o["nextn"]:
        meta[f"{a}.nextn_predict_layers"] = o["nextn"]
    if not nxt:  # qwen3next rotates plain NeoX pairs: no M-RoPE sections
        meta[f"{a}.rope.dimension_sections"] = o["sections"]
    if moe:
        meta.update({f"{a}.expert_count": o["n_expert"], f"{a}.expert_used_count": o["n_expert_used"],
                     f"{a}.expert_feed_forward_length": F_exp, f"{a}.expert_shared_feed_forward_length": F_sh})
    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta.update(tok_meta)
    types = {f"{a}.rope.dimension_sections": (GGUFValueType.ARRAY, GGUFValueType.INT32), **tok_types,
             f"{a}.attention.recurrent_layers": (GGUFValueType.ARRAY, GGUFValueType.BOOL)}

    rng = np.random.default_rng(seed)

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d):
        return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

    out = [("token_embd.weight", (0.1 if o["tied"] else 1.0) * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    conv_dim = 2 * dk * Hk + dk * Hv
    for il in range(n_layer + o["nextn"]):
        p = f"blk.{il}."
        out.append((p + "attn_norm.weight", norm(E)))
        if il >= n_layer:  # a multi-token-prediction block: the full-attention block below plus its own tensors
            out += [(p + "nextn.eh_proj.weight", linear(E, 2 * E)), (p + "nextn.enorm.weight", norm(E)),
                    (p + "nextn.hnorm.weight", norm(E)), (p + "nextn.shared_head_norm.weight", norm(E))]
        if delta[il]:  # a gated delta net
            qkv, z, conv = linear(conv_dim, E), linear(dk * Hv, E), linear(conv_dim, K)
            dt, ssm_a = 0.3 * rng.standard_normal(Hv, dtype=np.float32), -rng.uniform(0.05, 0.5, Hv).astype(np.float32)
            beta, alpha = linear(Hv, E), linear(Hv, E)
            if nxt:  # ssm_ba and (unless ssm_in=False: llama.cpp's newer layout) ssm_in, fused per key head
                out += [(p + "ssm_in.weight", fuse_qkvz(qkv, z, dk, Hk))] if o["ssm_in"] else [
                    (p + "attn_qkv.weight", qkv), (p + "attn_gate.weight", z)]
                out.append((p + "ssm_ba.weight", fuse_ba(beta, alpha, Hk)))
            else:
                out += [(p + "attn_qkv.weight", qkv), (p + "attn_gate.weight", z), (p + "ssm_beta.weight", beta),
                        (p + "ssm_alpha.weight", alpha)]
            out += [(p + "ssm_conv1d.weight", conv), (p + "ssm_dt.bias", dt), (p + "ssm_a", ssm_a),
                    (p + "ssm_norm.weight", norm(dk)), (p + "ssm_out.weight", linear(E, dk * Hv))]
        else:  # gated full attention: q rows per head [query (hd) | gate (hd)]
            out += [(p + "attn_q.weight", linear(2 * n_head * hd, E)), (p + "attn_k.weight", linear(n_head_kv * hd, E)),
                    (p + "attn_v.weight", linear(n_head_kv * hd, E)), (p + "attn_output.weight", linear(E, n_head * hd)),
                    (p + "attn_q_norm.weight", norm(hd)), (p + "attn_k_norm.weight", norm(hd))]
        out.append((p + "post_attention_norm.weight", norm(E)))
        if moe:
            n_exp = o["n_expert"]
            out += [(p + "ffn_gate_inp.weight", 2.0 * linear(n_exp, E)),
                    (p + "ffn_gate_exps.weight", np.stack([linear(F_exp, E) for _ in range(n_exp)])),
                    (p + "ffn_up_exps.weight", np.stack([linear(F_exp, E) for _ in range(n_exp)])),
                    (p + "ffn_down_exps.weight", np.stack([linear(E, F_exp) for _ in range(n_exp)])),
                    (p + "ffn_gate_inp_shexp.weight", rng.standard_normal(E, dtype=np.float32) / np.float32(np.sqrt(E))),
                    (p + "ffn_gate_shexp.weight", linear(F_sh, E)), (p + "ffn_up_shexp.weight", linear(F_sh, E)),
                    (p + "ffn_down_shexp.weight", linear(E, F_sh))]
        else:
            out += [(p + "ffn_gate.weight", linear(n_ff, E)), (p + "ffn_up.weight", linear(n_ff, E)),
                    (p + "ffn_down.weight", linear(E, n_ff))]
    out.append(("output_norm.weight", norm(E) * (3.0 if o["tied"] else 1.0)))
    if not o["tied"]:
        out.append(("output.weight", 2.5 * linear(n_vocab, E)))
    # 1-D tensors, the conv taps and the routers stay F32 (as in llama.cpp's files); the other matrices take dtype
    keep = ("ssm_conv1d", "gate_inp")
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and not any(s in name for s in keep) else GGMLType.F32)
               for name, x in out]
    return write_gguf(path, meta, tensors, types=types)
