"""The metadata of the Mamba-2 hybrids, read for ModelConfig (config.py calls mamba2_keys).

  nemotron_h  (NVIDIA Nemotron-H, Nemotron Nano 2) every layer is ONE of three kinds, told apart by two per-layer
              arrays as llama.cpp does: {arch}.attention.head_count_kv[il] == 0 and {arch}.feed_forward_length[il]
              == 0 -> a Mamba-2 mixer; head_count_kv 0 and feed_forward_length > 0 -> a squared-ReLU FFN
              (relu(up x)^2, no gate); head_count_kv > 0 -> attention (no RoPE; {arch}.attention.scale, absent
              or 0: 1/sqrt(head_dim)). The mixer sizes: ssm.conv_kernel (>= 2), ssm.inner_size (d_inner),
              ssm.state_size (d_state), ssm.time_step_rank (the mixer's heads; d_inner must be a multiple) and
              ssm.group_count (B and C groups; the heads must be a multiple), all required. The attention layers
              must share one KV head count and the FFN layers one width (n_ff). Files with experts are refused.

  nemotron_h_moe  (Nemotron 3 Nano 30B-A3B and kin) nemotron_h's layer kinds and mixer keys, with every FFN layer a
              mixture of experts (feed_forward_length[il] > 0 marks it): {arch}.expert_count experts, expert_used_count
              chosen by sigmoid scores plus the selection bias blk.N.exp_probs_b.bias (weights: the unbiased scores),
              renormalized when {arch}.expert_weights_norm, times {arch}.expert_weights_scale (absent or 0: 1);
              optional group-limited routing ({arch}.expert_group_count > 1, expert_group_used_count); experts
              expert_feed_forward_length wide, a squared-ReLU shared expert expert_shared_feed_forward_length wide;
              {arch}.moe_latent_size (optional) the experts' width when the layer projects into a latent space
              (ffn_latent_down / ffn_latent_up); {arch}.nextn_predict_layers trailing MTP blocks are not run.

  mamba2      (plain Mamba-2 files) every layer is a mixer after its RMSNorm; the same ssm.* keys; no attention
              or FFN keys are read (the converter writes head_count and feed_forward_length 0).

  granitehybrid  (IBM Granite 4.0-H) every layer is a mixer ({arch}.attention.head_count_kv[il] == 0) or an
              attention layer, and EVERY layer then has an FFN (dense SwiGLU, or experts): feed_forward_length is
              the FFN (or expert) width, not a layer-kind marker. The same ssm.* keys; experts are allowed.

  falcon-h1  (TII Falcon-H1, Falcon-H1R) EVERY layer runs attention and a Mamba-2 mixer side by side, then a SwiGLU
              FFN: mamba_layers is all True and no layer is FFN-only; attention.head_count_kv (one value) and
              feed_forward_length (the FFN width) are plain scalars. The same ssm.* keys.

Scalars may also be stored as per-layer arrays of one value (config._Reader.get).
"""
from __future__ import annotations


from .errors import ModelFileError, UnsupportedError

MAMBA2_ARCHS = ("nemotron_h", "mamba2", "granitehybrid", "nemotron_h_moe", "falcon-h1")


def _layer_array(r, suffix: str, n_layer: int) -> list[int]:
    """A per-layer int array (a scalar is the same value on every layer)."""
    key = r.key(suffix)
    v = r.meta.get(key)
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v] * n_layer
    if isinstance(v, list) and len(v) > n_layer and len(v) == r.get("{arch}.block_count", 0):
        v = v[:n_layer]  # trailing MTP blocks (nemotron_h_moe's nextn_predict_layers) are not run
    if not isinstance(v, list) or len(v) != n_layer or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ModelFileError(f"{r.f.path}: {key} must be an array of {n_layer} non-negative ints, got {v!r}")
    return v


def _one(r, key: str, values: list[int], what: str) -> int:
    distinct = sorted(set(x for x in values if x))
    if len(distinct) > 1:
        raise UnsupportedError(f"{r.f.path}: {r.key(key)} differs between {what} ({distinct})")
    return distinct[0] if distinct else 0


