"""OpenAI gpt-oss (GGUF arch "gpt-oss"; gpt-oss-20b: 24 layers, 32 experts of which 4 run per token).

The pre-norm block of models/base.py with these differences, as llama.cpp's gpt-oss graph computes them:
    per layer il:
        n = rmsnorm(x) * attn_norm
        q, k, v = Wq n + bq, Wk n + bk, Wv n + bv                  (biases on all three)
        RoPE on q and k: NeoX layout, YaRN from the metadata        (config.py)
        s_j = q · k_j / sqrt(head_dim) over the visible j: the even layers see the last
              {arch}.attention.sliding_window positions, the odd layers all of them
        a = sum_j v_j e^(s_j - m) / (sum_i e^(s_i - m) + e^(sink_h - m)),  m = max(max_j s_j, sink_h)
              (attention sinks: one learned logit per query head, blk.N.attn_sinks.weight, that joins the
              softmax's denominator and weighs no value: a head may attend to "nothing")
        x = x + (Wo a + bo)
        x = x + moe(rmsnorm(x) * post_attention_norm)              (the FFN's norm has that name here)
    logits = output · (rmsnorm(x) * output_norm)
moe (moe.MoEFFN's gpt-oss options): l = router · x + router_bias; the n_used experts with the largest l are
chosen, their weights softmax(l[chosen]) (after the selection, not before); expert e computes
    down_e · swiglu_oai(gate_e · x + b_gate_e, up_e · x + b_up_e) + b_down_e
with swiglu_oai(g, u) = g' * sigmoid(1.702 g') * (u' + 1), g' = min(g, 7), u' = clip(u, -7, 7).

The decode step is one C call per attention block (step_attn.c takes the output bias and the sinks), with the
same bits as the Python path. Real gpt-oss files store the experts in MXFP4; this module runs whatever weight
types the kernels read.

Metadata keys (config.read with SPEC; defaults are llama.cpp's):
  gpt-oss NeoX RoPE (YaRN in the real files), Q/K/V and output biases, attention sinks (tensors); the even layers
          (il % 2 == 0, llama.cpp's fixed pattern) attend within {arch}.attention.sliding_window (required);
          attn_scale 1/sqrt(head_dim); experts {arch}.expert_feed_forward_length wide, routed by the top-k
          biased router logits softmaxed after the selection (moe.py); a rope.freq_base_swa that differs from
          the global base is refused
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import UnsupportedError
from ..layers.cache import KVCache
from ..layers.moe import MoEFFN
from ..gguf.types import Tensor
from .base import Expected, Model, get_tensor, head_expected, moe_expected, norm_weight
from .spec import ArchSpec


def expected_tensors(c: ModelConfig) -> Expected:
    """The tensors of a gpt-oss file in llama.cpp's names (output.weight required, as llama.cpp has it)."""
    q_dim, kv_dim, E, F = c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_expert, c.n_ff_exp
    e = head_expected(c)
    e["output.weight"] = ((c.n_vocab, c.n_embd), True)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e.update({p + "attn_norm.weight": ((c.n_embd,), True),
                  p + "attn_q.weight": ((q_dim, c.n_embd), True), p + "attn_q.bias": ((q_dim,), True),
                  p + "attn_k.weight": ((kv_dim, c.n_embd), True), p + "attn_k.bias": ((kv_dim,), True),
                  p + "attn_v.weight": ((kv_dim, c.n_embd), True), p + "attn_v.bias": ((kv_dim,), True),
                  p + "attn_output.weight": ((c.n_embd, q_dim), True), p + "attn_output.bias": ((c.n_embd,), True),
                  p + "attn_sinks.weight": ((c.n_head,), True),
                  p + "post_attention_norm.weight": ((c.n_embd,), True),
                  p + "ffn_gate_inp.bias": ((E,), True),
                  p + "ffn_gate_exps.bias": ((E, F), True), p + "ffn_up_exps.bias": ((E, F), True),
                  p + "ffn_down_exps.bias": ((E, c.n_embd), True)})
        e.update(moe_expected(c, p))
    return e


