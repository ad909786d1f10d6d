"""Liquid LFM2 (GGUF arch "lfm2"): a hybrid of gated short-convolution layers and attention layers.

  x = token_embd[ids]
  per layer (config.conv_layers says which kind):
    n = rmsnorm(x) * attn_norm
    convolution layer (kernel length K = config.conv_kernel, 3 in the real files):
        b, c, u = split(W_in · n)                       (three rows of n_embd: shortconv.in_proj)
        s_t = b_t * u_t                                  (per channel)
        z_t = sum_{j=0..K-1} w[:, j] * s_{t-K+1+j}       (depthwise causal conv, shortconv.conv [n_embd, K]:
                                                           w[:, K-1] weighs the current token; s before
                                                           position 0 is zero)
        x = x + W_out · (c_t * z_t)                      (shortconv.out_proj)
    attention layer:
        q, k = rmsnorm per head (attn_q_norm, attn_k_norm) of Wq·n, Wk·n;  v = Wv·n
        x = x + Wo · attention(rope_neox(q), rope_neox(k), v)
    m = rmsnorm(x) * ffn_norm
    x = x + Wdown · (silu(Wgate·m) * (Wup·m))            (every layer)
  logits = output · (rmsnorm(x) * token_embd_norm)       (the final norm's GGUF name; output tied to token_embd
                                                           when absent)

lfm2moe (LFM2-8B-A1B) replaces the FFN of the layers past config.moe_layers' leading dense ones by experts
(moe.py): scores s = sigmoid or softmax (expert_gating) of ffn_gate_inp · m, the n_used experts with the largest
s + exp_probs_b.bias chosen, their weights s / sum(s) over the chosen; no shared expert.

The conv state of a layer is s at the last K-1 positions (conv_cache.ConvKVCache), so a forward that starts
at n_past continues the convolution exactly where the previous one stopped. The attention layers use the
base block's _qkv and the attention kernel; in a one-token step (CPU kernels) each of them is one C call
(kernels.steps.attn_block_decode, as base.Model's decode), with the same bits as the Python path.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  lfm2    (Liquid LFM2) a hybrid: {arch}.attention.head_count_kv is a per-layer array whose 0 entries mark the
          gated short-convolution layers (conv_layers; the others attend, with that many KV heads, which must be
          the same on every attention layer); {arch}.shortconv.l_cache (required, >= 2) is the conv kernel length
          (3 in the real files); NeoX RoPE, per-head Q/K norms; files with {arch}.attention.sliding_window > 0
          (sliding-window attention layers) are refused. lfm2moe (LFM2-8B-A1B) is lfm2 with
          {arch}.leading_dense_block_count (default 0) dense layers, then experts (expert_feed_forward_length wide)
          chosen by expert_gating_func (required: 1 softmax, 2 sigmoid) scores plus the selection bias
          exp_probs_b.bias, their weights always renormalized (sum clamped at 6.1e-5) and not scaled
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..layers.cache import ConvKVCache
from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import Tensor
from ..layers.ffn import SparseSettings
from ..kernels.ref import dequantize
from ..layers.moe import MoEFFN
from .base import Expected, Model, ffn_expected, get_tensor, layer_tensors, norm_weight, sparsify_expected
from .spec import ArchSpec

OUTPUT_NORM = "token_embd_norm.weight"  # llama.cpp's name for lfm2's final norm
SHARED = {"attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight"}
CONV = {"in_proj": "shortconv.in_proj.weight", "out_proj": "shortconv.out_proj.weight"}
ATTENTION = {"wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
             "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}


def expected_tensors(c: ModelConfig) -> Expected:
    E, hd = c.n_embd, c.head_dim
    q_dim, kv_dim = c.n_head * hd, c.n_head_kv * hd
    e: Expected = {"token_embd.weight": ((c.n_vocab, E), True), OUTPUT_NORM: ((E,), True),
                   "output.weight": ((c.n_vocab, E), False)}
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_norm.weight"] = ((E,), True)
        e[p + "ffn_norm.weight"] = ((E,), True)
        e.update(ffn_expected(c, il, select_bias=True))  # lfm2moe: experts past its leading dense layers
        if c.conv_layers[il]:
            e[p + "shortconv.conv.weight"] = ((E, c.conv_kernel), True)
            e[p + "shortconv.in_proj.weight"] = ((3 * E, E), True)
            e[p + "shortconv.out_proj.weight"] = ((E, E), True)
        else:
            e[p + "attn_q.weight"] = ((q_dim, E), True)
            e[p + "attn_k.weight"] = ((kv_dim, E), True)
            e[p + "attn_v.weight"] = ((kv_dim, E), True)
            e[p + "attn_output.weight"] = ((E, q_dim), True)
            e[p + "attn_q_norm.weight"] = ((hd,), True)
            e[p + "attn_k_norm.weight"] = ((hd,), True)
    return sparsify_expected(c, e)  # PWRI files (`powerinfer train-predictor`): ffn_down_t, fc1, fc2


class Lfm2Model(Model):
    """The lfm2 block (module docstring). Per layer, `layers[il]` holds the shared norms plus either in_proj,
    out_proj and conv_w (f32 [n_embd, K]) or the attention tensors."""

    LAYER_TENSORS = SHARED
    QK_NORMS = True

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        tensors = dict(tensors)
        tensors["output_norm.weight"] = get_tensor(tensors, OUTPUT_NORM)  # what base.Model reads
        super().__init__(config, tensors, kernels, sparse)
        for il, L in enumerate(self.layers):
            if config.conv_layers[il]:
                vars(L).update(vars(layer_tensors(tensors, il, CONV)))
                w = get_tensor(tensors, f"blk.{il}.shortconv.conv.weight")
                L.conv_w = np.ascontiguousarray(dequantize(w).reshape(config.n_embd, config.conv_kernel))
            else:
                vars(L).update(vars(layer_tensors(tensors, il, ATTENTION)))

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        """lfm2moe's experts: the file's gating, the selection bias, renormalized weights, no shared expert."""
        c, moe = self.config, super().build_moe(tensors, il)
        return MoEFFN(self.kernels, moe.router, moe.gate, moe.up, moe.down, c.n_expert_used, c.expert_weights_norm,
                      layer=il, select_bias=norm_weight(get_tensor(tensors, f"blk.{il}.exp_probs_b.bias")),
                      gating=c.expert_gating, weights_scale=c.expert_weights_scale)

    def new_cache(self, n_ctx: int | None = None) -> ConvKVCache:
        c = self.config
        return ConvKVCache(c.conv_layers, c.n_head_kv, n_ctx or c.n_ctx_train, c.head_dim, c.n_embd, c.conv_kernel)

    def has_attention(self, il: int) -> bool:
        return not self.config.conv_layers[il]

    def forward(self, tokens, cache: ConvKVCache, all_logits: bool = False) -> np.ndarray:
        """Logits of tokens (the last, or all rows with all_logits), continuing the cache's K/V and conv states."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        rope = self.rope_args()
        x = self._embed(ids, pos)  # [N, n_embd]
        plans = self.attn_plans() if n == 1 else None
        cache.begin(p0)
        for il, L in enumerate(self.layers):
            if plans is not None and plans[il] is not None:  # adds the attention to x, returns the FFN's input
                m = k.steps.attn_block_decode(plans[il], x[0], p0, cache.k[il], cache.v[il])
                x += self.ffns[il](m[None, :], x)
                continue
            h = k.rmsnorm(x, L.attn_norm, eps)
            if c.conv_layers[il]:
                x += self._shortconv(il, L, h, cache, p0)
            else:
                q, kk, v = self._qkv(L, h, n)
                k.rope(q, pos, *rope)
                k.rope(kk, pos, *rope)
                self._store_kv(cache, il, p0, kk, v)
                a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, H, hd]
                x += k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim))
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)
        cache.end(p0 + n)
        return self._head(x, all_logits)

    def _shortconv(self, il: int, L, h: np.ndarray, cache: ConvKVCache, p0: int) -> np.ndarray:
        """The gated causal convolution of layer il on its normed input h f32 [N, n_embd]; updates the layer's
        conv state (the last K-1 values of b * u) in cache."""
        E, K = self.config.n_embd, self.config.conv_kernel
        bcu = self.kernels.matmul(L.in_proj, h)  # [N, 3E]: b | c | u
        b, gate, u = bcu[:, :E], bcu[:, E:2 * E], bcu[:, 2 * E:]
        s = np.concatenate([cache.conv_state(il, p0), b * u])  # [K-1+N, E]: the state, then the new inputs
        n = h.shape[0]
        z = s[0:n] * L.conv_w[:, 0]  # tap j reads s shifted by j; the last tap reads the current token
        for j in range(1, K):
            z += s[j:j + n] * L.conv_w[:, j]
        cache.set_conv_state(il, s[n:])
        return self.kernels.matmul(L.out_proj, np.ascontiguousarray(gate * z))