def mamba2_keys(r, n_layer: int, n_head: int) -> dict:
    """ModelConfig fields of a Mamba-2 hybrid (module docstring) plus "_n_head_kv" and "_n_ff" for config();
    {} for the other architectures. r: the config._Reader."""
    if r.arch not in MAMBA2_ARCHS:
        return {}
    path = r.f.path
    granite = r.arch in ("granitehybrid", "falcon-h1")  # an FFN on every layer: no FFN-only layers
    if r.get("{arch}.expert_count", 0) and r.arch in ("nemotron_h", "mamba2"):
        raise UnsupportedError(f"{path}: {r.arch} files with experts (Nemotron-H MoE) are not supported")
    plain = r.arch == "mamba2"  # every layer a mixer
    falcon = r.arch == "falcon-h1"  # every layer attends and mixes: the layer kinds are not in the keys
    kv = ([0] * n_layer if plain else [r.positive("{arch}.attention.head_count_kv", n_head)] * n_layer if falcon
          else _layer_array(r, "{arch}.attention.head_count_kv", n_layer))
    ff = [0] * n_layer if plain or granite else _layer_array(r, "{arch}.feed_forward_length", n_layer)
    n_kv = _one(r, "{arch}.attention.head_count_kv", kv, "attention layers")
    n_ff = r.positive("{arch}.feed_forward_length") if granite else _one(r, "{arch}.feed_forward_length", ff,
                                                                          "FFN layers")
    if r.arch == "nemotron_h_moe" and not any(ff):
        raise ModelFileError(f"{path}: {r.key('{arch}.feed_forward_length')} marks no expert layer")
    if n_kv and n_head % n_kv:
        raise ModelFileError(f"{path}: head_count {n_head} is not a multiple of head_count_kv {n_kv}")
    kernel = r.get("{arch}.ssm.conv_kernel")
    if kernel < 2:
        raise ModelFileError(f"{path}: {r.key('{arch}.ssm.conv_kernel')} must be at least 2, got {kernel}")
    d_inner, d_state, n_ssm_head, n_group = (r.positive(f"{{arch}}.ssm.{k}") for k in
                                             ("inner_size", "state_size", "time_step_rank", "group_count"))
    if d_inner % n_ssm_head or n_ssm_head % n_group:
        raise ModelFileError(f"{path}: ssm.inner_size {d_inner} must be a multiple of ssm.time_step_rank "
                             f"{n_ssm_head} (heads), and the heads a multiple of ssm.group_count {n_group}")
    mamba = (True,) * n_layer if falcon else tuple(k == 0 and f == 0 for k, f in zip(kv, ff))
    return {"mamba_layers": mamba, "ffn_layers": tuple(k == 0 and f > 0 for k, f in zip(kv, ff)),
            "conv_kernel": kernel, "ssm_d_inner": d_inner, "ssm_d_state": d_state, "ssm_n_v_heads": n_ssm_head,
            "ssm_n_group": n_group, "_n_head_kv": n_kv or n_head, "_n_ff": n_ff or 1}


def nemotron_moe_keys(r) -> dict:
    """nemotron_h_moe's routing fields of ModelConfig (module docstring); r: the config._Reader."""
    path = r.f.path
    norm, scale = r.expert_weights()
    groups, used = r.get("{arch}.expert_group_count", 0), r.get("{arch}.expert_group_used_count", 0)
    latent = r.get("{arch}.moe_latent_size", 0)
    if latent < 0:
        raise ModelFileError(f"{path}: {r.key('{arch}.moe_latent_size')} must be >= 0, got {latent}")
    return {"expert_weights_norm": norm, "expert_gating": "sigmoid", "expert_weights_scale": scale or 1.0,
            "n_expert_groups": groups if groups > 1 else 0, "n_expert_group_used": used if groups > 1 else 0,
            "n_ff_shexp": r.positive("{arch}.expert_shared_feed_forward_length"), "moe_latent_size": latent}
