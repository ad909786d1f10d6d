"""SmallThinker (GGUF arch "smallthinker": PowerInfer's SmallThinker-4B-A0.6B and SmallThinker-21B-A3B).

A mixture-of-experts model made for local CPU inference, as llama.cpp's smallthinker graph computes it:
    per layer il, with x the layer's input (the residual stream):
        r = router · x                               router = ffn_gate_inp (n_expert, n_embd), on x itself:
                                                     before attention and without any norm
        n = rmsnorm(x) * attn_norm
        q, k, v = Wq n, Wk n, Wv n                   (no biases; grouped-query attention)
        q, k = rope(q), rope(k)                      NeoX layout over the whole head; skipped on the NoPE layers
        s_j = q · k_j / sqrt(head_dim) over the visible j: all positions, or on the sliding-window layers the
              last 4096 (llama.cpp's fixed window: the file's value only switches the layout on)
        h = x + Wo · attn
        y = h + moe(rmsnorm(h) * ffn_norm, r)
    logits = output · (rmsnorm(y_last) * output_norm)            (output tied to token_embd when absent)
moe (moe.MoEFFN with act "reglu" and the precomputed router logits r):
        probs  = softmax(r), or sigmoid(r) (expert_gating_func 2)
        chosen = the n_used experts with the largest probs;  w = probs[chosen] / sum(probs[chosen])
        y      = sum_r w_r * down_e · (relu(gate_e · m) * (up_e · m)),  e = chosen[r]
The layout (config_archs.py): files without {arch}.attention.sliding_window (or 0) run every layer globally with
RoPE; with it, layers il % P != 0 (P = sliding_window_pattern, default 4) use the window and RoPE base
rope.freq_base_swa, and layers il % 4 == 0 skip RoPE (NoPE). {arch}.expert_weights_scale is ignored, as llama.cpp
ignores it for this arch. There is no shared expert and no dense layer.

ReLU experts are sparse inside: most neurons of a chosen expert output exactly 0. `--sparse exact` skips their
up rows (moe.py); the run's statistics (model.sparsity, `run -v`) count the active neurons of the chosen experts.
One token runs each attention block as one C call (step_attn.c: n_rot 0 on the NoPE layers), same bits as the
Python path.
"""
from __future__ import annotations

from typing import Mapping

from ..config import ModelConfig
from ..errors import UnsupportedError
from ..ffn import SparsityStats
from ..kv_cache import KVCache
from ..moe import MoEFFN
from ..tensor import Tensor
from .base import Expected, Model, get_tensor, llama_like_expected
from .llama import LAYER_TENSORS

_ATTN_EXTRAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_qkv.weight")


def expected_tensors(c: ModelConfig) -> Expected:
    """llama's attention tensors and, on every layer, the router and the three expert stacks."""
    return llama_like_expected(c)


class SmallThinkerModel(Model):
    """The block of the module docstring: its own forward (the router reads the layer input)."""

    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels, sparse=None):
        extra = [n for n in tensors if n.startswith("blk.") and n.split(".", 2)[2] in _ATTN_EXTRAS]
        if extra:
            raise UnsupportedError(f"smallthinker files with attention biases or a fused attn_qkv are not supported "
                                   f"(found {extra[0]!r})")
        super().__init__(config, tensors, kernels, sparse)
        c = config
        rope, nope = self.rope_args(), (0, *self.rope_args()[1:])
        self.layer_attn = []
        for il in range(c.n_layer):
            base = c.rope_freq_base_swa if c.swa_layers[il] else c.rope_freq_base
            args = nope if c.no_rope_layers and c.no_rope_layers[il] else (rope[0], base, *rope[2:])
            self.layer_attn.append((c.sliding_window if c.swa_layers[il] else 0, args))

    def build_ffns(self, tensors: Mapping[str, Tensor], biases: bool = False) -> list:
        """Every layer's experts, counting the active neurons of the chosen experts in self.sparsity."""
        c = self.config
        self.sparsity = SparsityStats(c.n_layer, c.n_ff_exp, self.sparse.mode, self.sparse.threshold)
        return [self.build_moe(tensors, il) for il in range(c.n_layer)]

    def build_moe(self, tensors: Mapping[str, Tensor], il: int) -> MoEFFN:
        c, p = self.config, f"blk.{il}."
        return MoEFFN(self.kernels, get_tensor(tensors, p + "ffn_gate_inp.weight"),
                      get_tensor(tensors, p + "ffn_gate_exps.weight"), get_tensor(tensors, p + "ffn_up_exps.weight"),
                      get_tensor(tensors, p + "ffn_down_exps.weight"), c.n_expert_used, True, layer=il,
                      act="reglu", gating=c.expert_gating, exact=self.sparse.mode == "exact", stats=self.sparsity)

    def layer_attention(self) -> list[tuple[int, tuple]]:
        return self.layer_attn

    def attn_plan_kwargs(self, il: int, layer) -> dict:
        window, (n_rot, base, *_) = self.layer_attn[il]
        return {**super().attn_plan_kwargs(il, layer), "n_rot": n_rot, "rope_base": base, "window": window}

    def forward(self, tokens, cache: KVCache, all_logits: bool = False):
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, eps = ids.shape[0], c.norm_eps
        x = self._embed(ids, pos)
        plans = self.attn_plans() if n == 1 else None
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attn)):
            moe = self.ffns[il]
            r = k.matmul(moe.router, x)  # the router reads the layer input, before attention and unnormed
            if plans is not None:  # one C call: x += attention, returns rmsnorm(x) * ffn_norm
                m = k.attn_block_decode(plans[il], x[0], p0, cache.k[il], cache.v[il])[None, :]
            else:
                q, kk, v = self._qkv(L, k.rmsnorm(x, L.attn_norm, eps), n)
                k.rope(q, pos, *rope)
                k.rope(kk, pos, *rope)
                self._store_kv(cache, il, p0, kk, v)
                a = k.attention(q, cache.k[il], cache.v[il], p0, window, c.attn_scale)
                x += k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim))
                m = k.rmsnorm(x, L.ffn_norm, eps)
            x += moe(m, None, r)
        cache.n_past = p0 + n
        return self._head(x, all_logits)
