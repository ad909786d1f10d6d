"""KVCache memory: planes are zero, writable, and committed page by page as positions are written (4 KB pages,
so the first token does not make the kernel zero the whole cache; see powerinfer_py/layers/cache.py)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from powerinfer_py.layers.cache import KVCache, lazy_zeros


def test_lazy_zeros_is_a_writable_zero_array():
    a = lazy_zeros((3, 5, 7))
    assert a.shape == (3, 5, 7) and a.dtype == np.float16 and a.flags.writeable and a.flags.c_contiguous
    assert not a.any()
    a[1, 2] = 1.5
    assert a.sum() == 1.5 * 7
    b = lazy_zeros((2, 0, 4))  # an empty plane (conv layers of hybrid caches)
    assert b.shape == (2, 0, 4)
    f = lazy_zeros((4,), np.float32)
    assert f.dtype == np.float32 and not f.any()


def _mapping_kb(addr: int, field: str) -> int:
    """`field` (kB) of the mapping of this process that holds address addr, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.exists("/proc/self/smaps"),
                    reason="reads /proc/self/smaps")
def test_first_token_commits_only_the_pages_it_writes():
    """One position written in every head plane of a 64 MiB layer commits one small page per plane, not the
    layer (np.zeros would take transparent huge pages here and commit 2 MiB per touched page)."""
    n_head, n_ctx, hd = 32, 8192, 128  # 64 MiB per layer in f16
    cache = KVCache(2, n_head, n_ctx, hd)
    k = cache.k[0]
    addr = k.__array_interface__["data"][0]
    assert _mapping_kb(addr, "Rss") == 0
    k[:, 0, :] = 1.0  # the first token's keys: one row at the start of each head's plane
    rss = _mapping_kb(addr, "Rss")
    assert 0 < rss <= n_head * 8, f"{rss} kB resident after writing one position"  # <= 2 pages per plane
    assert _mapping_kb(addr, "AnonHugePages") == 0
    assert not cache.v[0].any() and k[:, 1:].max() == 0
