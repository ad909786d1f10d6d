"""NVIDIA Nemotron-H / Nemotron Nano 2 (GGUF arch "nemotron_h"): a stack of Mamba-2 mixers with a few attention
layers and squared-ReLU FFNs, where every layer is exactly ONE of the three (config.mamba_layers, ffn_layers,
the rest attend; config_mamba2.py says how the file tells them apart):

  x = token_embd[ids]
  per layer:
    n = rmsnorm(x) * attn_norm                      (the only norm of a layer, whatever its kind)
    mixer layer:      x = x + mamba2(n)             (mamba2_mixer.py)
    attention layer:  q, k, v = Wq·n (+bq), Wk·n (+bk), Wv·n (+bv)        (no RoPE, no per-head norms)
                      x = x + Wo · attention(q, k, v) (+bo)               (scale: attention.scale or 1/sqrt(hd))
    FFN layer:        x = x + Wdown · relu(Wup·n (+b_up))^2 (+b_down)     (no gate)
  logits = output · (rmsnorm(x) * output_norm)      (output tied to token_embd when absent)

The FFN is ffn.py's "relu2" variant, a ReLU-family FFN: `--sparse exact` computes the down projection over the
neurons with relu(up·n) > 0 only, and gives `off`'s bits (tests/test_nemotron_h.py checks it).

nemotron_h_moe (Nemotron 3 Nano 30B-A3B): the same stack with every FFN layer a mixture of squared-ReLU experts
plus a shared expert (models/nemotron_moe.py); its trailing MTP block is not run (config.n_nextn).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..config_mamba2 import mamba2_keys, nemotron_moe_keys
from ..ffn import FFN, FFNWeights, SparseSettings, SparsityStats
from ..mamba2_cache import Mamba2KVCache
from ..tensor import Tensor
from .base import Expected, Model, get_tensor, head_expected, layer_tensors, norm_weight
from .mamba2_mixer import Mamba2Mixer, mamba2_dims, mamba2_expected, mamba2_tensors
from .nemotron_moe import NemotronMoE, nemotron_moe_expected
from .spec import ArchSpec

ATTENTION = {"wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
             "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias"}
ATTENTION_BIASES = ("bq", "bk", "bv", "bo")


def expected_tensors(c: ModelConfig) -> Expected:
    E, hd = c.n_embd, c.head_dim
    q_dim, kv_dim = c.n_head * hd, c.n_head_kv * hd
    e = head_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((E,), True)
        if c.mamba_layers[il]:
            e.update(mamba2_expected(c, p))
        elif c.ffn_layers[il] and c.n_expert:  # nemotron_h_moe: experts (nemotron_moe.py)
            e.update(nemotron_moe_expected(c, p))
        elif c.ffn_layers[il]:
            e.update({p + "ffn_up.weight": ((c.n_ff, E), True), p + "ffn_down.weight": ((E, c.n_ff), True),
                      p + "ffn_up.bias": ((c.n_ff,), False), p + "ffn_down.bias": ((E,), False)})
        else:
            e.update({p + "attn_q.weight": ((q_dim, E), True), p + "attn_k.weight": ((kv_dim, E), True),
                      p + "attn_v.weight": ((kv_dim, E), True), p + "attn_output.weight": ((E, q_dim), True),
                      p + "attn_q.bias": ((q_dim,), False), p + "attn_k.bias": ((kv_dim,), False),
                      p + "attn_v.bias": ((kv_dim,), False), p + "attn_output.bias": ((E,), False)})
    return e


class NemotronHModel(Mamba2Mixer, Model):
    """The nemotron_h stack (module docstring). `layers[il]` holds attn_norm plus the layer's own tensors (the
    mixer's, or the attention projections); `ffns[il]` is the FFN of an FFN layer, None elsewhere."""

    LAYER_TENSORS = {"attn_norm": "attn_norm.weight"}

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        super().__init__(config, tensors, kernels, sparse)
        for il, L in enumerate(self.layers):
            if config.mamba_layers[il]:
                vars(L).update(vars(mamba2_tensors(config, tensors, il)))
            elif not config.ffn_layers[il]:
                vars(L).update(vars(layer_tensors(tensors, il, ATTENTION, optional=ATTENTION_BIASES)))

    def build_ffns(self, tensors: Mapping[str, Tensor], biases: bool = False) -> list[FFN | None]:
        """The squared-ReLU FFN of each FFN layer (None on the others), with its optional biases."""
        c = self.config
        self.sparsity = SparsityStats(c.n_layer, c.n_ff, self.sparse.mode, self.sparse.threshold)
        ffns: list[FFN | None] = []
        for il in range(c.n_layer):
            if not c.ffn_layers[il]:
                ffns.append(None)
                continue
            if c.n_expert:  # nemotron_h_moe
                ffns.append(NemotronMoE(self.kernels, c, tensors, il, self.sparse))
                continue
            p = f"blk.{il}."
            w = FFNWeights(up=get_tensor(tensors, p + "ffn_up.weight"), down=get_tensor(tensors, p + "ffn_down.weight"),
                           b_up=norm_weight(get_tensor(tensors, p + "ffn_up.bias", required=False)),
                           b_down=norm_weight(get_tensor(tensors, p + "ffn_down.bias", required=False)))
            ffns.append(FFN(self.kernels, w, "relu2", self.sparse, layer=il, stats=self.sparsity))
        return ffns

    def new_cache(self, n_ctx: int | None = None) -> Mamba2KVCache:
        c = self.config
        H, P, _, N, conv_dim = mamba2_dims(c)
        attn = tuple(not (m or f) for m, f in zip(c.mamba_layers, c.ffn_layers))
        return Mamba2KVCache(attn, c.mamba_layers, c.n_head_kv, n_ctx or c.n_ctx_train, c.head_dim, conv_dim,
                             c.conv_kernel, H, P, N)

    def has_attention(self, il: int) -> bool:
        return not (self.config.mamba_layers[il] or self.config.ffn_layers[il])

    def attn_plans(self) -> None:
        """No one-call attention step: the attention layers (no RoPE, no FFN after them) run the Python path."""
        return None

    def forward(self, tokens, cache: Mamba2KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits of tokens (the last, or all rows with all_logits), continuing the cache's K/V and mixer states."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        x = self._embed(ids, pos)  # [N, n_embd]
        cache.begin(p0)
        for il, L in enumerate(self.layers):
            h = k.rmsnorm(x, L.attn_norm, c.norm_eps)
            if c.mamba_layers[il]:
                x += self._mamba2(il, L, h, cache, p0)
            elif c.ffn_layers[il]:
                x += self.ffns[il](h, x)
            else:
                x += self._attention(il, L, h, cache, p0)
        cache.end(p0 + ids.shape[0])
        return self._head(x, all_logits)

    def _attention(self, il: int, L, h: np.ndarray, cache: Mamba2KVCache, p0: int) -> np.ndarray:
        c, k = self.config, self.kernels
        n, hd = h.shape[0], c.head_dim
        q, kk, v = k.matmul(L.wq, h), k.matmul(L.wk, h), k.matmul(L.wv, h)
        for t, b in ((q, L.bq), (kk, L.bk), (v, L.bv)):
            if b is not None:
                t += b
        q = q.reshape(n, c.n_head, hd)
        self._store_kv(cache, il, p0, kk.reshape(n, c.n_head_kv, hd), v.reshape(n, c.n_head_kv, hd))
        a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, H, hd]
        out = k.matmul(L.wo, a.reshape(n, c.n_head * hd))
        if L.bo is not None:
            out += L.bo
        return out


