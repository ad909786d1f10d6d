"""Mamba2KVCache: the cache of a Mamba-2 hybrid (nemotron_h), whose layers attend, run a Mamba-2 mixer, or
only run an FFN (and keep nothing); a falcon-h1 layer attends AND mixes, and keeps both.

A mixer layer's whole memory of the past is two f32 arrays, as in llama.cpp's recurrent cache:

    the conv state   the conv inputs (x|B|C of the in-projection) at the last kernel - 1 positions,
                     [kernel - 1, d_inner + 2 n_group d_state]   (the ConvKVCache part)
    the SSM state    per head the matrix h [head_dim, d_state] that the scan decays and writes,
                     [n_heads, head_dim, d_state]

Attention layers keep K/V as KVCache does; mixer and FFN layers a zero-size K/V placeholder. The recurrent
states summarize every position so far and cannot be rewound, so the truncation contract is ConvKVCache's:
truncate(n_past) keeps everything, truncate(n < n_past) restarts at 0 (chat/session.py reads n_past back and
prefills again); `begin` refuses a forward that does not start where the states end, and a forward interrupted
half-way leaves states that the next truncate discards.
"""
from __future__ import annotations

import numpy as np

from .conv_cache import ConvKVCache


class Mamba2KVCache(ConvKVCache):
    def __init__(self, attn_layers: tuple[bool, ...], mamba_layers: tuple[bool, ...], n_head_kv: int, n_ctx: int,
                 head_dim: int, conv_dim: int, kernel: int, n_heads: int, ssm_head_dim: int, d_state: int):
        super().__init__(tuple(not a for a in attn_layers), n_head_kv, n_ctx, head_dim, conv_dim, kernel)
        # a conv state on every mixer layer (falcon-h1's layers also attend) and none elsewhere (FFN-only layers)
        self.conv = [np.zeros((kernel - 1, conv_dim), dtype=np.float32) if m else None for m in mamba_layers]
        self.ssm = [np.zeros((n_heads, ssm_head_dim, d_state), dtype=np.float32) if m else None
                    for m in mamba_layers]

    def ssm_state(self, il: int, p0: int) -> np.ndarray:
        """Layer il's SSM state in a forward that started at p0 (after begin), the stored array itself (zeroed at
        p0 = 0): the scan updates it in place. No copy: on Nemotron-H 4B it is 3.5 MB per mixer layer and token."""
        if p0 == 0:
            self.ssm[il].fill(0.0)
        return self.ssm[il]

    def set_ssm_state(self, il: int, state: np.ndarray) -> None:
        """Store a state the caller computed elsewhere (nothing to do for the array ssm_state handed out)."""
        if state is not self.ssm[il]:
            self.ssm[il][...] = state

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(s.nbytes for s in self.ssm if s is not None)

    def __repr__(self) -> str:
        n_mix = sum(s is not None for s in self.ssm)
        return (f"Mamba2KVCache(n_layer={len(self.k)}, mixer layers={n_mix}, n_ctx={self.n_ctx}, "
                f"n_past={self.n_past})")