def _layout(r, d: dict) -> None:
    d["n_head"] = r.positive("{arch}.attention.head_count")
    out = lfm2_keys(r, d["n_layer"], d["n_head"])
    d["n_head_kv"] = out.pop("_n_head_kv")
    d.update(out)


def lfm2_keys(r, n_layer: int, n_head: int) -> dict:
    """lfm2's layer kinds (module docstring): conv_layers, conv_kernel and "_n_head_kv" (the attention
    layers' KV heads) for the layout hook."""
    key = r.key("{arch}.attention.head_count_kv")
    kv = r.meta.get(key)
    if not isinstance(kv, list) or len(kv) != n_layer or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in kv):
        raise ModelFileError(f"{r.f.path}: {key} must be an array of {n_layer} head counts (0 marks a "
                             f"convolution layer), got {kv!r}")
    heads = sorted(set(v for v in kv if v))
    if len(heads) > 1:
        raise UnsupportedError(f"{r.f.path}: {key} differs between attention layers ({heads})")
    if heads and n_head % heads[0]:
        raise ModelFileError(f"{r.f.path}: head_count {n_head} is not a multiple of head_count_kv {heads[0]}")
    kernel = r.get("{arch}.shortconv.l_cache")
    if kernel < 2:
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.shortconv.l_cache')} must be at least 2 (a "
                             f"causal convolution over the token and its predecessors), got {kernel}")
    if r.get("{arch}.attention.sliding_window", 0) > 0:
        raise UnsupportedError(f"{r.f.path}: lfm2 files with sliding-window attention are not supported")
    out = {"conv_layers": tuple(v == 0 for v in kv), "conv_kernel": kernel,
           "_n_head_kv": heads[0] if heads else n_head}
    if r.arch == "lfm2moe":
        lead = r.get("{arch}.leading_dense_block_count", 0)
        if not 0 <= lead <= n_layer:
            raise ModelFileError(f"{r.f.path}: {r.key('{arch}.leading_dense_block_count')} {lead} is "
                                 f"outside 0..{n_layer} (block_count)")
        gating = r.get("{arch}.expert_gating_func")
        if gating not in (1, 2):
            raise UnsupportedError(f"{r.f.path}: {r.key('{arch}.expert_gating_func')} {gating} is not "
                                   "supported (1 softmax, 2 sigmoid)")
        out.update(moe_layers=tuple(il >= lead for il in range(n_layer)),
                   expert_gating="sigmoid" if gating == 2 else "softmax")
    return out


SPEC = ArchSpec("lfm2", model=Lfm2Model, expected=expected_tensors, rope_neox=True, pwri=True, layout=_layout)
VARIANTS = (replace(SPEC, name="lfm2moe", pwri=False, moe=True, moe_norm=True),)  # leading dense layers, experts
