"""ConvKVCache: the cache of a hybrid model (lfm2) whose layers either attend or run a short causal convolution.

Attention layers keep their keys and values as in KVCache (f16 [n_head_kv, n_ctx, head_dim] per layer).
Convolution layers keep a recurrent state instead: the conv inputs of the last `kernel - 1` positions, f32
[kernel - 1, n_embd] (the same dtype and size as llama.cpp's conv state), which is all that the next token's
convolution reads. Conv layers get a zero-size K/V placeholder so that `k[il]` and `v[il]` still index by layer.

The state is a summary of every position so far and cannot be rewound: it belongs to exactly one n_past
(`state_pos`). Hence the one difference from KVCache:

    truncate(n) with n < n_past keeps nothing: n_past becomes 0 (the next forward prefills from the start).
                Callers that truncate to reuse a prefix (chat/session.py) read n_past back afterwards.
    truncate(n_past) keeps everything (nothing is forgotten).

Keeping the conv inputs of every position instead (exact truncation) would cost 4 * n_embd bytes per position
and conv layer, several times the K/V of the attention layers, to save a re-prefill only when a conversation
is edited, not when it grows. `begin` checks that the state belongs to the position a forward starts at, so a
cache moved back by assigning n_past directly fails loudly instead of continuing from a wrong state, and marks
the state unusable until `end`: a forward interrupted between two conv layers (Ctrl-C in a chat) leaves a
half-updated state that the next truncate discards.
"""
from __future__ import annotations

import numpy as np

from .errors import PowerInferError
from .kv_cache import KVCache, lazy_zeros


class ConvKVCache(KVCache):
    def __init__(self, conv_layers: tuple[bool, ...], n_head_kv: int, n_ctx: int, head_dim: int, n_embd: int,
                 kernel: int):
        super().__init__(0, n_head_kv, n_ctx, head_dim)
        if kernel < 2:
            raise ValueError(f"a convolution cache needs a kernel of at least 2 tokens, got {kernel}")
        empty = np.zeros((n_head_kv, 0, head_dim), dtype=np.float16)
        shape = (n_head_kv, self.n_ctx, head_dim)
        self.k = [empty if conv else lazy_zeros(shape) for conv in conv_layers]
        self.v = [empty if conv else lazy_zeros(shape) for conv in conv_layers]
        # per conv layer f32 [kernel - 1, n_embd]: the conv inputs at positions state_pos - kernel + 1 .. state_pos - 1
        self.conv = [np.zeros((kernel - 1, n_embd), dtype=np.float32) if conv else None for conv in conv_layers]
        self.state_pos = 0

    def begin(self, p0: int) -> None:
        """Start a forward at position p0 (0: from zeros; else the state must be the one that ended at p0)."""
        if p0 and self.state_pos != p0:
            held = f"position {self.state_pos}" if self.state_pos >= 0 else "an interrupted forward"
            raise PowerInferError(f"the convolution state is for {held}, not {p0}: a cache of a convolution model "
                                  "cannot be moved back (truncate it, which restarts at 0)")
        self.state_pos = -1  # until end(): the states are being overwritten layer by layer

    def end(self, n_past: int) -> None:
        self.n_past = self.state_pos = n_past

    def conv_state(self, il: int, p0: int) -> np.ndarray:
        """Layer il's state in a forward that started at p0 (after begin): zeros at 0, else the stored one."""
        return np.zeros_like(self.conv[il]) if p0 == 0 else self.conv[il]

    def set_conv_state(self, il: int, state: np.ndarray) -> None:
        self.conv[il][...] = state

    def truncate(self, n_past: int) -> None:
        """Keep all positions (n_past unchanged) or none (see the module docstring)."""
        super().truncate(n_past)  # checks the range and sets n_past
        if self.n_past != self.state_pos:
            self.n_past = self.state_pos = 0

    def clear(self) -> None:
        super().clear()
        self.state_pos = 0

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(s.nbytes for s in self.conv if s is not None)

    def __repr__(self) -> str:
        n_conv = sum(s is not None for s in self.conv)
        return f"ConvKVCache(n_layer={len(self.k)}, conv layers={n_conv}, n_ctx={self.n_ctx}, n_past={self.n_past})"
