"""Metadata of two small mixture-of-experts families, as llama.cpp reads it: bailingmoe2 (inclusionAI's Ling /
Ring mini 2.0, 16B total / 1.4B active) and afmoe (Arcee's Trinity Nano / Mini). models/bailingmoe2.py and
models/afmoe.py have the math; this module turns the keys into ModelConfig fields (config.py calls it).

Both (keys under {arch}.):
  leading_dense_block_count (default 0) dense SwiGLU layers feed_forward_length wide, then experts
  expert_feed_forward_length wide (one value for all layers); expert_gating_func 1 softmax, 2 sigmoid (required
  by bailingmoe2; afmoe: absent or 0 means sigmoid); the selection bias exp_probs_b.bias (a tensor: optional in
  bailingmoe2, required in afmoe); expert_weights_norm (default off); expert_weights_scale (absent / 0: 1);
  group-limited routing by expert_group_count / expert_group_used_count (llama.cpp reads them for every arch);
  a shared SwiGLU expert added ungated.
bailingmoe2: the shared expert is (expert_shared_feed_forward_length, or the expert width when absent or 0) x
  expert_shared_count wide, as llama.cpp sizes it (expert_shared_count required, >= 1: every MoE layer has one);
  nextn_predict_layers trailing multi-token-prediction blocks are in the file but not run; the fused attn_qkv
  has n_embd query rows, so n_head x head_dim must equal n_embd.
afmoe: expert_shared_count (required; 0: no shared expert) x the expert width; the embeddings are multiplied by
  sqrt(n_embd) (mu-P); layers with (il + 1) % 4 == 0 use no RoPE (llama.cpp's n_no_rope_layer_step, which no key
  sets for this arch); attention.sliding_window must be > 0 (without it llama.cpp's afmoe graph crashes: measured),
  and layers are windowed per attention.sliding_window_pattern (an array of per-layer flags, or a period P,
  default 4: layers il % P < P - 1), with RoPE base rope.freq_base_swa (default: the global base) on them.
"""
from __future__ import annotations

import math

from .errors import ModelFileError, UnsupportedError

AFMOE_NO_ROPE_STEP = 4  # afmoe: layers with (il + 1) % 4 == 0 skip RoPE (llama.cpp's default step; no key)
AFMOE_SWA_PERIOD = 4  # afmoe: default of {arch}.attention.sliding_window_pattern (3 windowed, 1 global)


def ling_trinity_keys(r, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> dict:
    """The ModelConfig fields of a bailingmoe2 or afmoe file beyond the shared ones (module docstring); r: the
    config._Reader, n_layer the layers that run."""
    path, a = r.f.path, r.arch
    lead = r.get("{arch}.leading_dense_block_count", 0)
    if not 0 <= lead <= n_layer:
        raise ModelFileError(f"{path}: {r.key('{arch}.leading_dense_block_count')} {lead} is outside 0..{n_layer}")
    gating = r.get("{arch}.expert_gating_func", None if a == "bailingmoe2" else 0)
    if gating not in ((1, 2) if a == "bailingmoe2" else (0, 1, 2)):
        raise UnsupportedError(f"{path}: {r.key('{arch}.expert_gating_func')} {gating} is not supported "
                               "(1 softmax, 2 sigmoid)")
    norm, scale = r.expert_weights()
    groups, used = r.get("{arch}.expert_group_count", 0), r.get("{arch}.expert_group_used_count", 0)
    n_exp = r.positive("{arch}.expert_count")
    if groups > 1 and (n_exp % groups or not 0 < used < groups):
        raise ModelFileError(f"{path}: {n_exp} experts in {groups} groups of which {used} are used: the groups must "
                             "divide the experts and 1 <= used < groups (llama.cpp's rule)")
    n_ff_exp = r.positive("{arch}.expert_feed_forward_length")
    n_shared = r.get("{arch}.expert_shared_count")
    out = {"moe_layers": tuple(il >= lead for il in range(n_layer)), "expert_weights_norm": norm,
           "expert_gating": "softmax" if gating == 1 else "sigmoid", "expert_weights_scale": scale or 1.0,
           "n_expert_groups": groups if groups > 1 else 0, "n_expert_group_used": used if groups > 1 else 0}
    if a == "bailingmoe2":
        if n_shared < 1:
            raise ModelFileError(f"{path}: {r.key('{arch}.expert_shared_count')} must be >= 1, got {n_shared}")
        if n_head * head_dim != n_embd:
            raise UnsupportedError(f"{path}: bailingmoe2 needs head_count x key_length = embedding_length "
                                   f"({n_head} x {head_dim} != {n_embd}), as llama.cpp's fused attn_qkv does")
        out["n_ff_shexp"] = (r.get("{arch}.expert_shared_feed_forward_length", 0) or n_ff_exp) * n_shared
        return out
    if n_shared < 0:
        raise ModelFileError(f"{path}: {r.key('{arch}.expert_shared_count')} must be >= 0, got {n_shared}")
    out.update(n_ff_shexp=n_ff_exp * n_shared, embd_scale=math.sqrt(n_embd),
               no_rope_layers=tuple((il + 1) % AFMOE_NO_ROPE_STEP == 0 for il in range(n_layer)))
    return out


def afmoe_swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    """afmoe's (sliding_window, swa_layers, rope_freq_base_swa) (module docstring)."""
    window = r.get("{arch}.attention.sliding_window", 0)
    if window <= 0:  # llama.cpp builds the windowed attention inputs whatever the file says, and crashes
        raise UnsupportedError(f"{r.f.path}: afmoe files without {r.key('{arch}.attention.sliding_window')} > 0 "
                               "are not supported (llama.cpp cannot run them either)")
    pattern = r.meta.get(r.key("{arch}.attention.sliding_window_pattern"), AFMOE_SWA_PERIOD)
    if isinstance(pattern, list):
        if len(pattern) < n_layer:
            raise ModelFileError(f"{r.f.path}: {r.key('{arch}.attention.sliding_window_pattern')} has "
                                 f"{len(pattern)} flags for {n_layer} layers")
        layers = tuple(bool(p) for p in pattern[:n_layer])
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 0:
        layers = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer))
    else:
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.attention.sliding_window_pattern')} should be a period "
                             f">= 0 or per-layer flags, got {pattern!r}")
    return window, layers, r.get("{arch}.rope.freq_base_swa", rope_freq_base, kind=float)
