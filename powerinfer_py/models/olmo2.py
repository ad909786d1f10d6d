"""OLMo 2 (GGUF arch "olmo2": OLMo-2 1B, 7B, 13B, 32B).

A llama-shaped layer with its norms moved: nothing normalizes the input of the attention or of the FFN; instead
the Q and K projections are normalized as whole vectors (one RMSNorm over all n_head * head_dim values of q,
one over all n_head_kv * head_dim values of k, not per head as in qwen3), and the outputs of the attention and
of the FFN are normalized before they are added to the residual stream.

Per layer:  q = rmsnorm(Wq·x) * q_norm        (blk.N.attn_q_norm.weight, f32 [n_head * head_dim])
            k = rmsnorm(Wk·x) * k_norm        (blk.N.attn_k_norm.weight, f32 [n_head_kv * head_dim])
            v = Wv·x;  q, k = rope_neox(q), rope_neox(k)           (pairs i, i + n_rot/2)
            h = x + rmsnorm(Wo · attn(q, k, v)) * post_attention_norm        (scale 1/sqrt(head_dim))
            y = h + rmsnorm(Wdown · (silu(Wgate·h) * (Wup·h))) * post_ffw_norm
Logits: rmsnorm(x) * output_norm, then output.weight (llama.cpp requires it; a file without it would use
token_embd.weight). No biases anywhere. All as in llama.cpp's olmo2 graph.

OLMo 3 files (the same arch with attention.sliding_window > 0): the layers config.swa_layers marks (3 of every 4
by default) attend only to the last `sliding_window` positions and rotate with plain RoPE (base
rope.freq_base_swa, no frequency scale, no YaRN factors or magnitude); the others attend to every position with
the file's RoPE scaling (YaRN on the long-context files), as llama.cpp's graph does.

One-token steps run each attention block as one C call (step_attn.c, as the pre-norm models do) with the
three switches it has for this block: no input norm (attn_norm None), whole-width Q/K norms (qk_norm_full) and
the FFN input left unnormed (ffn_norm None); the post-attention norm is its post_norm. Same bits as the
Python path of forward() (tests/test_smollm3_olmo2.py).

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  olmo2   NeoX RoPE; no pre-norms: RMSNorms of the whole Q and K projections and of the attention and FFN outputs
          (tensors). OLMo 3 files have attention.sliding_window > 0: window layers per sliding_window_pattern
          (default: all but every 4th), with plain RoPE at rope.freq_base_swa (default rope.freq_base) while
          the full layers take the file's YaRN scaling, as llama.cpp runs them
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError
from ..layers.cache import KVCache
from .base import Expected, Model, head_expected
from .spec import ArchSpec

LAYER_TENSORS = {
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "post_ffw_norm": "post_ffw_norm.weight",
}


def expected_tensors(c: ModelConfig, head_norms: bool = False) -> Expected:
    """olmo2's tensors; head_norms: Q/K norms of one head's width (exaone4) instead of the whole projection's."""
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    e = head_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e[p + "attn_q.weight"] = ((q_dim, c.n_embd), True)
        e[p + "attn_k.weight"] = ((kv_dim, c.n_embd), True)
        e[p + "attn_v.weight"] = ((kv_dim, c.n_embd), True)
        e[p + "attn_output.weight"] = ((c.n_embd, q_dim), True)
        e[p + "attn_q_norm.weight"] = ((c.head_dim if head_norms else q_dim,), True)
        e[p + "attn_k_norm.weight"] = ((c.head_dim if head_norms else kv_dim,), True)
        e[p + "post_attention_norm.weight"] = ((c.n_embd,), True)
        e[p + "ffn_gate.weight"] = ((c.n_ff, c.n_embd), True)
        e[p + "ffn_up.weight"] = ((c.n_ff, c.n_embd), True)
        e[p + "ffn_down.weight"] = ((c.n_embd, c.n_ff), True)
        e[p + "post_ffw_norm.weight"] = ((c.n_embd,), True)
    return e


