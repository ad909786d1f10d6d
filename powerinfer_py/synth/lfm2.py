"""The lfm2 parts of synth.write_synthetic_model: options, metadata and one layer's tensors in llama.cpp's names
(models/lfm2.py has the math).

Layers il % 3 == 2 attend (as the first attention layers of LFM2-350M: 2, 5, 8), the others are gated short
convolutions; {arch}.attention.head_count_kv is then the per-layer array llama.cpp reads (0 on conv layers).
The conv taps are ~N(0, 1/K), so b * u and the convolution stay O(1) like every other activation. lfm2moe: the
first dense_lead layers (default 1) have a dense FFN, the others experts with a selection bias
(synth.generic._Spec.experts).
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFValueType

LFM2_KERNEL = 3  # shortconv.l_cache of the real files


def lfm2_options(arch: str, n_layer: int, o: dict) -> dict:
    """lfm2's own overrides (popped from o): attn_layers (indices of the attention layers, default il % 3 == 2)
    and conv_kernel (shortconv.l_cache, default 3); lfm2moe also dense_lead (default 1) and gating ("sigmoid",
    as LFM2-8B-A1B, or "softmax")."""
    if arch not in ("lfm2", "lfm2moe"):
        return {}
    moe = {"dense_lead": o.pop("dense_lead", 1), "gating": o.pop("gating", "sigmoid"),
           "probs_bias": True} if arch == "lfm2moe" else {}
    attn = tuple(o.pop("attn_layers", [il for il in range(n_layer) if il % 3 == 2]))
    if any(not 0 <= il < n_layer for il in attn):
        raise ValueError(f"attn_layers {attn} must be layer indices below n_layer {n_layer}")
    return {"attn_layers": attn, "kernel": int(o.pop("conv_kernel", LFM2_KERNEL)), **moe}


def lfm2_metadata(arch: str, n_layer: int, n_head_kv: int, options: dict) -> tuple[dict, dict]:
    """(keys, value types): the per-layer KV head counts (int32 array) and the conv kernel length."""
    key = f"{arch}.attention.head_count_kv"
    kv = [n_head_kv if il in options["attn_layers"] else 0 for il in range(n_layer)]
    meta = {key: kv, f"{arch}.shortconv.l_cache": options["kernel"]}
    if "dense_lead" in options:
        meta[f"{arch}.leading_dense_block_count"] = options["dense_lead"]
        meta[f"{arch}.expert_gating_func"] = {"softmax": 1, "sigmoid": 2}[options["gating"]]
    return meta, {key: (GGUFValueType.ARRAY, GGUFValueType.INT32)}


def lfm2_layer(p: str, il: int, E: int, F: int, q_dim: int, kv_dim: int, hd: int, options: dict, linear,
               norm, experts=None) -> list[tuple[str, np.ndarray]]:
    """One lfm2 layer: operator norm, then the convolution or the attention tensors, then the SwiGLU FFN (or,
    lfm2moe past dense_lead, experts(): the router, expert stacks and selection bias)."""
    out = [(p + "attn_norm.weight", norm(E))]
    if il in options["attn_layers"]:
        out += [(p + "attn_q.weight", linear(q_dim, E)), (p + "attn_k.weight", linear(kv_dim, E)),
                (p + "attn_v.weight", linear(kv_dim, E)), (p + "attn_q_norm.weight", norm(hd)),
                (p + "attn_k_norm.weight", norm(hd)), (p + "attn_output.weight", linear(E, q_dim))]
    else:
        K = options["kernel"]
        out += [(p + "shortconv.conv.weight", linear(E, K)), (p + "shortconv.in_proj.weight", linear(3 * E, E)),
                (p + "shortconv.out_proj.weight", linear(E, E))]
    out.append((p + "ffn_norm.weight", norm(E)))
    if "dense_lead" in options and il >= options["dense_lead"]:
        return out + experts()
    return out + [(p + "ffn_gate.weight", linear(F, E)), (p + "ffn_up.weight", linear(F, E)),
                  (p + "ffn_down.weight", linear(E, F))]
