"""NVIDIA Nemotron-H / Nemotron Nano 2 (GGUF arch "nemotron_h"): a stack of Mamba-2 mixers with a few attention
layers and squared-ReLU FFNs, where every layer is exactly ONE of the three (config.mamba_layers, ffn_layers,
the rest attend; the metadata notes below say how the file tells them apart):

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
plus a shared expert (layers/nemotron_moe.py); its trailing MTP block is not run (config.n_nextn).

Metadata keys (config.read with SPEC and read_args):
Read by mamba2_keys (granitehybrid.py and falcon_h1.py use it too, through mamba2_layout).

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

Scalars may also be stored as per-layer arrays of one value (config.MetaReader.get).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.ffn import FFN, FFNWeights, SparseSettings, SparsityStats
from ..layers.cache import Mamba2KVCache
from ..gguf.types import Tensor
from .base import Expected, Model, get_tensor, head_expected, layer_tensors, norm_weight
from ..layers.mamba2_mixer import Mamba2Mixer, mamba2_dims, mamba2_expected, mamba2_tensors
from ..layers.nemotron_moe import NemotronMoE, nemotron_moe_expected
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
    """ModelConfig fields of a Mamba-2 hybrid (module docstring) plus "_n_head_kv" and "_n_ff" for mamba2_layout;
    r: the config.MetaReader."""
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
    """nemotron_h_moe's routing fields of ModelConfig (module docstring); r: the config.MetaReader."""
    path = r.f.path
    norm, scale = r.expert_weights()
    groups, used = r.get("{arch}.expert_group_count", 0), r.get("{arch}.expert_group_used_count", 0)
    latent = r.get("{arch}.moe_latent_size", 0)
    if latent < 0:
        raise ModelFileError(f"{path}: {r.key('{arch}.moe_latent_size')} must be >= 0, got {latent}")
    return {"expert_weights_norm": norm, "expert_gating": "sigmoid", "expert_weights_scale": scale or 1.0,
            "n_expert_groups": groups if groups > 1 else 0, "n_expert_group_used": used if groups > 1 else 0,
            "n_ff_shexp": r.positive("{arch}.expert_shared_feed_forward_length"), "moe_latent_size": latent}


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
