"""Qwen3-Next (GGUF arch "qwen3next"): qwen35moe's layers with the delta nets' projections fused per key head.

The math is models/qwen35.py's (gated delta-net layers, every full_attention_interval-th layer gated attention,
experts with a sigmoid-gated shared expert in every layer); what llama.cpp's qwen3next graph does differently:

  ssm_in   one projection [Hk * (2 d + 2 r d), E] (r = Hv / Hk) instead of attn_qkv and attn_gate. Its rows come
           in Hk groups, one per key head g:  [q_g (d) | k_g (d) | v of value heads g r .. g r + r - 1 (r d) |
           z of the same heads (r d)]. The conv runs over q of all heads | k of all heads | v of all heads, as
           in qwen35, and z gates the normed output. (llama.cpp also reads files with attn_qkv and attn_gate in
           qwen35's layout instead of ssm_in, its newer conversion: so do we; ssm_ba stays fused there.)
  ssm_ba   one projection [2 Hv, E] instead of ssm_beta and ssm_alpha, grouped the same way: per key head g
           [beta of its r value heads | alpha of them].
  heads    value head h reads key head h // r (llama.cpp repeats each key head r times in place; qwen35 tiles
           them, h mod Hk).
  RoPE     plain NeoX over rope.dimension_count dims (qwen35's text M-RoPE comes to the same; no sections here).
  layers   attention.recurrent_layers (a flag per layer), when the file has it, says which layers are delta nets
           instead of full_attention_interval (models/qwen35.py: qwen35_keys).
  FFN      always experts (softmax, chosen weights renormalized) plus the shared expert scaled by
           sigmoid(ffn_gate_inp_shexp . m): qwen35moe's.

Everything else is qwen35's: the norms and their eps, the gated attention (q rows per head [query | gate], q/k
RMS norms, sigmoid output gate), the conv, l2norm and 1/sqrt(d) scaling, the delta rule and its chunked prefill,
the gated RMS norm of the output. The fused projections are split once at load (rows picked into qwen35's
attn_qkv / attn_gate / ssm_beta / ssm_alpha order; rows are whole quantization blocks, so quantized files split
too), and _key_heads is the one hook overridden; the forward is Qwen35Model's.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  qwen3next  (Qwen3-Next) qwen35moe's keys, layer kinds and MTP blocks, plain NeoX RoPE over rope.dimension_count
          dims (no sections); always experts with a gated shared expert
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..gguf.types import Tensor
from .base import Expected, get_tensor
from .qwen35 import Qwen35Model, delta_dims
from .qwen35 import expected_tensors as qwen35_expected
from .qwen35 import layout
from .spec import ArchSpec

FUSED = {"ssm_in.weight": ("attn_qkv.weight", "attn_gate.weight"),
         "ssm_ba.weight": ("ssm_beta.weight", "ssm_alpha.weight")}


def expected_tensors(c: ModelConfig) -> Expected:
    """qwen35moe's tensors with ssm_ba in place of ssm_beta and ssm_alpha, and ssm_in or else attn_qkv and
    attn_gate (each optional here; split_fused names what is missing)."""
    d, hk, hv, _ = delta_dims(c)
    e = qwen35_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        if c.delta_layers[il]:
            for part in FUSED["ssm_ba.weight"]:
                del e[p + part]
            e[p + "attn_qkv.weight"] = (e[p + "attn_qkv.weight"][0], False)
            e[p + "attn_gate.weight"] = (e[p + "attn_gate.weight"][0], False)
            e[p + "ssm_in.weight"] = ((2 * hk * d + 2 * hv * d, c.n_embd), False)
            e[p + "ssm_ba.weight"] = ((2 * hv, c.n_embd), True)
    return e


def qkvz_rows(d: int, hk: int, hv: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices into ssm_in of qwen35's attn_qkv (q | k | v over all heads) and attn_gate (z)."""
    r = hv // hk
    group = np.arange(hk)[:, None] * (2 * d + 2 * r * d)  # the first row of each key head's group
    q, k = group + np.arange(d), group + d + np.arange(d)
    v = group + 2 * d + np.arange(r * d)
    z = group + 2 * d + r * d + np.arange(r * d)
    return np.concatenate([q.ravel(), k.ravel(), v.ravel()]), z.ravel()


def ba_rows(hk: int, hv: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices into ssm_ba of beta and of alpha, value head order."""
    r = hv // hk
    group = np.arange(hk)[:, None] * 2 * r
    return (group + np.arange(r)).ravel(), (group + r + np.arange(r)).ravel()


def pick_rows(t: Tensor, rows: np.ndarray, name: str) -> Tensor:
    """A new 2-D Tensor holding t's rows `rows` in that order (a copy; any ggml type, rows being whole blocks)."""
    return Tensor(name, t.type, (len(rows), t.shape[1]), np.ascontiguousarray(t.data[rows]))


def split_fused(c: ModelConfig, tensors: Mapping[str, Tensor], qkvz=qkvz_rows, ba=ba_rows) -> dict[str, Tensor]:
    """tensors plus, per delta-net layer, qwen35's four projections picked out of ssm_in (when the file has it)
    and ssm_ba by the row indices qkvz(d, Hk, Hv) and ba(Hk, Hv)."""
    d, hk, hv, _ = delta_dims(c)
    out = dict(tensors)
    for il in range(c.n_layer):
        if not c.delta_layers[il]:
            continue
        p = f"blk.{il}."
        if p + "ssm_in.weight" not in tensors and not all(p + x in tensors for x in FUSED["ssm_in.weight"]):
            raise ModelFileError(f"missing required tensor {p + 'ssm_in.weight'!r} (or {p}attn_qkv.weight and "
                                 f"{p}attn_gate.weight)")
        for fused, rows in (("ssm_in.weight", qkvz(d, hk, hv)), ("ssm_ba.weight", ba(hk, hv))):
            t = get_tensor(tensors, p + fused, required=fused == "ssm_ba.weight")
            if t is None:
                continue
            n = sum(len(x) for x in rows)
            if len(t.shape) != 2 or t.shape[0] != n or t.shape[1] != c.n_embd:
                raise ModelFileError(f"tensor {t.name!r} has shape {t.shape}: expected ({n}, {c.n_embd})")
            for part, idx in zip(FUSED[fused], rows):
                out[p + part] = pick_rows(t, idx, p + part)
    return out


class Qwen3NextModel(Qwen35Model):
    """Qwen35Model on the split projections, with value head h reading key head h // (Hv / Hk)."""

    qkvz_rows = staticmethod(qkvz_rows)  # how ssm_in and ssm_ba are split (tests swap these)
    ba_rows = staticmethod(ba_rows)

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        super().__init__(config, split_fused(config, tensors, self.qkvz_rows, self.ba_rows), kernels, sparse)

    def _key_heads(self, x: np.ndarray) -> np.ndarray:
        reps = self.config.ssm_n_v_heads // self.config.ssm_n_k_heads
        return np.repeat(x, reps, axis=1) if reps > 1 else x


SPEC = ArchSpec("qwen3next", model=Qwen3NextModel, expected=expected_tensors, rope_neox=True, nextn=True, moe=True,
                moe_norm=True, shared_expert="required", layout=layout)
