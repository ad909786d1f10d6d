"""Per-sequence state caches: everything a model keeps between two forward calls, one class per kind of memory.

    KVCache        keys and values of every past position (attention layers)
    ConvKVCache    + the last inputs of a short causal convolution (lfm2)
    DeltaKVCache   + a gated delta net's conv inputs and state matrices (qwen35, qwen3next)
    Mamba2KVCache  + a Mamba-2 mixer's conv inputs and SSM states (nemotron_h, mamba2, granitehybrid, falcon-h1)

The recurrent kinds summarise every position so far and cannot be rewound: ConvKVCache gives the truncation
contract they share.

The K/V planes (KVCache) are allocated by `lazy_zeros`: anonymous memory in ordinary 4 KB pages, zero-filled by the
kernel when first written, so pages of a large context that are never reached cost no memory and no time. Plain
np.zeros asks for transparent huge pages on arrays of 4 MB and more; with one plane per head, the first token then
writes into every 2 MB page of the cache, and the kernel zeroes the whole cache inside the first prompt (measured on
a 7B-layer-shape model, 8 layers, n_ctx 2048, 268 MB of cache: an 8-token prompt took 0.86-1.28 s against
0.24-0.29 s with 4 KB pages; decode at 1500 positions was 41-46 ms per token either way).
"""
from __future__ import annotations

import errno
import mmap

import numpy as np

from ..errors import ContextFullError, PowerInferError


class ContextTooLargeError(PowerInferError):
    """The KV cache of the requested context cannot be reserved (anonymous memory refused)."""


def lazy_zeros(shape, dtype=np.float16) -> np.ndarray:
    """A writable zero array of `shape` whose memory is committed page by page as it is first written (4 KB
    pages: no transparent huge pages, see the module docstring). The array keeps its mapping alive."""
    shape = tuple(int(s) for s in shape)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError) as e:  # ENOMEM: the kernel refuses to reserve it; OverflowError: >= 2**63
        if isinstance(e, OSError) and e.errno != errno.ENOMEM:
            raise
        raise ContextTooLargeError(f"cannot reserve {nbytes / 1e9:.1f} GB ({nbytes} bytes) for a cache plane of "
                                   f"shape {shape}: the context is too long for this machine; choose a smaller "
                                   "-c") from None
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, dtype=dtype, count=count).reshape(shape)


class KVCache:
    """KVCache: the keys and values of every past position, per layer, in f16.

    Layout per layer: k[layer], v[layer] f16 [n_head_kv, n_ctx, head_dim], the layout the attention kernel reads
    (one contiguous [n_ctx, head_dim] plane per KV head). Positions 0..n_past-1 are valid; the model writes the
    K/V of new tokens at n_past.. and then advances n_past.
    """

    def __init__(self, n_layer: int, n_head_kv: int, n_ctx: int, head_dim: int):
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be at least 1, got {n_ctx}")
        self.n_ctx = int(n_ctx)
        self.n_past = 0
        shape = (n_head_kv, self.n_ctx, head_dim)
        try:
            self.k = [lazy_zeros(shape) for _ in range(n_layer)]
            self.v = [lazy_zeros(shape) for _ in range(n_layer)]
        except ContextTooLargeError:
            self.k = self.v = []  # drop the planes reserved so far
            need = 2 * n_layer * n_head_kv * self.n_ctx * head_dim * 2  # K and V, f16
            raise ContextTooLargeError(
                f"a context of {self.n_ctx} tokens (-c / n_ctx) needs {need / 1e9:.1f} GB ({need} bytes) of KV "
                f"cache (f16 keys and values, {n_layer} layers x {n_head_kv} heads x {head_dim}), more memory than "
                "this process can reserve: choose a smaller -c") from None

    def check_room(self, n_new: int) -> None:
        """Raise ContextFullError if n_new more positions do not fit after the n_past already held."""
        if self.n_past + n_new > self.n_ctx:
            raise ContextFullError(
                f"context full: {self.n_past} positions held (n_past) + {n_new} new tokens "
                f"> context size n_ctx = {self.n_ctx}")

    def truncate(self, n_past: int) -> None:
        """Forget every position from n_past on (they will be overwritten by the next forward)."""
        if not 0 <= n_past <= self.n_past:
            raise ValueError(f"cannot truncate to {n_past}: the cache holds {self.n_past} positions")
        self.n_past = int(n_past)

    def clear(self) -> None:
        self.n_past = 0

    @property
    def nbytes(self) -> int:
        """Bytes reserved for the whole context (all layers, K and V)."""
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def __repr__(self) -> str:
        return f"KVCache(n_layer={len(self.k)}, n_ctx={self.n_ctx}, n_past={self.n_past})"


class ConvKVCache(KVCache):
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
        """Keep all positions (n_past unchanged) or none (see the class docstring)."""
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


class DeltaKVCache(ConvKVCache):
    """DeltaKVCache: the cache of Qwen3.5 (qwen35), whose layers either attend or run a gated delta net.

    A delta-net layer's whole memory of the past is two arrays, both f32 as in llama.cpp's recurrent cache:

        the conv state    the inputs of its causal convolution (the q|k|v projections) at the last kernel - 1
                          positions, [kernel - 1, conv_dim]   (the ConvKVCache part, as lfm2's conv state)
        the delta state   per value head the matrix S [d_v, d_k] that maps keys to values, [n_v_heads, d_v, d_k]

    A decode token on the C kernels (kernels.steps.delta_net_decode) updates both arrays of a layer in place, so they stay
    writable C-contiguous f32 arrays for the cache's lifetime; a prompt goes through delta_state / set_delta_state.

    Attention layers keep their K/V as in KVCache, delta-net layers a zero-size K/V placeholder. Both recurrent
    states summarize every position so far and cannot be rewound, so the truncation contract is ConvKVCache's:
    truncate(n_past) keeps everything, truncate(n < n_past) restarts at 0 (callers such as chat/session.py read
    n_past back and prefill again); `begin` refuses a forward that does not start where the states end, and a
    forward interrupted half-way leaves states that the next truncate discards.
    """

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


class Mamba2KVCache(ConvKVCache):
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
