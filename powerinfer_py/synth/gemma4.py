"""write_gemma4_model: a tiny random Gemma 4 (GGUF arch "gemma4") file that llama.cpp loads and runs.

It exercises every per-layer feature of the format on a handful of layers (defaults, 6 layers):
  - sliding-window and full-attention layers of different head dims (key_length 32 on full layers,
    key_length_swa 16 on sliding ones), each with its own rotated dims (rope.dimension_count(_swa)), RoPE base
    (rope.freq_base on full layers, rope.freq_base_swa on sliding ones) and KV head count (head_count_kv is a
    per-layer array); the pattern is attention.sliding_window_pattern, one bool per layer
  - KV sharing: the last attention.shared_kv_layers layers have no attn_k / attn_v of their own and read the
    cache of the last sliding / full layer before them (so those two must be of the right kind)
  - a full layer without attn_v (its values are its keys, as Gemma 4's k_eq_v layers)
  - "proportional" RoPE: rope_freqs.weight divides the full layers' frequencies (large factors stop a pair)
  - per-layer FFN widths (feed_forward_length is an array), per-layer output scales (layer_output_scale)
  - per-layer embeddings (embedding_length_per_layer_input > 0, the small "E" models) or none (0)
  - a final logit soft-cap small enough to change the result
  - with n_expert > 0, the 26B-A4B model's layers: beside the dense GeGLU FFN, n_expert GeGLU experts
    (expert_feed_forward_length wide, n_expert_used per token) routed from the layer's input, with the router's
    input scale (ffn_gate_inp.scale), the branch norms (pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2), the
    experts' gate and up in one ffn_gate_up_exps tensor (merged=True, as converted files have them) or two, and
    optionally per-expert output scales (ffn_down_exps.scale)
Weights are random and scaled as synth.py's so that activations stay O(1).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from ..gguf import write_gguf
from .common import DTYPES, _FILE_TYPE, _encode, tokenizer_metadata

A = "gemma4"
SWA_PATTERN = (True, False, True, False, True, False)  # layer 2 (sliding) and 3 (full) feed the shared layers
# "proportional" RoPE on the full layers: the first pairs turn at their normal rate, the rest barely or not at all
# attention scale is 1 (the q/k norms set the score size): gains of 0.5 keep the scores O(1), as in the real
# model, rather than O(sqrt(head_dim)), where llama.cpp's f16 rounding of q, K and V would dominate comparisons
QK_NORM_GAIN = 0.5
ROPE_FREQS = np.array([1.0] * 6 + [4.0, 16.0] + [1e30] * 8, dtype=np.float32)


def write_gemma4_model(path: str | os.PathLike, *, dtype: str = "f32", n_embd: int = 64, n_head: int = 4,
                       n_vocab: int = 512, seed: int = 0, per_layer: int = 8, swa_pattern=SWA_PATTERN,
                       n_shared_kv: int = 2, head_dim: int = 32, head_dim_swa: int = 16,
                       n_head_kv: tuple[int, int] = (1, 2), n_ff: tuple[int, ...] | None = None,
                       no_v_layers: tuple[int, ...] = (1,), sliding_window: int = 4, final_softcap: float | None = 4.0,
                       out_scale: bool = True, rope_freqs: np.ndarray | None = ROPE_FREQS, n_expert: int = 0,
                       n_expert_used: int = 2, n_ff_exp: int = 32, merged: bool = True,
                       expert_scales: bool = False, router_gain: float = 2.0) -> Path:
    """Write the file and return its path. per_layer: the per-layer embedding width (0: none); n_head_kv:
    (full, sliding) KV heads; n_ff: per-layer FFN widths (default 96, twice that on the shared-KV layers);
    no_v_layers: layers written without attn_v; final_softcap None leaves the key out (llama.cpp then caps at
    its default 30); rope_freqs: the full layers' factors (head_dim / 2 values; None: no tensor)."""
    n_layer = len(swa_pattern)
    n_ff = tuple(n_ff) if n_ff is not None else tuple(192 if il >= n_layer - n_shared_kv else 96
                                                      for il in range(n_layer))
    kv_heads = [n_head_kv[1] if s else n_head_kv[0] for s in swa_pattern]
    meta = {
        "general.architecture": A, "general.name": f"synthetic-gemma4-{dtype}",
        "general.file_type": _FILE_TYPE[dtype],
        f"{A}.context_length": 128, f"{A}.embedding_length": n_embd, f"{A}.block_count": n_layer,
        f"{A}.feed_forward_length": list(n_ff), f"{A}.attention.head_count": n_head,
        f"{A}.attention.head_count_kv": kv_heads,
        f"{A}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{A}.attention.key_length": head_dim, f"{A}.attention.value_length": head_dim,
        f"{A}.attention.key_length_swa": head_dim_swa, f"{A}.attention.value_length_swa": head_dim_swa,
        f"{A}.rope.dimension_count": head_dim, f"{A}.rope.dimension_count_swa": head_dim_swa,
        f"{A}.rope.freq_base": 1_000_000.0, f"{A}.rope.freq_base_swa": 10_000.0,
        f"{A}.attention.sliding_window": sliding_window,
        f"{A}.attention.sliding_window_pattern": [bool(s) for s in swa_pattern],
        f"{A}.attention.shared_kv_layers": n_shared_kv,
        f"{A}.embedding_length_per_layer_input": per_layer,
    }
    if final_softcap is not None:
        meta[f"{A}.final_logit_softcapping"] = float(final_softcap)
    if n_expert:
        meta.update({f"{A}.expert_count": n_expert, f"{A}.expert_used_count": n_expert_used,
                     f"{A}.expert_feed_forward_length": n_ff_exp})
    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta.update(tok_meta)
    types = {**tok_types,
             f"{A}.feed_forward_length": (GGUFValueType.ARRAY, GGUFValueType.UINT32),
             f"{A}.attention.head_count_kv": (GGUFValueType.ARRAY, GGUFValueType.UINT32)}

    rng = np.random.default_rng(seed)

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d):
        return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

    E, P = n_embd, per_layer
    w = [("token_embd.weight", 0.4 / np.sqrt(E) * rng.standard_normal((n_vocab, E), dtype=np.float32))]
    if rope_freqs is not None:
        w.append(("rope_freqs.weight", np.asarray(rope_freqs, np.float32)))
    if P:
        w += [("per_layer_token_embd.weight", 0.5 / np.sqrt(P) * rng.standard_normal((n_vocab, P * n_layer),
                                                                                     dtype=np.float32)),
              ("per_layer_model_proj.weight", np.sqrt(E) * linear(P * n_layer, E)),
              ("per_layer_proj_norm.weight", norm(P))]
    n_kv_start = n_layer - n_shared_kv
    for il, swa in enumerate(swa_pattern):
        p, hd, F = f"blk.{il}.", head_dim_swa if swa else head_dim, n_ff[il]
        w += [(p + "attn_norm.weight", norm(E)), (p + "attn_q.weight", linear(n_head * hd, E)),
              (p + "attn_q_norm.weight", QK_NORM_GAIN * norm(hd))]
        if il < n_kv_start:
            w += [(p + "attn_k.weight", linear(kv_heads[il] * hd, E)), (p + "attn_k_norm.weight", QK_NORM_GAIN * norm(hd))]
            if il not in no_v_layers:
                w.append((p + "attn_v.weight", linear(kv_heads[il] * hd, E)))
        w += [(p + "attn_output.weight", linear(E, n_head * hd)), (p + "post_attention_norm.weight", norm(E)),
              (p + "ffn_norm.weight", norm(E)), (p + "ffn_gate.weight", linear(F, E)),
              (p + "ffn_up.weight", linear(F, E)), (p + "ffn_down.weight", linear(E, F)),
              (p + "post_ffw_norm.weight", norm(E))]
        if n_expert:
            w += _expert_tensors(rng, p, E, n_expert, n_ff_exp, merged, expert_scales, router_gain, norm)
        if P:
            w += [(p + "inp_gate.weight", linear(P, E)), (p + "proj.weight", linear(E, P)),
                  (p + "post_norm.weight", norm(E))]
        if out_scale:
            w.append((p + "layer_output_scale.weight", np.array([0.6 + 0.15 * il], np.float32)))
    w.append(("output_norm.weight", 6.0 * norm(E)))
    # matrices take dtype where their rows fit its blocks (per_layer_token_embd, proj: P * n_layer, P wide stay F32),
    # but the router (F32, as in other MoE files: a quantized router moves near-tied choices)
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and x.shape[-1] % 32 == 0 and "gate_inp" not in name
                       else DTYPES["f32"])
               for name, x in w]
    return write_gguf(path, meta, tensors, types=types)


