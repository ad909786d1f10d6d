"""Arcee Trinity Nano / Mini / Large (GGUF arch "afmoe"), as llama.cpp's afmoe graph computes it.

    x = token_embd[ids] * sqrt(n_embd)                                  (mu-P)
    per layer il:
        n    = rmsnorm(x) * attn_norm
        q, k, v = Wq n, Wk n, Wv n;  g = Wgate n                         (attn_gate: one gate per output value)
        q, k = rmsnorm per head (attn_q_norm, attn_k_norm), then NeoX RoPE over whole heads, except on the
               layers (il + 1) % 4 == 0, which use no RoPE
        a    = attention(q, k, v): over the last attention.sliding_window positions on the windowed layers (3
               of every 4 by default; RoPE base rope.freq_base_swa there), all positions on the others; scale
               1/sqrt(head_dim)
        x    = x + rmsnorm(Wo · (a * sigmoid(g))) * post_attention_norm   (the gate acts before the output proj.)
        m    = rmsnorm(x) * ffn_norm
        x    = x + rmsnorm(ffn_il(m)) * post_ffw_norm
    logits = output · (rmsnorm(x_last) * output_norm)                    (tied to token_embd when absent)
ffn_il: SwiGLU on the first leading_dense_block_count layers, then experts (moe.MoEFFN): sigmoid scores (unless
expert_gating_func says softmax), chosen by score + exp_probs_b.bias (within the best groups when the file has
groups), weights renormalized (expert_weights_norm) and scaled (expert_weights_scale, Trinity: 2.826), plus a
shared SwiGLU expert (expert_shared_count x the expert width) added ungated.

The gate between the attention and its output projection has no place in the one-call C attention step, so
every token runs the Python path (the experts dominate a step's time anyway). Files with attention biases or a
fused attn_qkv are refused (llama.cpp's converter writes neither for this arch).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.cache import KVCache
from ..layers.moe import MoEFFN
from ..gguf.types import Tensor
from .bailingmoe2 import read_args  # noqa: F401
from .base import Expected, Model, get_tensor, llama_like_expected, norm_weight
from .spec import ArchSpec

_ATTN_EXTRAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_qkv.weight")


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's tensors plus Q/K norms, the attention gate and the two post-norms; experts past the dense layers
    with a required selection bias and, when expert_shared_count > 0, an ungated shared expert."""
    e = llama_like_expected(c, shared_gate=False, select_bias=True)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_q_norm.weight"] = ((c.head_dim,), True)
        e[p + "attn_k_norm.weight"] = ((c.head_dim,), True)
        e[p + "attn_gate.weight"] = ((c.n_head * c.head_dim, c.n_embd), True)
        e[p + "post_attention_norm.weight"] = ((c.n_embd,), True)
        e[p + "post_ffw_norm.weight"] = ((c.n_embd,), True)
    return e


class AfmoeModel(Model):
    """The block of the module docstring, in its own forward."""

    LAYER_TENSORS = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
                     "wv": "attn_v.weight", "wo": "attn_output.weight", "wg": "attn_gate.weight",
                     "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
                     "post_attn_norm": "post_attention_norm.weight", "ffn_norm": "ffn_norm.weight",
                     "post_ffw_norm": "post_ffw_norm.weight"}
    QK_NORMS = True

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        extra = [n for n in tensors if n.startswith("blk.") and n.split(".", 2)[2] in _ATTN_EXTRAS]
        if extra:
            raise UnsupportedError(f"afmoe files with attention biases or a fused attn_qkv are not supported "
                                   f"(found {extra[0]!r})")
        super().__init__(config, tensors, kernels, sparse)
        c = config
        rope = self.rope_args()
        self.layer_attn = []  # per layer (window, RoPE arguments): the NoPE layers rotate 0 dims
        for il in range(c.n_layer):
            base = c.rope_freq_base_swa if c.swa_layers[il] else c.rope_freq_base
            n_rot = 0 if c.no_rope_layers[il] else rope[0]
            self.layer_attn.append((c.sliding_window if c.swa_layers[il] else 0, (n_rot, base, *rope[2:])))

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        c = self.config
        moe = super().build_moe(tensors, il)  # router, expert stacks and the (ungated) shared expert, if any
        return MoEFFN(self.kernels, moe.router, moe.gate, moe.up, moe.down, c.n_expert_used, c.expert_weights_norm,
                      layer=il, shared=moe.shared, shared_gate=None,
                      select_bias=norm_weight(get_tensor(tensors, f"blk.{il}.exp_probs_b.bias")),
                      gating=c.expert_gating, weights_scale=c.expert_weights_scale, n_groups=c.n_expert_groups,
                      n_group_used=c.n_expert_group_used)

    def layer_attention(self) -> list[tuple[int, tuple]]:
        return self.layer_attn

    def attn_plans(self) -> None:
        """No one-call attention step (module docstring)."""
        return None

    def _embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        x = self.kernels.get_rows(self.token_embd, ids)
        x *= np.float32(self.config.embd_scale)
        return x

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps, width = ids.shape[0], c.norm_eps, c.n_head * c.head_dim
        x = self._embed(ids, pos)  # [N, n_embd]
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attn)):
            h = k.rmsnorm(x, L.attn_norm, eps)
            q, kk, v = self._qkv(L, h, n)
            g = k.matmul(L.wg, h)  # [N, n_head * head_dim]
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, window, c.attn_scale).reshape(n, width)
            a *= (np.float32(1.0) / (np.float32(1.0) + np.exp(-g, dtype=np.float32)))
            x += k.rmsnorm(k.matmul(L.wo, a), L.post_attn_norm, eps)
            x += k.rmsnorm(self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x), L.post_ffw_norm, eps)
        cache.n_past = p0 + n
        return self._head(x, all_logits)


AFMOE_SWA_PERIOD = 4  # afmoe: default of {arch}.attention.sliding_window_pattern (3 windowed, 1 global)


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


SPEC = ArchSpec("afmoe", model=AfmoeModel, expected=expected_tensors, rope_neox=True, moe=True, moe_norm=False,
                swa=afmoe_swa)
