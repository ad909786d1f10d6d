"""DeltaKVCache: the cache of Qwen3.5 (qwen35), whose layers either attend or run a gated delta net.

A delta-net layer's whole memory of the past is two arrays, both f32 as in llama.cpp's recurrent cache:

    the conv state    the inputs of its causal convolution (the q|k|v projections) at the last kernel - 1
                      positions, [kernel - 1, conv_dim]   (the ConvKVCache part, as lfm2's conv state)
    the delta state   per value head the matrix S [d_v, d_k] that maps keys to values, [n_v_heads, d_v, d_k]

A decode token on the C kernels (kernels.delta_net_decode) updates both arrays of a layer in place, so they stay
writable C-contiguous f32 arrays for the cache's lifetime; a prompt goes through delta_state / set_delta_state.

Attention layers keep their K/V as in KVCache, delta-net layers a zero-size K/V placeholder. Both recurrent
states summarize every position so far and cannot be rewound, so the truncation contract is ConvKVCache's:
truncate(n_past) keeps everything, truncate(n < n_past) restarts at 0 (callers such as chat/session.py read
n_past back and prefill again); `begin` refuses a forward that does not start where the states end, and a
forward interrupted half-way leaves states that the next truncate discards.
"""
from __future__ import annotations

import numpy as np

from .conv_cache import ConvKVCache


class DeltaKVCache(ConvKVCache):
    def __init__(self, delta_layers: tuple[bool, ...], n_head_kv: int, n_ctx: int, head_dim: int, conv_dim: int,
                 kernel: int, n_v_heads: int, d_state: int):
        super().__init__(delta_layers, n_head_kv, n_ctx, head_dim, conv_dim, kernel)
        # per delta-net layer f32 [n_v_heads, d_v, d_k] (d_v = d_k = d_state): S maps a key to its value
        self.delta = [np.zeros((n_v_heads, d_state, d_state), dtype=np.float32) if d else None for d in delta_layers]

    def delta_state(self, il: int, p0: int) -> np.ndarray:
        """Layer il's S in a forward that started at p0 (after begin): a fresh zero array at 0, else a copy of the
        stored one (the caller updates it and hands it back through set_delta_state)."""
        return np.zeros_like(self.delta[il]) if p0 == 0 else self.delta[il].copy()

    def set_delta_state(self, il: int, state: np.ndarray) -> None:
        self.delta[il][...] = state

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(s.nbytes for s in self.delta if s is not None)

    def __repr__(self) -> str:
        n_delta = sum(s is not None for s in self.delta)
        return (f"DeltaKVCache(n_layer={len(self.k)}, delta-net layers={n_delta}, n_ctx={self.n_ctx}, "
                f"n_past={self.n_past})")
