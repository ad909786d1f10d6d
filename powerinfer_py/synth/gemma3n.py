"""write_gemma3n_model: a tiny random Gemma 3n (GGUF arch "gemma3n") file that llama.cpp loads and runs.

llama.cpp fixes several Gemma 3n sizes in its code (models/gemma3n.py): 4 AltUp streams, per-layer embeddings
256 wide, K/V computed by the first 20 layers only, the Gaussian top-k on the first 10. So the file has
(defaults) 25 layers: sliding-window layers with a full-attention layer every 5th (4, 9, ... 24), layers
20..24 sharing the K/V of layers 18 (sliding) and 19 (full), top-k FFNs on layers 0..9 and dense ones after.
It writes the keys the converter writes for the real models (shared_kv_layers, activation_sparsity_scale,
altup.*, embedding_length_per_layer_input, final_logit_softcapping) with values that agree with llama.cpp's
fixed ones, so both engines read the same model. Small widths elsewhere (n_embd 64, FFN 128, LAuReL rank from
laurel_rank). Weights are random and scaled so that activations stay O(1).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from ..models.gemma3n import N_EMBD_PER_LAYER, SPARSITY_STD_MUL
from ..gguf import write_gguf
from .common import DTYPES, _FILE_TYPE, _encode, tokenizer_metadata

A = "gemma3n"
QK_NORM_GAIN = 0.3  # attention scale 1: keep scores O(1) (see synth/gemma4.py)


def write_gemma3n_model(path: str | os.PathLike, *, dtype: str = "f32", n_layer: int = 25, n_embd: int = 64,
                        n_head: int = 2, n_head_kv: int = 1, head_dim: int = 32, n_ff: int = 128,
                        n_vocab: int = 512, seed: int = 0, sliding_window: int = 4, n_sparse: int = 10,
                        n_kv: int = 20, laurel_rank: int = 64, per_layer: int = N_EMBD_PER_LAYER,
                        n_altup: int = 4, final_softcap: float = 30.0, swa_period: int = 5) -> Path:
    """Write the file and return its path. n_sparse: leading layers with the Gaussian top-k FFN; n_kv: leading
    layers with their own K/V (llama.cpp runs 20 and 10 whatever the file says: change them only for files
    that llama.cpp is not asked to run)."""
    swa = [il % swa_period != swa_period - 1 for il in range(n_layer)]
    meta = {
        "general.architecture": A, "general.name": f"synthetic-gemma3n-{dtype}",
        "general.file_type": _FILE_TYPE[dtype],
        f"{A}.context_length": 128, f"{A}.embedding_length": n_embd, f"{A}.block_count": n_layer,
        f"{A}.feed_forward_length": n_ff, f"{A}.attention.head_count": n_head,
        f"{A}.attention.head_count_kv": n_head_kv, f"{A}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{A}.attention.key_length": head_dim, f"{A}.attention.value_length": head_dim,
        f"{A}.rope.freq_base": 1_000_000.0, f"{A}.rope.freq_base_swa": 10_000.0,
        f"{A}.attention.sliding_window": sliding_window,
        f"{A}.attention.shared_kv_layers": n_layer - n_kv,
        f"{A}.activation_sparsity_scale": [SPARSITY_STD_MUL if il < n_sparse else -math.inf for il in range(n_layer)],
        f"{A}.altup.active_idx": 0, f"{A}.altup.num_inputs": n_altup,
        f"{A}.embedding_length_per_layer_input": per_layer,
        f"{A}.final_logit_softcapping": float(final_softcap),
    }
    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta.update(tok_meta)
    types = {**tok_types,
             f"{A}.activation_sparsity_scale": (GGUFValueType.ARRAY, GGUFValueType.FLOAT32)}

    rng = np.random.default_rng(seed)

    def linear(m, k, gain=1.0):
        return gain * rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d, gain=1.0):
        return gain * (1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32))

    E, P, L = n_embd, per_layer, n_layer
    w = [("token_embd.weight", 0.4 / np.sqrt(E) * rng.standard_normal((n_vocab, E), dtype=np.float32)),
         ("altup_proj.weight", np.stack([linear(E, E) for _ in range(n_altup - 1)])),
         ("altup_unembd_proj.weight", np.stack([linear(E, E) for _ in range(n_altup - 1)])),
         ("per_layer_token_embd.weight", 0.5 / np.sqrt(P) * rng.standard_normal((n_vocab, P * L), dtype=np.float32)),
         ("per_layer_model_proj.weight", np.sqrt(E) * linear(P * L, E)),
         ("per_layer_proj_norm.weight", norm(P))]
    for il in range(n_layer):
        p = f"blk.{il}."
        w += [(p + "attn_norm.weight", norm(E)), (p + "attn_q.weight", linear(n_head * head_dim, E)),
              (p + "attn_q_norm.weight", norm(head_dim, QK_NORM_GAIN))]
        # llama.cpp requires K/V tensors on every layer; the sharing layers' go unused
        w += [(p + "attn_k.weight", linear(n_head_kv * head_dim, E)),
              (p + "attn_v.weight", linear(n_head_kv * head_dim, E)),
              (p + "attn_k_norm.weight", norm(head_dim, QK_NORM_GAIN)),
              (p + "attn_output.weight", linear(E, n_head * head_dim)), (p + "post_attention_norm.weight", norm(E)),
              (p + "ffn_norm.weight", norm(E)), (p + "ffn_gate.weight", linear(n_ff, E)),
              (p + "ffn_up.weight", linear(n_ff, E)), (p + "ffn_down.weight", linear(E, n_ff)),
              (p + "post_ffw_norm.weight", norm(E)),
              (p + "inp_gate.weight", linear(P, E)), (p + "proj.weight", linear(E, P)),
              (p + "post_norm.weight", norm(E, 0.5)),
              (p + "altup_correct_coef.weight", 0.05 * rng.standard_normal((n_altup, n_altup), dtype=np.float32)),
              (p + "altup_correct_scale.weight", norm(E)),
              (p + "altup_predict_coef.weight", 0.05 * rng.standard_normal((n_altup * n_altup, n_altup),
                                                                          dtype=np.float32)),
              # the router reads rmsnorm(x) / n_embd: a large gain makes its tanh outputs O(1)
              (p + "altup_router.weight", linear(n_altup, E, float(E))),
              (p + "altup_router_norm.weight", norm(E)),
              (p + "laurel_l.weight", linear(laurel_rank, E)), (p + "laurel_r.weight", linear(E, laurel_rank)),
              (p + "laurel_post_norm.weight", norm(E))]
    w.append(("output_norm.weight", 4.0 * norm(E)))
    # matrices take dtype where their rows fit its blocks; the small AltUp coefficient matrices stay F32
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and x.shape[-1] % 32 == 0 else DTYPES["f32"])
               for name, x in w]
    return write_gguf(path, meta, tensors, types=types)