def mamba2_layout(r, d: dict) -> None:
    """The layer kinds and mixer sizes of a Mamba-2 hybrid (nemotron_h, nemotron_h_moe, mamba2, granitehybrid,
    falcon-h1) into the draft; mamba2 files have no attention (head_count 0): one placeholder head."""
    d["n_head"] = (r.get("{arch}.attention.head_count", 0) or 1) if r.arch == "mamba2" else r.positive(
        "{arch}.attention.head_count")
    out = mamba2_keys(r, d["n_layer"], d["n_head"])
    d["n_head_kv"], d["n_ff"] = out.pop("_n_head_kv"), out.pop("_n_ff")
    d.update(out)


def _layout(r, d: dict) -> None:
    """nemotron_h's attention layers use no RoPE and score with {arch}.attention.scale (absent or 0:
    1/sqrt(head_dim))."""
    mamba2_layout(r, d)
    d["n_rot"] = 0
    scale = r.get("{arch}.attention.scale", 0.0, kind=float)
    if scale:
        d["attn_scale"] = scale


def read_args(r, d: dict) -> None:
    if r.arch == "nemotron_h_moe":  # sigmoid routing with its own keys, experts on the FFN layers
        d.update(nemotron_moe_keys(r), moe_layers=d["ffn_layers"])


SPEC = ArchSpec("nemotron_h", model=NemotronHModel, expected=expected_tensors, ffn_variant="relu2", layout=_layout)
VARIANTS = (
    replace(SPEC, name="nemotron_h_moe", ffn_variant="", nextn=True, moe=True, moe_norm=False),  # expert FFN layers
    replace(SPEC, name="mamba2", ffn_variant=""),  # every layer a mixer
)
