"""write_minicpm_model: tiny random MiniCPM ("minicpm", "minicpm3") and OLMoE ("olmoe") files that llama.cpp loads.

The tensors and keys are the ones llama.cpp's loaders for these archs read (models/minicpm.py, models/olmoe.py
have the math); the vocabulary is synth.synthetic_vocab's. Matrices are ~ N(0, 1/K) for K inputs so that
activations stay O(1); MiniCPM's embeddings are drawn 1/embedding_scale as wide (the model multiplies them back
to std 1) and the final norm's gain is set so the logits come out with a spread of a few units whatever the
logit scale. 1-D tensors and the router stay F32, as in llama.cpp's files.

Options (keyword arguments):
  minicpm   scales: {"embedding_scale", "residual_scale", "logit_scale"} -> value (a dict or its pairs), each written as {arch}.<key>
            (None or absent: the key is left out, so the loader's MiniCPM defaults apply; default: no keys);
            tied (default True, as MiniCPM 1B/2B); n_expert / n_expert_used (MiniCPM-MoE: expert stacks
            feed_forward_length wide, default 0 = dense)
  minicpm3  q_lora (32), kv_lora (32), nope (16), n_rot (8): the MLA sizes; value_length (None: key left out,
            the value width is then n_embd / n_head as in the converter's files); tied (default False)
  both      rope_factors: (short, long) LongRoPE factors, n_rot/2 each (minicpm: written with rope.scaling.type
            "longrope"), orig_ctx (rope.scaling.original_context_length; None: left out), attn_factor
            (rope.scaling.attn_factor; None: left out)
  olmoe     n_expert (4), n_expert_used (2); n_head_kv must equal n_head (llama.cpp's k norm is n_embd wide)
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..gguf import write_gguf
from ..gguf.types import GGMLType
from .common import _FILE_TYPE, DTYPES, _encode, tokenizer_metadata

ARCHS = ("minicpm", "minicpm3", "olmoe")


def _rope_meta(a: str, o: dict, n_rot: int) -> tuple[dict, list]:
    """LongRoPE keys and factor tensors from the options (popped)."""
    meta, tensors = {}, []
    factors = o.pop("rope_factors", None)
    if factors is not None:
        short, long = (np.asarray(f, dtype=np.float32).reshape(-1) for f in factors)
        if short.shape != (n_rot // 2,) or long.shape != (n_rot // 2,):
            raise ValueError(f"rope_factors: (short, long), {n_rot // 2} factors each (n_rot / 2)")
        tensors = [("rope_factors_long.weight", long), ("rope_factors_short.weight", short)]
        if a == "minicpm":
            meta[f"{a}.rope.scaling.type"] = "longrope"
    for key, opt in (("original_context_length", "orig_ctx"), ("attn_factor", "attn_factor")):
        value = o.pop(opt, None)
        if value is not None:
            meta[f"{a}.rope.scaling.{key}"] = value if key != "attn_factor" else float(value)
    return meta, tensors


def write_minicpm_model(path: str | os.PathLike, arch: str, *, dtype: str = "f32", n_layer: int = 2,
                        n_embd: int = 64, n_ff: int = 128, n_head: int = 4, n_head_kv: int = 2, n_vocab: int = 512,
                        seed: int = 0, n_ctx_train: int = 512, **options) -> Path:
    """Write the model (module docstring) to path and return it."""
    if arch not in ARCHS or dtype not in DTYPES:
        raise ValueError(f"write_minicpm_model: arch one of {ARCHS}, dtype one of {tuple(DTYPES)}")
    o, a, E, F = dict(options), arch, n_embd, n_ff
    rng = np.random.default_rng(seed)

    def linear(m, k):
        return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

    def norm(d):
        return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

    meta = {f"{a}.context_length": n_ctx_train, f"{a}.embedding_length": E, f"{a}.block_count": n_layer,
            f"{a}.feed_forward_length": F, f"{a}.attention.head_count": n_head,
            f"{a}.attention.head_count_kv": n_head_kv, f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
            f"{a}.rope.freq_base": 10000.0}
    hd = E // n_head
    n_expert = o.pop("n_expert", 4 if a == "olmoe" else 0)
    n_used = o.pop("n_expert_used", 2)
    if n_expert:
        meta[f"{a}.expert_count"], meta[f"{a}.expert_used_count"] = n_expert, n_used
    embd_scale, logit_scale, tied = 1.0, 1.0, o.pop("tied", a == "minicpm")
    if a == "minicpm":
        scales = {k: v for k, v in dict(o.pop("scales", None) or {}).items() if v is not None}
        meta.update({f"{a}.{k}": float(v) for k, v in scales.items()})
        embd_scale = scales.get("embedding_scale", 12.0)
        logit_scale = scales.get("logit_scale", 256.0 / E)
        n_rot = hd
        meta[f"{a}.rope.dimension_count"] = n_rot
    elif a == "minicpm3":
        ql, lat, nope, n_rot = o.pop("q_lora", 32), o.pop("kv_lora", 32), o.pop("nope", 16), o.pop("n_rot", 8)
        vd = o.pop("value_length", None)
        dv = vd or hd
        meta.update({f"{a}.attention.q_lora_rank": ql, f"{a}.attention.kv_lora_rank": lat,
                     f"{a}.attention.key_length": nope + n_rot, f"{a}.rope.dimension_count": n_rot,
                     f"{a}.attention.head_count_kv": n_head})
        if vd is not None:
            meta[f"{a}.attention.value_length"] = vd
        embd_scale, logit_scale = 12.0, E / 256.0
    else:
        if n_head_kv != n_head:
            raise ValueError("olmoe: llama.cpp needs n_head_kv == n_head (its k norm is n_embd wide)")
        n_rot = hd
        meta[f"{a}.rope.dimension_count"] = n_rot
    rope_meta, rope_tensors = _rope_meta(a, o, n_rot)
    meta.update(rope_meta)
    if o:
        raise TypeError(f"unknown {arch} option(s): {', '.join(sorted(o))}")

    weights = [("token_embd.weight", (0.1 if tied else 1.0) / embd_scale
                * rng.standard_normal((n_vocab, E), dtype=np.float32))] + rope_tensors
    for il in range(n_layer):
        p = f"blk.{il}."
        weights.append((p + "attn_norm.weight", norm(E)))
        if a == "minicpm3":
            weights += [(p + "attn_q_a.weight", linear(ql, E)), (p + "attn_q_a_norm.weight", norm(ql)),
                        (p + "attn_q_b.weight", linear(n_head * (nope + n_rot), ql)),
                        (p + "attn_kv_a_mqa.weight", linear(lat + n_rot, E)), (p + "attn_kv_a_norm.weight", norm(lat)),
                        (p + "attn_kv_b.weight", linear(n_head * (nope + dv), lat)),
                        (p + "attn_output.weight", linear(E, n_head * dv))]
        else:
            weights += [(p + "attn_q.weight", linear(n_head * hd, E)), (p + "attn_k.weight", linear(n_head_kv * hd, E)),
                        (p + "attn_v.weight", linear(n_head_kv * hd, E)), (p + "attn_output.weight", linear(E, n_head * hd))]
        if a == "olmoe":
            weights += [(p + "attn_q_norm.weight", norm(n_head * hd)), (p + "attn_k_norm.weight", norm(n_head_kv * hd))]
        weights.append((p + "ffn_norm.weight", norm(E)))
        if n_expert:
            weights += [(p + "ffn_gate_inp.weight", 2.0 * linear(n_expert, E)),
                        (p + "ffn_gate_exps.weight", np.stack([linear(F, E) for _ in range(n_expert)])),
                        (p + "ffn_up_exps.weight", np.stack([linear(F, E) for _ in range(n_expert)])),
                        (p + "ffn_down_exps.weight", np.stack([linear(E, F) for _ in range(n_expert)]))]
        else:
            weights += [(p + "ffn_gate.weight", linear(F, E)), (p + "ffn_up.weight", linear(F, E)),
                        (p + "ffn_down.weight", linear(E, F))]
    # logits ~ gain * (head row . normed state) / logit_scale: a spread of ~2 either way
    gain = (2.0 / np.sqrt(E) * 10.0 * embd_scale if tied else 1.0) * logit_scale
    weights.append(("output_norm.weight", np.float32(gain) * norm(E)))
    if not tied:
        weights.append(("output.weight", 2.0 * linear(n_vocab, E)))

    tok_meta, tok_types = tokenizer_metadata(n_vocab)
    meta = {"general.architecture": a, "general.name": f"synthetic-{a}-{dtype}", "general.file_type": _FILE_TYPE[dtype],
            **meta, **tok_meta}
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and "gate_inp" not in name else GGMLType.F32)
               for name, x in weights]
    return write_gguf(path, meta, tensors, types=tok_types)