class Olmo2Model(Model):
    """Its own forward (no pre-norms, output norms, full-width Q/K norms); the FFN is ffn.FFN (SwiGLU)."""

    FFN_OUT_NORM = "post_ffw_norm"
    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors, kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        for L in self.layers:  # what base.attn_plans hands to attn_block_plan: no pre-norms in this block
            L.attn_norm = L.ffn_norm = None

    def layer_attention(self) -> list[tuple[int, tuple]]:
        """Per layer (window, RoPE args): OLMo 3's window layers use plain RoPE at their own base."""
        c = self.config
        plain = (c.n_rot, c.rope_freq_base_swa, 1.0, c.rope_neox, None, 1.0)
        return [(c.sliding_window, plain) if swa else (0, self.rope_args()) for swa in c.swa_layers]

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits of tokens (the last, or all rows with all_logits) after appending their K/V to cache."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps

        x = self._embed(ids, pos)  # [N, n_embd]
        plans = self.attn_plans() if n == 1 else None
        if plans is not None:  # base._fused_decode: the C block, then _ffn_out(ffn(x, x))
            return self._fused_decode(plans, x, p0, cache, all_logits)
        last = self._trimmed_layer(n, all_logits)  # as base.forward: the last layer past its K/V for one row
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attention())):
            q, kk, v = self._qkv(L, x, n)
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            q, x, qp = self._past_kv(il, last, q, x, p0)
            a = k.attention(q, cache.k[il], cache.v[il], qp, window, c.attn_scale)  # [N, H, hd]
            x += k.rmsnorm(k.matmul(L.wo, a.reshape(x.shape[0], c.n_head * c.head_dim)), L.post_attn_norm, eps)
            # the FFN reads the residual itself (no ffn_norm); the predictor input is that residual too
            x += self._ffn_out(il, self.ffns[il](x, x))

        cache.n_past = p0 + n
        return self._head(x, all_logits)

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        kw = dict(super().attn_plan_kwargs(il, layer), q_norm=layer.q_norm, k_norm=layer.k_norm,
                  post_norm=layer.post_attn_norm, qk_norm_full=True)
        if self.config.swa_layers[il]:  # OLMo 3's window layers: plain RoPE
            kw.update(window=self.config.sliding_window, rope_base=self.config.rope_freq_base_swa, rope_scale=1.0,
                      rope_freqs=None, rope_mscale=1.0)
        return kw

    def _qkv(self, L, h: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q f32 [N, n_head, head_dim], k and v [N, n_head_kv, head_dim] of the residual h (no input norm): the
        projections, with q and k each normalized over their full width before they are split into heads."""
        c, k = self.config, self.kernels
        q = k.rmsnorm(k.matmul(L.wq, h), L.q_norm, c.norm_eps)
        kk = k.rmsnorm(k.matmul(L.wk, h), L.k_norm, c.norm_eps)
        v = k.matmul(L.wv, h)
        return (q.reshape(n, c.n_head, c.head_dim), kk.reshape(n, c.n_head_kv, c.head_dim),
                v.reshape(n, c.n_head_kv, c.head_dim))


OLMO3_SWA_PERIOD = 4  # olmo2 with a window (OLMo 3): layers with il % 4 == 3 attend to every position


def olmo3_swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    """olmo2 files with attention.sliding_window > 0 (OLMo 3): (window, swa_layers, RoPE base of the window
    layers). The layers come from attention.sliding_window_pattern (one bool per layer, or a period) and
    otherwise from llama.cpp's default period of 4 (layer il has the window unless il % 4 == 3)."""
    window = r.get("{arch}.attention.sliding_window", 0)
    if window <= 0:
        return 0, (False,) * n_layer, rope_freq_base
    pattern = r.meta.get(r.key("{arch}.attention.sliding_window_pattern"))
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ModelFileError(f"{r.f.path}: {r.key('{arch}.attention.sliding_window_pattern')} has "
                                 f"{len(pattern)} entries for {n_layer} layers")
        layers = tuple(bool(v) for v in pattern)
    else:
        period = pattern if isinstance(pattern, int) and pattern > 0 else OLMO3_SWA_PERIOD
        layers = tuple(il % period != period - 1 for il in range(n_layer))
    return window, layers, r.get("{arch}.rope.freq_base_swa", rope_freq_base, kind=float)


SPEC = ArchSpec("olmo2", model=Olmo2Model, expected=expected_tensors, rope_neox=True, yarn=True,
                swa=olmo3_swa)
