"""pi_axpy_q8t (csrc/axpy_q8t.c): the AXPY over selected rows of a matrix in Q8 tiles (int8 codes, one f32 scale
per 32 x 32 tile; the model-wide mode's layout for quantized sources), against kernels/ref.py's axpy_tiles, on
odd shapes (partial tiles in both directions, column tails of every vector path), and the bits that must hold:
the integer sums make the result independent of the path, so a batch gives each token its one-token bits on
one thread, every thread count repeats itself, and the batch bits do not depend on the thread count."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py.kernels import ref

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

# (n_in, n_cols): partial tiles, column tails below 8, 16, 32, 64 and the 256-column panels, one long row
SHAPES = ((1, 1), (5, 7), (33, 40), (64, 64), (70, 100), (96, 257), (130, 515), (64, 1040), (300, 63))


def tiles(n_in: int, n_cols: int, seed: int) -> ref.Q8Tiles:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_in, n_cols), dtype=np.float32) * rng.uniform(0.1, 3, (n_in, 1)).astype(np.float32)
    return ref.quantize_q8_tiles(w, "w_t")


def selection(n_in: int, n_tok: int, keep: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = np.flatnonzero(rng.random(n_in) < keep).astype(np.int32)
    if rows.size == 0:
        rows = np.array([n_in - 1], np.int32)
    h = rng.standard_normal((n_tok, rows.size), dtype=np.float32) ** 3  # heavy-tailed, like real activations
    h[rng.random(h.shape) < 0.3] = 0.0  # each token's own skipped inputs
    return rows, h


def close_to_ref(w: ref.Q8Tiles, rows, h, y) -> None:
    want = ref.axpy_tiles(w, rows, h)
    scale = np.abs(h).astype(np.float64) @ np.abs(ref.dequantize_q8_tiles(w)[rows]).astype(np.float64) + 1e-30
    err = np.abs(y.astype(np.float64) - want) / scale
    assert err.max() <= 1e-6, f"{w.shape}: max relative error {err.max()}"


def test_quantize_and_dequantize_round_trip():
    w = np.random.default_rng(0).standard_normal((70, 100), dtype=np.float32)
    t = ref.quantize_q8_tiles(w)
    assert t.q.shape == (70, 100) and t.d.shape == (3, 4) and t.q.dtype == np.int8
    assert np.abs(t.q).max() == 127
    err = np.abs(ref.dequantize_q8_tiles(t) - w)
    dd = np.repeat(np.repeat(t.d, 32, 0), 32, 1)[:70, :100]
    assert (err <= dd / 2 * (1 + 1e-5)).all()  # half a step of the tile's scale


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_tok", (1, 2, 5, 7))
def test_against_the_reference(pools, shape, n_tok):
    w = tiles(*shape, seed=shape[0] * 7 + shape[1])
    rows, h = selection(shape[0], n_tok, 0.6, seed=n_tok)
    for k in pools.values():
        close_to_ref(w, rows, h, k.axpy_tiles(w, rows, h))
        close_to_ref(w, rows, h[:1], k.axpy_tiles(w, rows, h[:1]))


@pytest.mark.parametrize("shape", ((130, 515), (300, 1040), (64, 64)))
def test_batch_gives_each_token_its_one_token_bits(pools, shape):
    w = tiles(*shape, seed=3)
    rows, h = selection(shape[0], 9, 0.5, seed=4)
    batch = {n: k.axpy_tiles(w, rows, h) for n, k in pools.items()}
    one = pools[1]
    for t in range(h.shape[0]):
        # the token alone, with only its own kept rows listed: the same integers, the same fma chain
        kept = h[t] != 0
        y1 = one.axpy_tiles(w, rows[kept], np.ascontiguousarray(h[t, kept]))
        assert np.array_equal(y1.view(np.uint32), batch[1][t].view(np.uint32)), f"token {t}"
    for n in (2, 3):
        assert np.array_equal(batch[n].view(np.uint32), batch[1].view(np.uint32)), f"{n} threads"


def test_one_token_codes_equal_the_batch_codes_on_edge_values(pools):
    """Decode quantizes its token on its own path (vectorized where the build has AVX-512): the same codes as a
    batch's on rounding ties, signed zeros, each tile row's maximum (code 127), NaN (code 0, passed over by the
    maximum), and tile rows of every length 1-32."""
    w = tiles(300, 100, seed=9)
    rng = np.random.default_rng(10)
    rows = np.flatnonzero(rng.random(300) < 0.7).astype(np.int32)
    n = rows.size
    h = rng.standard_normal((2, n), dtype=np.float32)
    tile_start = np.flatnonzero(np.r_[True, rows[1:] // 32 != rows[:-1] // 32])
    h[0, tile_start] = 127.0  # each tile row's maximum: dx = 1, so k + 0.5 are rounding ties
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5], np.float32)
    for i, st in enumerate(tile_start[:-1]):
        if st + 1 < n and rows[st + 1] // 32 == rows[st] // 32:
            h[0, st + 1] = ties[i % len(ties)]
    h[0, 5], h[0, 6], h[0, 40] = -0.0, np.nan, -0.0
    h[1, :] = h[0, :] * np.float32(3.0)
    h[1, 7] = np.nan
    batch = pools[1].axpy_tiles(w, rows, h)
    for t in range(2):
        y1 = pools[1].axpy_tiles(w, rows, np.ascontiguousarray(h[t]))
        assert np.array_equal(y1.view(np.uint32), batch[t].view(np.uint32)), f"token {t}"
        # the numpy spec with NaN as 0 (its code), on every thread count's split
        want = ref.axpy_tiles(w, rows, np.nan_to_num(h[t:t + 1], nan=0.0))[0]
        for k in pools.values():
            y = k.axpy_tiles(w, rows, np.ascontiguousarray(h[t]))
            assert np.allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max()), f"token {t}, {k.n_threads} threads"
    # every tile-row length: rows 0 .. L-1 of one tile row, then a token through both paths
    for L in range(1, 33):
        r = np.arange(L, dtype=np.int32)
        hh = rng.standard_normal((2, L), dtype=np.float32)
        b = pools[1].axpy_tiles(w, r, hh)
        for t in range(2):
            assert np.array_equal(pools[1].axpy_tiles(w, r, np.ascontiguousarray(hh[t])).view(np.uint32),
                                  b[t].view(np.uint32)), f"length {L}, token {t}"


def test_decode_repeats_itself_for_a_thread_count(pools):
    w = tiles(1000, 700, seed=5)
    rows, h = selection(1000, 1, 0.7, seed=6)
    for k in pools.values():
        y0 = k.axpy_tiles(w, rows, h[0])
        for _ in range(3):
            assert np.array_equal(k.axpy_tiles(w, rows, h[0]).view(np.uint32), y0.view(np.uint32))
        close_to_ref(w, rows, h[:1], y0[None])


def test_zero_rows_cost_nothing_and_change_nothing(pools):
    w = tiles(200, 300, seed=7)
    rows, h = selection(200, 3, 0.8, seed=8)
    h[:, ::3] = 0.0  # rows no token uses
    k = pools[2]
    y = k.axpy_tiles(w, rows, h)
    live = (h != 0).any(axis=0)
    assert np.array_equal(y.view(np.uint32), k.axpy_tiles(w, rows[live], np.ascontiguousarray(h[:, live])).view(np.uint32))
    assert not k.axpy_tiles(w, rows, np.zeros_like(h)).any()
    assert k.axpy_tiles(w, np.zeros(0, np.int32), np.zeros((2, 0), np.float32)).shape == (2, 300)


def test_bad_arguments_are_refused(pools):
    k = pools[1]
    w = tiles(40, 50, seed=9)
    with pytest.raises(ValueError, match="ascending"):
        k.axpy_tiles(w, np.array([3, 2], np.int32), np.ones(2, np.float32))
    with pytest.raises(IndexError):
        k.axpy_tiles(w, np.array([40], np.int32), np.ones(1, np.float32))
    bad = ref.Q8Tiles("w_t", w.q, w.d[:1])
    with pytest.raises(ValueError, match="scales"):
        k.axpy_tiles(bad, np.array([0], np.int32), np.ones(1, np.float32))
