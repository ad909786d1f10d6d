"""Sparse FFN kernels (csrc/axpy.c): AXPY over ffn_down_t rows and active-neuron selection, against
kernels/ref.py, a dense product, and themselves across thread counts and repeated runs."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py.errors import UnsupportedError
from powerinfer_py.kernels import ref, ref_iq
from powerinfer_py.gguf.types import KERNEL_TYPES, GGMLType, Tensor, row_bytes

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
EPS32 = 2.0 ** -24  # f32 unit roundoff
IQ_TYPES = (GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ1_S,
            GGMLType.IQ1_M)
K_TYPES = tuple(t for t in KERNEL_TYPES if t.name.endswith("_K") or t in (GGMLType.IQ4_XS,) + IQ_TYPES)  # 256-element super-blocks
RANDOM_TYPES = K_TYPES + (GGMLType.IQ4_NL, GGMLType.MXFP4)  # computed on, not produced by quantize(): random bytes


# byte offsets of the f16 scales in a K-quant block: random bytes elsewhere make a valid block
K_F16_FIELDS = {GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),
                GGMLType.Q2_K: (80, 82),
                GGMLType.Q3_K: (108,),
                GGMLType.IQ4_XS: (0,),
                **{t: (0,) for t in IQ_TYPES},  # f16 d first; any grid index, sign and scale bytes are valid
                GGMLType.IQ1_M: (),  # its f16 d: the scale words' top nibbles (set below)
                }
K_F16_FIELDS[GGMLType.IQ4_NL] = (0,)  # its one f16 d: random bytes after it are a valid IQ4_NL block too
K_F16_FIELDS[GGMLType.MXFP4] = ()  # byte 0 is an E8M0 exponent (set below), the rest any nibbles


def make_weight(ggml_type, n_rows, n_cols, seed=0, name="ffn_down_t") -> Tensor:
    rng = np.random.default_rng(seed)
    if ggml_type in RANDOM_TYPES:  # not produced by quantize(): random bytes with finite scales
        bs = 256 if ggml_type in K_TYPES else 32
        size = row_bytes(ggml_type, bs)
        b = rng.integers(0, 256, (n_rows * n_cols // bs, size), dtype=np.uint8)
        for off in K_F16_FIELDS[ggml_type]:
            b[:, off:off + 2] = rng.uniform(0.001, 0.02, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        if ggml_type == GGMLType.MXFP4:  # scales 2^(e - 127) of 2^-9 .. 2^-4, as the f16 scales above
            b[:, 0] = rng.integers(118, 124, len(b))
        if ggml_type == GGMLType.IQ1_M:
            ref_iq.put_iq1m_d(b, rng.uniform(0.001, 0.02, len(b)))
        return Tensor(name, ggml_type, (n_rows, n_cols), b.reshape(n_rows, -1))
    w = rng.standard_normal((n_rows, n_cols), dtype=np.float32)
    return Tensor(name, ggml_type, (n_rows, n_cols), ref.quantize(w, ggml_type))


def make_h(rng, n_tok, n_sel, zero_frac=0.3) -> np.ndarray:
    """ReLU-like activations with exact zeros (some columns zero for every token)."""
    h = rng.standard_normal((n_tok, n_sel), dtype=np.float32)
    h[rng.random((n_tok, n_sel)) < zero_frac] = 0.0
    if n_sel > 2:
        h[:, ::3] = 0.0
    return h


def bound(w: Tensor, rows, h) -> np.ndarray:
    """f32 accumulation error bound: (chain length + 2) * eps * sum |h| |w| (the chain is one fma per row,
    plus the rounding of h * d for block types)."""
    wd = np.abs(ref.dequantize(w).astype(np.float64))[rows]
    return (len(rows) + 2) * EPS32 * (np.abs(h.astype(np.float64)) @ wd) + 1e-30


def check(k, w, rows, h):
    y = k.axpy_rows(w, rows, h)
    yr = ref.axpy_rows(w, rows, h)
    assert y.shape == yr.shape and y.dtype == np.float32
    err = np.abs(y.astype(np.float64) - yr)
    b = bound(w, rows, np.atleast_2d(h)).reshape(err.shape)
    assert (err <= b).all(), f"{w.type.name} {w.shape} n_sel {len(rows)}: max err {err.max()}, at {np.argmax(err - b)}"
    return y




def shapes(ggml_type):
    """(n_rows, n_cols): odd row counts up to a full n_ff, column counts every type can hold."""
    cols = (256, 768, 4096) if ggml_type in K_TYPES else (32, 96, 4096)
    out = [(r, c) for r in (1, 7, 33, 11008) for c in cols if r * c <= 11008 * 96 or r < 100]
    return out + ([(9, 33), (40, 1000), (5, 17)] if ggml_type in FLOAT_TYPES else [])


@pytest.mark.parametrize("ggml_type", KERNEL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 5])
def test_axpy_matches_ref(pools, ggml_type, n_tok):
    rng = np.random.default_rng(n_tok)
    for n_rows, n_cols in shapes(ggml_type):
        w = make_weight(ggml_type, n_rows, n_cols, seed=n_rows + n_cols)
        for frac in (0.0, 0.1, 0.5, 1.0):  # empty, sparse, half, full active lists
            n_sel = int(round(frac * n_rows))
            rows = np.sort(rng.choice(n_rows, size=n_sel, replace=False)).astype(np.int32)
            h = make_h(rng, n_tok, n_sel)
            y1 = check(pools[1], w, rows, h)
            for n in (2, 3):
                if n_tok > 1:  # batches: one column slice per thread, any thread count gives the same bits
                    np.testing.assert_array_equal(pools[n].axpy_rows(w, rows, h), y1)
                else:  # decode: parts of the row list summed in a fixed order, within the same error bound
                    check(pools[n], w, rows, h)
            if n_tok > 1:  # the batched path equals one token at a time (one thread: one part), bit for bit
                for t in (0, n_tok - 1):
                    np.testing.assert_array_equal(pools[1].axpy_rows(w, rows, h[t]), y1[t])


@pytest.mark.parametrize("ggml_type", KERNEL_TYPES, ids=lambda t: t.name)
def test_axpy_full_list_equals_dense_product(pools, ggml_type):
    """All rows active: the AXPY over ffn_down_t equals the dense product with its transpose (ffn_down)."""
    rng = np.random.default_rng(3)
    n_ff, n_embd = 300, 512
    w = make_weight(ggml_type, n_ff, n_embd, seed=9)
    wd = ref.dequantize(w)
    down = Tensor("ffn_down", GGMLType.F32, (n_embd, n_ff), np.ascontiguousarray(wd.T))
    h = rng.standard_normal((4, n_ff), dtype=np.float32)
    y = pools[2].axpy_rows(w, np.arange(n_ff, dtype=np.int32), h)
    dense = pools[2].matmul(down, ref.operand(w, h))  # BF16 rows multiply h rounded to bf16
    tol = (n_ff + 16) * EPS32 * (np.abs(h.astype(np.float64)) @ np.abs(wd.astype(np.float64)))
    assert (np.abs(y.astype(np.float64) - dense) <= tol).all()


@pytest.mark.parametrize("ggml_type", (GGMLType.F32, GGMLType.Q8_0), ids=lambda t: t.name)
def test_axpy_exact_integer_arithmetic(pools, ggml_type):
    """Small integers (and a power-of-two block scale): every product and sum is exact, so C equals the
    reference bit for bit."""
    rng = np.random.default_rng(4)
    wv = rng.integers(-127, 128, size=(50, 128)).astype(np.float32)
    wv[:, ::32] = 127  # Q8_0: d = 1 in every block
    w = Tensor("w", ggml_type, wv.shape, ref.quantize(wv, ggml_type))
    np.testing.assert_array_equal(ref.dequantize(w), wv)
    rows = np.arange(0, 50, 2, dtype=np.int32)
    h = rng.integers(-8, 9, size=(3, len(rows))).astype(np.float32)
    np.testing.assert_array_equal(pools[2].axpy_rows(w, rows, h), h @ wv[rows])


def test_axpy_zero_rows_are_not_read(pools):
    """Rows whose h is zero for every token take no part: NaN weights there do not reach y, and removing
    them from the list gives the same bits (what makes `exact` mode equal the dense AXPY)."""
    rng = np.random.default_rng(5)
    wv = rng.standard_normal((64, 96), dtype=np.float32)
    wv[10] = np.nan
    w = Tensor("w", GGMLType.F32, wv.shape, wv)
    rows = np.arange(64, dtype=np.int32)
    h = make_h(rng, 2, 64)
    h[:, 10] = 0.0
    y = pools[2].axpy_rows(w, rows, h)
    assert np.isfinite(y).all()
    keep = (h != 0).any(axis=0)
    np.testing.assert_array_equal(pools[1].axpy_rows(w, rows[keep], np.ascontiguousarray(h[:, keep])), y)
    np.testing.assert_array_equal(pools[2].axpy_rows(w, rows[:0], h[:, :0]), np.zeros((2, 96), np.float32))


def test_axpy_deterministic(pools):
    rng = np.random.default_rng(6)
    w = make_weight(GGMLType.Q4_0, 2000, 4096, seed=6)
    rows = np.sort(rng.choice(2000, size=700, replace=False)).astype(np.int32)
    for n_tok in (1, 5):
        h = make_h(rng, n_tok, 700)
        for n in (2, 3):
            first = pools[n].axpy_rows(w, rows, h)
            for _ in range(5):
                np.testing.assert_array_equal(pools[n].axpy_rows(w, rows, h), first)


@pytest.mark.parametrize("ggml_type", (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_1,
                                       GGMLType.IQ4_NL, GGMLType.MXFP4), ids=lambda t: t.name)
def test_axpy_decode_split_ignores_zero_rows(pools, ggml_type):
    """Decode splits the list of live rows (non-zero h) among threads: the full list with zeros (`off`) and
    the live rows alone (`exact`) give the same bits for every thread count, and the parts sum to the
    one-thread result within rounding."""
    rng = np.random.default_rng(8)
    w = make_weight(ggml_type, 1500, 512, seed=8)
    rows = np.arange(1500, dtype=np.int32)
    h = make_h(rng, 1, 1500, zero_frac=0.8)[0]
    live = h != 0
    one = pools[1].axpy_rows(w, rows, h)
    for n in (1, 2, 3):
        y = pools[n].axpy_rows(w, rows, h)
        np.testing.assert_array_equal(pools[n].axpy_rows(w, rows[live], np.ascontiguousarray(h[live])), y)
        tol = (live.sum() + 2) * EPS32 * (np.abs(h.astype(np.float64)) @ np.abs(ref.dequantize(w).astype(np.float64)))
        assert (np.abs(y.astype(np.float64) - one) <= tol).all()


def test_axpy_bad_input(pools):
    k = pools[2]
    w = make_weight(GGMLType.F16, 10, 64)
    h3 = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="ascending"):
        k.axpy_rows(w, np.array([2, 1, 5], np.int32), h3)
    with pytest.raises(ValueError, match="ascending"):
        k.axpy_rows(w, np.array([1, 1, 5], np.int32), h3)
    with pytest.raises(IndexError):
        k.axpy_rows(w, np.array([1, 2, 10], np.int32), h3)
    with pytest.raises(IndexError):
        k.axpy_rows(w, np.array([-1, 2, 3], np.int32), h3)
    with pytest.raises(ValueError, match="ascending"):  # a wide integer must not wrap into range
        k.axpy_rows(w, np.array([1, 2**32 + 2, 7], np.int64), h3)
    with pytest.raises(ValueError, match="integer"):
        k.axpy_rows(w, np.array([1.0, 2.0, 3.0]), h3)
    with pytest.raises(ValueError, match="shape"):
        k.axpy_rows(w, np.array([1, 2], np.int32), h3)
    with pytest.raises(ValueError, match="float32"):
        k.axpy_rows(w, np.array([1, 2, 3], np.int32), np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        k.axpy_rows(w, np.array([1, 2, 3], np.int32), np.ones((1, 1, 3), np.float32))
    bad = Tensor("ffn_down_t", GGMLType.Q4_0, (4, 64), np.zeros((4, 10), np.uint8))
    with pytest.raises(ValueError, match="ffn_down_t"):
        k.axpy_rows(bad, np.array([0], np.int32), np.ones(1, np.float32))
    q = Tensor("ffn_down_t", GGMLType.TQ2_0, (4, 256), np.zeros((4, 66), np.uint8))
    with pytest.raises(UnsupportedError):
        k.axpy_rows(q, np.array([0], np.int32), np.ones(1, np.float32))
    for impl in (k, ref):
        with pytest.raises(ValueError, match="ascending"):
            impl.axpy_rows(w, np.array([3, 2], np.int32), np.ones(2, np.float32))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 100, 11008])
def test_select(pools, n):
    rng = np.random.default_rng(n)
    logits = rng.standard_normal(n, dtype=np.float32)
    if n > 20:
        logits[5] = np.nan
        logits[7] = 0.25  # exactly at the threshold: active
        logits[9] = np.nextafter(np.float32(0.25), np.float32(0))
    for k in (pools[1], pools[2]):
        for th in (0.25, -np.inf, np.inf, 0.0):
            got = k.select_active(logits, th)
            want = ref.select_active(logits, th)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(want, [i for i in range(n) if logits[i] >= np.float32(th)])
        x = np.maximum(logits, 0)
        if n > 20:
            x[11] = -0.0
            x[13] = np.nan
        np.testing.assert_array_equal(k.select_nonzero(x), ref.select_nonzero(x))
        np.testing.assert_array_equal(ref.select_nonzero(x), [i for i in range(n) if x[i] != 0 or x[i] != x[i]])


def test_select_bad_input(pools):
    for impl in (pools[2], ref):
        with pytest.raises(ValueError, match="float32"):
            impl.select_active(np.zeros(4), 0.0)
        with pytest.raises(ValueError, match="1-D"):
            impl.select_active(np.zeros((2, 4), np.float32), 0.0)
        with pytest.raises(ValueError, match="NaN"):
            impl.select_active(np.zeros(4, np.float32), float("nan"))
        with pytest.raises(ValueError, match="float32"):
            impl.select_nonzero([1.0, 0.0])
