"""TII Falcon-H1 and Falcon-H1R (GGUF arch "falcon-h1"): every layer runs grouped-query attention AND a Mamba-2
mixer side by side on the same normed input, adds both to the residual, then runs a SwiGLU FFN:

  x = token_embd[ids]
  per layer:
    n = rmsnorm(x) * attn_norm
    a = Wo · attention(rope(Wq·n), rope(Wk·n), Wv·n)     NeoX RoPE over rope.dimension_count (default head_dim),
                                                         scores scaled by 1/sqrt(head_dim) (llama.cpp reads no
                                                         attention.scale for this arch)
    m = mamba2(n)                                        (mamba2_mixer.py; ssm_norm optional: no grouped norm
                                                         without it, as llama.cpp)
    x = x + (a + m)
    x = x + Wdown · (silu(Wgate · f) * (Wup · f))        f = rmsnorm(x) * ffn_norm
  logits = output · (rmsnorm(x) * output_norm)           (output tied to token_embd when absent)

Falcon-H1's muP multipliers (embedding, lm_head, attention in/out, key, ssm in/out, the five zxBCdt blocks of
the in-projection, the two MLP ones) are folded into the weights by llama.cpp's converter: no key carries them,
so the model applies none. The FFN norm is stored without a ".weight" suffix ("blk.N.ffn_norm"), the name
llama.cpp's converter writes and its loader asks for.

The cache is mamba2_cache.Mamba2KVCache with K/V AND conv/SSM states on every layer; like every recurrent cache
it cannot be rewound (truncate keeps all or restarts at 0). Attention and FFN biases (accepted by llama.cpp, in no
Falcon-H1 checkpoint; llama.cpp even ignores attn_output.bias) and the fused attn_qkv are refused rather than run
differently. One-token steps take the Python path (the one-call attention step adds only the attention).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import UnsupportedError
from ..gguf.types import Tensor
from ..layers.cache import Mamba2KVCache
from ..layers.ffn import SparseSettings
from .base import Expected, Model, get_tensor, head_expected, norm_weight
from ..layers.mamba2_mixer import Mamba2Mixer, mamba2_dims, mamba2_expected, mamba2_tensors
from .nemotron_h import mamba2_layout
from .spec import ArchSpec

LAYER_TENSORS = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
                 "wv": "attn_v.weight", "wo": "attn_output.weight"}
FFN_NORM = "ffn_norm"  # no ".weight" (module docstring)
REFUSED = ("attn_qkv.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "ffn_gate.bias",
           "ffn_up.bias", "ffn_down.bias")


def expected_tensors(c: ModelConfig) -> Expected:
    E, hd = c.n_embd, c.head_dim
    q_dim, kv_dim = c.n_head * hd, c.n_head_kv * hd
    e = head_expected(c)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        e.update({p + "attn_norm.weight": ((E,), True), p + "attn_q.weight": ((q_dim, E), True),
                  p + "attn_k.weight": ((kv_dim, E), True), p + "attn_v.weight": ((kv_dim, E), True),
                  p + "attn_output.weight": ((E, q_dim), True), p + FFN_NORM: ((E,), True),
                  p + "ffn_gate.weight": ((c.n_ff, E), True), p + "ffn_up.weight": ((c.n_ff, E), True),
                  p + "ffn_down.weight": ((E, c.n_ff), True)})
        e.update(mamba2_expected(c, p, norm_required=False))
    return e


class FalconH1Model(Mamba2Mixer, Model):
    """The falcon-h1 stack (module docstring): `layers[il]` holds the norms, the attention projections and the
    mixer's tensors; `ffns[il]` the SwiGLU FFN (base.Model builds it)."""

    LAYER_TENSORS = LAYER_TENSORS

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Tensor], kernels,
                 sparse: SparseSettings | None = None):
        refused = [n for n in tensors if n.startswith("blk.") and n.split(".", 2)[2] in REFUSED]
        if refused:
            raise UnsupportedError(f"falcon-h1 files with attention/FFN biases or a fused attn_qkv are not supported "
                                   f"(found {refused[0]!r} and {len(refused) - 1} more)")
        super().__init__(config, tensors, kernels, sparse)
        for il, L in enumerate(self.layers):
            vars(L).update(vars(mamba2_tensors(config, tensors, il, norm_required=False)))
            L.ffn_norm = norm_weight(get_tensor(tensors, f"blk.{il}.{FFN_NORM}"))

    def new_cache(self, n_ctx: int | None = None) -> Mamba2KVCache:
        c = self.config
        H, P, _, N, conv_dim = mamba2_dims(c)
        return Mamba2KVCache((True,) * c.n_layer, c.mamba_layers, c.n_head_kv, n_ctx or c.n_ctx_train, c.head_dim,
                             conv_dim, c.conv_kernel, H, P, N)

    def attn_plans(self) -> None:
        """No one-call attention step (it would add the attention alone to the residual): the Python path."""
        return None

    def forward(self, tokens, cache: Mamba2KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits of tokens (the last, or all rows with all_logits), continuing the cache's K/V and mixer states."""
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        eps = c.norm_eps
        x = self._embed(ids, pos)  # [N, n_embd]
        cache.begin(p0)
        for il, L in enumerate(self.layers):
            h = k.rmsnorm(x, L.attn_norm, eps)
            branches = self._attend(il, L, h, pos, cache, p0)
            branches += self._mamba2(il, L, h, cache, p0)
            x += branches  # (attention + mixer) + residual, llama.cpp's order of adds
            x += self.ffns[il](k.rmsnorm(x, L.ffn_norm, eps), x)
        cache.end(p0 + ids.shape[0])
        return self._head(x, all_logits)


def describe(c: dict) -> list[tuple[str, str]]:
    """Every layer: attention and a mixer side by side, then an FFN."""
    heads = c["ssm_n_v_heads"]
    return [("layer kinds", f"every layer: attention + Mamba-2 mixer in parallel, then SwiGLU FFN (mixers: "
             f"{heads} heads of {c['ssm_d_inner'] // heads}, {c['ssm_n_group']} group(s), state "
             f"{c['ssm_d_state']}, conv over {c['conv_kernel']} tokens)")]


SPEC = ArchSpec("falcon-h1", model=FalconH1Model, expected=expected_tensors, rope_neox=True, layout=mamba2_layout,
                parallel_mixer=True, describe=describe)
