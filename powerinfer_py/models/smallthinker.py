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
The layout (smallthinker_swa below): files without {arch}.attention.sliding_window (or 0) run every layer globally with
RoPE; with it, layers il % P != 0 (P = sliding_window_pattern, default 4) use the window and RoPE base
rope.freq_base_swa, and layers il % 4 == 0 skip RoPE (NoPE). {arch}.expert_weights_scale is ignored, as llama.cpp
ignores it for this arch. There is no shared expert and no dense layer.

ReLU experts are sparse inside: most neurons of a chosen expert output exactly 0. `--sparse exact` skips their
up rows (moe.py); the run's statistics (model.sparsity, `run -v`) count the active neurons of the chosen experts.
One token runs each attention block as one C call (step_attn.c: n_rot 0 on the NoPE layers), same bits as the
Python path.

Metadata keys (config.read with SPEC and read_args; defaults are llama.cpp's):
  smallthinker (PowerInfer's SmallThinker-4B-A0.6B / 21B-A3B) NeoX RoPE over whole heads (rope.dimension_count
          must equal head_dim, as llama.cpp asserts); every layer has experts (expert_feed_forward_length wide,
          ReLU-gated), routed by expert_gating_func (required: 1 softmax, 2 sigmoid) with weights always
          renormalized; {arch}.expert_weights_scale is not read (llama.cpp ignores it for this arch: measured).
          With {arch}.attention.sliding_window > 0 the window is 4096 whatever the key says (llama.cpp
          hard-codes it), layers il % P != 0 attend within it (P = attention.sliding_window_pattern, default 4)
          with RoPE base rope.freq_base_swa (default: the global base), and layers il % 4 == 0 use no RoPE
          (llama.cpp's fixed no-RoPE step; except in 4-layer files, where llama.cpp's step equals n_layer,
          its "RoPE everywhere" value); without the key every layer attends globally with RoPE
"""
from __future__ import annotations

from typing import Mapping

from ..config import ModelConfig
from ..errors import ModelFileError, UnsupportedError
from ..layers.ffn import SparsityStats
from ..layers.cache import KVCache
from ..layers.moe import MoEFFN
from ..gguf.types import Tensor
from .base import Expected, Model, get_tensor, llama_like_expected
from .llama import LAYER_TENSORS
from .spec import ArchSpec

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
                m = k.steps.attn_block_decode(plans[il], x[0], p0, cache.k[il], cache.v[il])[None, :]
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


SMALLTHINKER_WINDOW = 4096  # smallthinker: llama.cpp's fixed window whenever a file has sliding_window > 0
SMALLTHINKER_SWA_PERIOD = 4  # default of {arch}.attention.sliding_window_pattern
SMALLTHINKER_NO_ROPE_STEP = 4  # smallthinker with a window: layers il % 4 == 0 use no RoPE (no key holds it)


def smallthinker_swa(r, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
    """smallthinker's (sliding_window, swa_layers, rope_freq_base_swa) (module docstring)."""
    if r.get("{arch}.attention.sliding_window", 0) <= 0:
        return 0, (False,) * n_layer, rope_freq_base
    period = r.get("{arch}.attention.sliding_window_pattern", SMALLTHINKER_SWA_PERIOD)
    if period < 0:
        raise ModelFileError(f"{r.f.path}: {r.key('{arch}.attention.sliding_window_pattern')} must be "
                             f">= 0, got {period}")
    layers = tuple(period == 0 or il % period != 0 for il in range(n_layer))
    return SMALLTHINKER_WINDOW, layers, r.get("{arch}.rope.freq_base_swa", rope_freq_base, kind=float)


def smallthinker(r, n_layer: int, n_rot: int, head_dim: int) -> dict:
    """smallthinker's routing and RoPE-less layers as ModelConfig fields."""
    if n_rot != head_dim:
        raise UnsupportedError(f"{r.f.path}: smallthinker rotates whole heads; rope.dimension_count {n_rot} "
                               f"!= head_dim {head_dim} is not supported (llama.cpp refuses it too)")
    gating = r.get("{arch}.expert_gating_func", 0)
    if gating not in (1, 2):
        raise UnsupportedError(f"{r.f.path}: {r.key('{arch}.expert_gating_func')} {gating} is not "
                               "supported (1 softmax, 2 sigmoid)")
    # llama.cpp: RoPE unless il % step == 0, where the step is n_layer without a window (RoPE everywhere)
    # and 4 with one; a step equal to n_layer (a 4-layer file) also means RoPE everywhere
    nope = r.get("{arch}.attention.sliding_window", 0) > 0 and n_layer != SMALLTHINKER_NO_ROPE_STEP
    return {"expert_gating": "sigmoid" if gating == 2 else "softmax",
            "no_rope_layers": tuple(nope and il % SMALLTHINKER_NO_ROPE_STEP == 0 for il in range(n_layer))}


def read_args(r, d: dict) -> None:
    d.update(smallthinker(r, d["n_layer"], d["n_rot"], d["head_dim"]))


SPEC = ArchSpec("smallthinker", model=SmallThinkerModel, expected=expected_tensors, rope_neox=True, moe=True,
                moe_norm=True, ffn_variant="reglu", relu_experts=True,
                swa=smallthinker_swa)