class GptOssModel(Model):
    """The block of the module docstring: base.Model's forward with the sinks passed to the attention."""

    LAYER_TENSORS = {
        "attn_norm": "attn_norm.weight",
        "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
        "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias",
        "ffn_norm": "post_attention_norm.weight",
    }
    QKV_BIASES = True

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        super().__init__(config, tensors, kernels, sparse)
        for il, L in enumerate(self.layers):
            L.sinks = norm_weight(get_tensor(tensors, f"blk.{il}.attn_sinks.weight"))
        c = config
        self.layer_attn = [(c.sliding_window if swa else 0, self.rope_args()) for swa in c.swa_layers]

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        c, p = self.config, f"blk.{il}."

        def bias(name):
            return norm_weight(get_tensor(tensors, p + name)).reshape(get_tensor(tensors, p + name).shape)

        return MoEFFN(self.kernels, get_tensor(tensors, p + "ffn_gate_inp.weight"),
                      get_tensor(tensors, p + "ffn_gate_exps.weight"), get_tensor(tensors, p + "ffn_up_exps.weight"),
                      get_tensor(tensors, p + "ffn_down_exps.weight"), c.n_expert_used, False, layer=il,
                      router_bias=bias("ffn_gate_inp.bias"), weights_after_topk=True,
                      expert_biases=(bias("ffn_gate_exps.bias"), bias("ffn_up_exps.bias"),
                                     bias("ffn_down_exps.bias")),
                      act="swiglu_oai")

    def layer_attention(self) -> list[tuple[int, tuple]]:
        return self.layer_attn

    def _attn_out(self, il: int, y: np.ndarray) -> np.ndarray:
        y += self.layers[il].bo  # the output projection's bias, before the residual add
        return y

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        return {**super().attn_plan_kwargs(il, layer), "window": self.layer_attn[il][0], "bo": layer.bo,
                "sinks": layer.sinks}

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """base.Model.forward with each layer's sinks passed to the attention (one token: the fused C step)."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        x = self._embed(ids, pos)
        plans = self.attn_plans() if n == 1 else None
        if plans is not None:
            return self._fused_decode(plans, x, p0, cache, all_logits)
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attn)):
            q, kk, v = self._qkv(L, k.rmsnorm(x, L.attn_norm, eps), n)
            k.rope(q, pos, *rope)
            k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, v)
            a = k.attention(q, cache.k[il], cache.v[il], p0, window, c.attn_scale, 0.0, L.sinks)
            x += self._attn_out(il, k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim)))
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)
        cache.n_past = p0 + n
        return self._head(x, all_logits)


SWA_PERIOD = 2  # layers il % 2 == 0 attend within the window (llama.cpp hard-codes it)


def _swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    """The even layers attend within {arch}.attention.sliding_window (required); a rope.freq_base_swa that
    differs from the global base is refused."""
    base_swa = r.get("{arch}.rope.freq_base_swa", rope_freq_base, kind=float)
    if base_swa != rope_freq_base:
        raise UnsupportedError(f"{r.f.path}: a gpt-oss file whose sliding-window layers have their own "
                               f"RoPE base ({base_swa} vs {rope_freq_base}) is not supported")
    return (r.positive("{arch}.attention.sliding_window"),
            tuple(il % SWA_PERIOD != SWA_PERIOD - 1 for il in range(n_layer)), rope_freq_base)


def describe(c: dict) -> list[tuple[str, str]]:
    return [("gpt-oss", f"attention sinks; even layers see the last {c['sliding_window']} tokens; router "
             "weights softmaxed after top-k; expert biases; swiglu_oai (clamp 7, alpha 1.702)")]


SPEC = ArchSpec("gpt-oss", model=GptOssModel, expected=expected_tensors, rope_neox=True, yarn=True, moe=True,
                moe_norm=False, swa=_swa, describe=describe)  # moe_norm: a softmax over the chosen logits (moe.py)
