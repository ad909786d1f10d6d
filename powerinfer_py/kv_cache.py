"""KVCache: the keys and values of every past position, per layer, in f16.

Layout per layer: k[layer], v[layer] f16 [n_head_kv, n_ctx, head_dim], the layout the attention kernel reads
(one contiguous [n_ctx, head_dim] plane per KV head). Positions 0..n_past-1 are valid; the model writes the
K/V of new tokens at n_past.. and then advances n_past.

The planes are allocated by `lazy_zeros`: anonymous memory in ordinary 4 KB pages, zero-filled by the kernel
when first written, so pages of a large context that are never reached cost no memory and no time. Plain
np.zeros asks for transparent huge pages on arrays of 4 MB and more; with one plane per head, the first token
then writes into every 2 MB page of the cache, and the kernel zeroes the whole cache inside the first prompt
(measured on a 7B-layer-shape model, 8 layers, n_ctx 2048, 268 MB of cache: an 8-token prompt took 0.86-1.28 s
against 0.24-0.29 s with 4 KB pages; decode at 1500 positions was 41-46 ms per token either way).
"""
from __future__ import annotations

import errno
import mmap

import numpy as np

from .errors import ContextFullError, PowerInferError


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