def _expert_tensors(rng, p: str, E: int, n_expert: int, F: int, merged: bool, scales: bool, gain: float,
                    norm) -> list:
    """One layer's expert tensors (numpy shapes; GGUF's are reversed): the router (n_expert, E) and its input
    scale, the branch norms, gate and up (n_expert, F, E) each or merged (n_expert, 2F, E), gate rows first,
    down (n_expert, E, F) and, if scales, per-expert output scales."""
    def experts(m, k):
        return rng.standard_normal((n_expert, m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    gate, up = experts(F, E), experts(F, E)
    # the router reads rmsnorm(x) / sqrt(E) * scale, a vector of norm ~1: rows of norm ~gain give logits ~gain
    w = [(p + "ffn_gate_inp.weight", gain * rng.standard_normal((n_expert, E), dtype=np.float32)),
         (p + "ffn_gate_inp.scale", norm(E)),
         (p + "pre_ffw_norm_2.weight", norm(E)), (p + "post_ffw_norm_1.weight", norm(E)),
         (p + "post_ffw_norm_2.weight", norm(E))]
    if merged:
        w.append((p + "ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1)))
    else:
        w += [(p + "ffn_gate_exps.weight", gate), (p + "ffn_up_exps.weight", up)]
    w.append((p + "ffn_down_exps.weight", experts(E, F)))
    if scales:
        w.append((p + "ffn_down_exps.scale", (0.5 + rng.random(n_expert)).astype(np.float32)))
    return w
