"""C kernels for norms, rope, softmax, attention and activations against the numpy spec (kernels/ref.py), and
rope/attention against independent formulations (complex rotation, a plain Python loop).

Shapes are odd on purpose (vector tails, single elements, GQA groups); threads 1 and 2 must give bit-identical
results (every output element is computed by one thread in a fixed order), and so must repeated runs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from powerinfer_py.kernels import ref
from powerinfer_py.kernels.cpu import CpuKernels

DIMS = [1, 7, 33, 256, 4095]


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def kern(request):
    k = CpuKernels(request.param)
    yield k
    k.close()


@pytest.fixture(scope="module")
def k12():
    k1, k2 = CpuKernels(1), CpuKernels(2)
    yield k1, k2
    k1.close()
    k2.close()


def rand(rng, shape, scale=1.0, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def close(a, r, rtol, atol):
    assert a.dtype == np.float32 and a.shape == r.shape
    np.testing.assert_allclose(a, r, rtol=rtol, atol=atol)


# ---- norms ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("n_tok", [1, 5])
def test_rmsnorm(kern, dim, n_tok):
    rng = np.random.default_rng(dim * 10 + n_tok)
    x, w = rand(rng, (n_tok, dim), 3.0), rand(rng, dim)
    close(kern.rmsnorm(x, w, 1e-6), ref.rmsnorm(x, w, 1e-6), 2e-6, 1e-6)
    close(kern.rmsnorm(x, None, 1e-5), ref.rmsnorm(x, None, 1e-5), 2e-6, 1e-6)
    # per-head norms of [N, H, D] and a 1-D row
    xh = rand(rng, (n_tok, 3, dim))
    close(kern.rmsnorm(xh, w, 1e-6), ref.rmsnorm(xh, w, 1e-6), 2e-6, 1e-6)
    close(kern.rmsnorm(x[0], w, 1e-6), ref.rmsnorm(x[0], w, 1e-6), 2e-6, 1e-6)


def test_rmsnorm_formula(kern):
    """Independent of ref: a row of 2s with eps 0 normalises to 1s; eps enters under the root."""
    x = np.full((2, 40), 2.0, dtype=np.float32)
    np.testing.assert_allclose(kern.rmsnorm(x, None, 0.0), 1.0, rtol=1e-6)
    np.testing.assert_allclose(kern.rmsnorm(x, None, 12.0), 0.5, rtol=1e-6)  # 2 / sqrt(4 + 12)


@pytest.mark.parametrize("dim", DIMS)
def test_layernorm(kern, dim):
    rng = np.random.default_rng(dim)
    x, w, b = rand(rng, (5, dim), 2.0) + 3.0, rand(rng, dim), rand(rng, dim)
    close(kern.layernorm(x, w, b, 1e-5), ref.layernorm(x, w, b, 1e-5), 1e-5, 1e-5)
    close(kern.layernorm(x, None, None, 1e-5), ref.layernorm(x, None, None, 1e-5), 1e-5, 1e-5)
    close(kern.layernorm(x, w, None, 1e-5), ref.layernorm(x, w, None, 1e-5), 1e-5, 1e-5)


def test_norm_aliasing_safe_inputs_untouched(kern):
    rng = np.random.default_rng(1)
    x = rand(rng, (4, 33))
    keep = x.copy()
    kern.rmsnorm(x, None, 1e-6)
    kern.layernorm(x, None, None, 1e-6)
    np.testing.assert_array_equal(x, keep)


# ---- rope -----------------------------------------------------------------------------------------------

def rope_complex(x, pos, n_rot, base, scale, neox):
    """Rotation as complex multiplication: an independent formulation of the same map."""
    x = x.astype(np.float64).copy()
    half = n_rot // 2
    freqs = np.array([scale * base ** (-2.0 * i / n_rot) for i in range(half)])
    rot = np.exp(1j * np.outer(pos, freqs))[:, None, :]  # [N, 1, half]
    if neox:
        z = (x[..., :half] + 1j * x[..., half:n_rot]) * rot
        x[..., :half], x[..., half:n_rot] = z.real, z.imag
    else:
        z = (x[..., 0:n_rot:2] + 1j * x[..., 1:n_rot:2]) * rot
        x[..., 0:n_rot:2], x[..., 1:n_rot:2] = z.real, z.imag
    return x.astype(np.float32)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_tok,n_head,head_dim,n_rot", [(1, 4, 256, 256), (5, 3, 64, 48), (17, 2, 34, 34),
                                                         (2, 1, 8, 2), (3, 8, 128, 64), (64, 4, 128, 128)])
def test_rope(kern, neox, n_tok, n_head, head_dim, n_rot):
    rng = np.random.default_rng(n_tok * 100 + head_dim)
    x = rand(rng, (n_tok, n_head, head_dim))
    pos = rng.integers(0, 5000, n_tok).astype(np.int32)
    args = (n_rot, 10000.0, 0.25, neox)
    got = kern.rope(x.copy(), pos, *args)
    close(got, ref.rope(x.copy(), pos, *args), 1e-5, 2e-6)
    close(got, rope_complex(x, pos, *args), 1e-5, 2e-6)
    np.testing.assert_array_equal(got[..., n_rot:], x[..., n_rot:])  # dims past n_rot untouched


def test_rope_in_place_and_far_positions(kern):
    """In place (the same array comes back), and accurate at positions far beyond where a float angle drifts."""
    rng = np.random.default_rng(7)
    x = rand(rng, (3, 2, 64))
    pos = np.array([0, 123_457, 1_000_003], dtype=np.int32)
    want = rope_complex(x, pos, 64, 1_000_000.0, 1.0, True)
    out = kern.rope(x, pos, 64, 1_000_000.0, 1.0, True)
    assert out is x
    close(x, want, 1e-5, 5e-6)
    np.testing.assert_array_equal(x[0], want[0])  # position 0 is the identity


def test_rope_pos_int64_converted(kern):
    rng = np.random.default_rng(8)
    x = rand(rng, (4, 2, 16))
    a = kern.rope(x.copy(), np.arange(10, 14, dtype=np.int64), 16, 10000.0, 1.0, False)
    b = kern.rope(x.copy(), np.arange(10, 14, dtype=np.int32), 16, 10000.0, 1.0, False)
    np.testing.assert_array_equal(a, b)


# ---- softmax --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", DIMS)
def test_softmax(kern, dim):
    rng = np.random.default_rng(dim)
    x = rand(rng, (6, dim), 5.0)
    want = ref.softmax(x.copy())
    got = kern.softmax(x)
    assert got is x
    close(got, want, 2e-6, 1e-9)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


def test_softmax_extremes(kern):
    """Huge values (needs the max subtraction), -inf entries (masked: weight 0), and the full exp range:
    the row [0, t] has weights 1/(1 + e^t) and e^t/(1 + e^t) for t across underflow and overflow."""
    x = np.array([[1000.0, 1000.0, -np.inf, 999.0]], dtype=np.float32)
    got = kern.softmax(x)
    e = math.exp(-1.0)
    np.testing.assert_allclose(got[0], [1 / (2 + e), 1 / (2 + e), 0.0, e / (2 + e)], rtol=1e-6)
    t = np.linspace(-110.0, 110.0, 2201).astype(np.float32).astype(np.float64)  # exactly the inputs given
    rows = np.stack([np.zeros_like(t), t], axis=1).astype(np.float32)
    got = kern.softmax(rows.copy())
    want = np.stack([1 / (1 + np.exp(t)), 1 / (1 + np.exp(-t))], axis=1)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-37)
    assert np.all(np.isfinite(got))


# ---- attention ------------------------------------------------------------------------------------------

def attention_loop(q, k, v, pos0, window, scale):
    """Plain-Python attention: explicit visibility test, scores, softmax and weighted sum per (token, head)."""
    n_tok, n_head, head_dim = q.shape
    n_head_kv = k.shape[0]
    out = np.zeros(q.shape, dtype=np.float64)
    for t in range(n_tok):
        p = pos0 + t
        for h in range(n_head):
            kvh = h * n_head_kv // n_head
            visible = [j for j in range(k.shape[1]) if j <= p and (window == 0 or p - j < window)]
            s = [scale * sum(float(q[t, h, d]) * float(k[kvh, j, d]) for d in range(head_dim)) for j in visible]
            m = max(s)
            w = [math.exp(x - m) for x in s]
            total = sum(w)
            for wj, j in zip(w, visible):
                out[t, h] += wj / total * v[kvh, j].astype(np.float64)
    return out.astype(np.float32)


def make_qkv(rng, n_tok, n_head, n_head_kv, head_dim, n_ctx):
    q = rand(rng, (n_tok, n_head, head_dim))
    k = rand(rng, (n_head_kv, n_ctx, head_dim), dtype=np.float16)
    v = rand(rng, (n_head_kv, n_ctx, head_dim), dtype=np.float16)
    return q, k, v


@pytest.mark.parametrize("n_head,n_head_kv", [(1, 1), (2, 1), (3, 3), (4, 1), (4, 2), (8, 2), (8, 4), (6, 3)])
@pytest.mark.parametrize("n_tok,pos0,window", [(1, 0, 0), (1, 40, 0), (5, 9, 0), (5, 9, 3), (17, 4, 6),
                                               (17, 30, 1)])
@pytest.mark.parametrize("head_dim", [16, 33, 64])
def test_attention(kern, n_head, n_head_kv, n_tok, pos0, window, head_dim):
    rng = np.random.default_rng(n_head * 1000 + n_tok * 10 + head_dim)
    n_ctx = pos0 + n_tok + 3  # unfilled tail of the cache must be ignored: make it loud
    q, k, v = make_qkv(rng, n_tok, n_head, n_head_kv, head_dim, n_ctx)
    k[:, pos0 + n_tok:] = 1000.0
    v[:, pos0 + n_tok:] = np.nan
    scale = head_dim ** -0.5
    close(kern.attention(q, k, v, pos0, window, scale), ref.attention(q, k, v, pos0, window, scale), 1e-5, 2e-6)


@pytest.mark.parametrize("n_head,n_head_kv,head_dim,window", [(4, 2, 8, 0), (2, 1, 5, 2), (3, 1, 16, 3)])
def test_attention_vs_loop(kern, n_head, n_head_kv, head_dim, window):
    rng = np.random.default_rng(head_dim)
    q, k, v = make_qkv(rng, 3, n_head, n_head_kv, head_dim, 9)
    got = kern.attention(q, k, v, 4, window, 0.3)
    close(got, attention_loop(q, k, v, 4, window, 0.3), 1e-5, 2e-6)


@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(4, 1, 256), (4, 4, 64), (5, 5, 128), (6, 3, 64),
                                                       (2, 1, 33)])
def test_attention_batch_equals_decode_steps(kern, n_head, n_head_kv, head_dim):
    """A prefill of N tokens gives, bit for bit, what N single-token decode calls give: without a window, a
    prefill item holds up to 4 query rows of several tokens (attention.c attn_rows), 9 tokens leave a short last
    item, and the rows' visible lengths differ within an item."""
    rng = np.random.default_rng(3)
    q, k, v = make_qkv(rng, 9, n_head, n_head_kv, head_dim, 64)
    for pos0, window in ((20, 0), (0, 0), (20, 4), (20, 29), (20, 28)):  # windows: cutting no past / one token's
        batch = kern.attention(q, k, v, pos0, window, 0.0625)
        for t in range(9):
            one = kern.attention(q[t:t + 1].copy(), k, v, pos0 + t, window, 0.0625)[0]
            np.testing.assert_array_equal(one, batch[t])


def test_attention_long_context(kern):
    """Decode at the end of a long cache (gemma shape: 4 heads, 1 kv head, head_dim 256), global and windowed."""
    rng = np.random.default_rng(4)
    q, k, v = make_qkv(rng, 1, 4, 1, 256, 1500)
    q *= 4.0  # peaky scores
    for window in (0, 512):
        # f32 sums over 256 dims and 1500 rows: a few 1e-6 of rounding in the scalar (PI_NATIVE=0) build
        close(kern.attention(q, k, v, 1499, window, 0.0625), ref.attention(q, k, v, 1499, window, 0.0625), 1e-5, 1e-5)


# ---- activations ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", DIMS + [40_000])
@pytest.mark.parametrize("op", ["relu", "silu", "gelu"])
def test_unary(kern, op, n):
    rng = np.random.default_rng(n)
    x = rand(rng, n, 4.0)
    close(getattr(kern, op)(x), getattr(ref, op)(x), 3e-6, 1e-7)
    x2 = rand(rng, (3, 5, 7))
    close(getattr(kern, op)(x2), getattr(ref, op)(x2), 3e-6, 1e-7)


@pytest.mark.parametrize("n", DIMS + [40_000])
@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_gated(kern, op, n):
    rng = np.random.default_rng(n + 1)
    g, u = rand(rng, n, 4.0), rand(rng, n)
    close(getattr(kern, op)(g, u), getattr(ref, op)(g, u), 3e-6, 1e-7)


def test_activation_formulas_and_extremes(kern):
    """Against closed forms at chosen points, including where exp over/underflows."""
    x = np.array([-1e4, -100.0, -30.0, -1.0, -0.0, 0.0, 1e-20, 0.5, 3.0, 30.0, 100.0, 1e4], dtype=np.float32)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        silu = x64 / (1 + np.exp(-x64))
        gelu = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    np.testing.assert_allclose(kern.silu(x), silu, rtol=2e-6, atol=1e-30)
    # gelu as llama.cpp computes it: within f16 precision of the closed form, 0 at and below -10, x from 10 on
    np.testing.assert_allclose(kern.gelu(x), gelu, rtol=1.5e-3, atol=1e-7)
    np.testing.assert_array_equal(kern.gelu(x)[[0, 1, 2, 9, 10, 11]], [0, 0, 0, 30, 100, 1e4])
    np.testing.assert_array_equal(kern.relu(x), np.maximum(x, 0))
    u = np.full_like(x, -2.0)
    np.testing.assert_allclose(kern.swiglu(x, u), -2 * silu, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(kern.geglu(x, u), -2 * gelu, rtol=1.5e-3, atol=2e-7)
    assert np.isnan(kern.silu(np.array([np.nan], dtype=np.float32)))[0]
    assert np.isnan(kern.gelu(np.array([np.nan], dtype=np.float32)))[0]


def test_gelu_is_bit_exact_with_its_f16_specification(kern):
    """Every f16 input value, the +-10 cut-offs and values between f16 steps: the C kernel equals ref.gelu bit
    for bit (the table is built in double precision, as the spec computes it)."""
    every_f16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    rng = np.random.default_rng(7)
    x = np.concatenate([every_f16, np.float32([-10, -9.999, 9.999, 10, 10.001]), rand(rng, 10_001, 4.0)])
    x = x[~np.isnan(x)]
    np.testing.assert_array_equal(kern.gelu(x).view(np.uint32), ref.gelu(x).view(np.uint32))
    u = rand(rng, x.size)
    np.testing.assert_array_equal(kern.geglu(x, u).view(np.uint32), ref.geglu(x, u).view(np.uint32))


def test_exp_accuracy_sweep(kern):
    """The vector exp behind silu and softmax stays within ~1e-6 relative over a dense sweep (f32 inputs,
    float64 spec); gelu, a table lookup, is exact."""
    x = np.linspace(-30.0, 30.0, 60_001).astype(np.float32)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(kern.silu(x), ref.silu(x64), rtol=1e-6, atol=1e-12)
    np.testing.assert_array_equal(kern.gelu(x), ref.gelu(x64))  # a table lookup: exact (see above)
    rows = np.stack([np.zeros_like(x), x * 2.5], axis=1)
    t = rows[:, 1].astype(np.float64)
    want = np.stack([1 / (1 + np.exp(t)), 1 / (1 + np.exp(-t))], axis=1)
    np.testing.assert_allclose(kern.softmax(rows), want, rtol=1e-6, atol=1e-37)


# ---- threads and determinism ----------------------------------------------------------------------------

def test_threads_bit_identical_and_repeatable(k12):
    """Shapes large enough for the parallel paths: 1 and 2 threads agree bit for bit, and reruns do too."""
    k1, k2 = k12
    rng = np.random.default_rng(11)
    x, w, b = rand(rng, (64, 1100)), rand(rng, 1100), rand(rng, 1100)
    g, u = rand(rng, 70_001, 3.0), rand(rng, 70_001)
    xr, pos = rand(rng, (64, 4, 128)), np.arange(100, 164, dtype=np.int32)
    q, kc, vc = make_qkv(rng, 17, 8, 2, 64, 80)
    calls = [
        lambda K: K.rmsnorm(x, w, 1e-6), lambda K: K.layernorm(x, w, b, 1e-5),
        lambda K: K.softmax(x.copy()), lambda K: K.rope(xr.copy(), pos, 96, 10000.0, 1.0, True),
        lambda K: K.rope(xr.copy(), pos, 128, 10000.0, 1.0, False),
        lambda K: K.attention(q, kc, vc, 50, 0, 0.125), lambda K: K.attention(q, kc, vc, 50, 20, 0.125),
        lambda K: K.attention(q[:1].copy(), kc, vc, 79, 0, 0.125),
        lambda K: K.silu(g), lambda K: K.gelu(g), lambda K: K.relu(g),
        lambda K: K.swiglu(g, u), lambda K: K.geglu(g, u),
    ]
    for i, call in enumerate(calls):
        first = call(k1)
        for K in (k2, k2, k1, k2):
            np.testing.assert_array_equal(call(K), first, err_msg=f"call {i}")


# ---- bad input ------------------------------------------------------------------------------------------

def test_bad_input_raises(kern):
    x = np.ones((2, 8), dtype=np.float32)
    bad = [
        (lambda: kern.rmsnorm(x.astype(np.float64), None, 1e-6), "float32"),
        (lambda: kern.rmsnorm(np.ones((8, 2), np.float32).T, None, 1e-6), "C-contiguous"),
        (lambda: kern.rmsnorm(x, np.ones(7, np.float32), 1e-6), "shape"),
        (lambda: kern.rmsnorm(x, np.ones(16, np.float32)[::2], 1e-6), "C-contiguous"),
        (lambda: kern.rmsnorm(x, None, -1.0), "eps"),
        (lambda: kern.rmsnorm(np.float32(1.0), None, 1e-6), "float32"),
        (lambda: kern.layernorm(x, None, np.ones(9, np.float32), 1e-6), "b must have shape"),
        (lambda: kern.softmax([1.0, 2.0]), "float32"),
        (lambda: kern.silu(x.astype(np.float16)), "float32"),
        (lambda: kern.swiglu(x, np.ones((2, 9), np.float32)), "shapes differ"),
        (lambda: kern.geglu(x, x[:, ::2]), "C-contiguous"),
    ]
    xr = np.ones((2, 2, 8), dtype=np.float32)
    ro = xr.copy()
    ro.flags.writeable = False
    p2 = np.zeros(2, np.int32)
    bad += [
        (lambda: kern.rope(xr, p2, 7, 1e4, 1.0, True), "n_rot"),
        (lambda: kern.rope(xr, p2, 10, 1e4, 1.0, True), "n_rot"),
        (lambda: kern.rope(xr, np.zeros(3, np.int32), 8, 1e4, 1.0, True), "pos"),
        (lambda: kern.rope(xr, np.zeros(2, np.float32), 8, 1e4, 1.0, True), "pos"),
        (lambda: kern.rope(xr, p2, 8, 0.0, 1.0, True), "freq_base"),
        (lambda: kern.rope(xr, p2, 8, 1e4, float("nan"), True), "freq_scale"),
        (lambda: kern.rope(xr[0], p2, 8, 1e4, 1.0, True), "n_tok, n_head, head_dim"),
        (lambda: kern.rope(ro, p2, 8, 1e4, 1.0, True), "writable"),
        (lambda: kern.softmax(ro), "writable"),
        (lambda: kern.rope(np.ones((2, 2, 8), np.float64), p2, 8, 1e4, 1.0, True), "float32"),
    ]
    q = np.ones((2, 4, 8), dtype=np.float32)
    kc = np.ones((2, 10, 8), dtype=np.float16)
    bad += [
        (lambda: kern.attention(q, kc.astype(np.float32), kc, 0, 0, 1.0), "float16"),
        (lambda: kern.attention(q, kc, kc[:, :5].copy(), 0, 0, 1.0), "shapes differ"),
        (lambda: kern.attention(q, kc, np.ones((2, 10, 8), np.float16)[:, ::-1], 0, 0, 1.0), "C-contiguous"),
        (lambda: kern.attention(q[:, :3].copy(), kc, kc, 0, 0, 1.0), "multiple of n_head_kv"),
        (lambda: kern.attention(q, kc[..., :4].copy(), kc[..., :4].copy(), 0, 0, 1.0), "head_dim"),
        (lambda: kern.attention(q, kc, kc, 9, 0, 1.0), "do not fit"),
        (lambda: kern.attention(q, kc, kc, -1, 0, 1.0), "do not fit"),
        (lambda: kern.attention(q, kc, kc, 0, -2, 1.0), "window"),
        (lambda: kern.attention(q, kc, kc, 0, 0, float("inf")), "scale"),
        (lambda: kern.attention(q[0], kc, kc, 0, 0, 1.0), "n_tok, n_head, head_dim"),
    ]
    for call, msg in bad:
        with pytest.raises(ValueError, match=msg):
            call()


def test_closed_kernels_raise():
    k = CpuKernels(1)
    k.close()
    with pytest.raises(ValueError, match="closed"):
        k.silu(np.ones(4, dtype=np.float32))


@pytest.mark.parametrize("n_tok,n_head_kv,head_dim,n_ctx,p0", [(1, 4, 64, 32, 0), (5, 3, 17, 20, 15), (1, 1, 1, 1, 0)])
def test_store_kv_matches_numpy_cast(kern, n_tok, n_head_kv, head_dim, n_ctx, p0):
    """The f32 -> f16 cache store: numpy's rounding (nearest even), overflow to inf, subnormals, NaN."""
    rng = np.random.default_rng(n_tok * 100 + head_dim)
    x = rand(rng, (n_tok, n_head_kv, head_dim), 100.0)
    specials = np.array([7e4, -7e4, 1e-6, -3e-8, 0.0, -0.0, 65504.0, np.nan], dtype=np.float32)
    x.reshape(-1)[: min(x.size, specials.size)] = specials[: x.size]
    got = np.full((n_head_kv, n_ctx, head_dim), 7, dtype=np.float16)
    want = got.copy()
    kern.store_kv(got, p0, x)
    with np.errstate(over="ignore"):
        want[:, p0:p0 + n_tok] = x.transpose(1, 0, 2)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)  # NaN stays NaN (its payload bits aside)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])  # bit for bit, signs too


def test_store_kv_rejects_bad_arguments(kern):
    plane = np.zeros((2, 8, 4), dtype=np.float16)
    with pytest.raises(ValueError, match="outside the cache"):
        kern.store_kv(plane, 7, np.zeros((2, 2, 4), np.float32))
    with pytest.raises(ValueError, match=r"f32 \[N, 2, 4\]"):
        kern.store_kv(plane, 0, np.zeros((1, 3, 4), np.float32))
    with pytest.raises(ValueError, match="float16"):
        kern.store_kv(plane.astype(np.float32), 0, np.zeros((1, 2, 4), np.float32))


# ---- transpose (the copies of fc2 and ffn_down made at load) -----------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_transpose_matches_numpy(dtype):
    from powerinfer_py.kernels.cpu import transpose

    rng = np.random.default_rng(3)
    # 8 x 8 blocks with and without leftover rows and columns, one row or column, rows 2 KB apart (F16 x 1024)
    for shape in [(1, 1), (1, 13), (13, 1), (8, 8), (16, 24), (19, 37), (40, 1024), (1029, 9)]:
        a = rng.integers(0, 255, shape).astype(dtype) if dtype == np.uint8 else \
            rng.standard_normal(shape).astype(dtype)
        t = transpose(a)
        assert t.shape == shape[::-1] and t.dtype == a.dtype and t.flags.c_contiguous
        np.testing.assert_array_equal(t.view(np.uint8), np.ascontiguousarray(a.T).view(np.uint8))
    assert transpose(np.zeros((0, 5), dtype)).shape == (5, 0)
    np.testing.assert_array_equal(transpose(a[::2, 1:]), np.ascontiguousarray(a[::2, 1:].T))  # non-contiguous input
    with pytest.raises(ValueError, match="2-D"):
        transpose(np.zeros(4, dtype))


def test_default_threads_follow_the_cpu_affinity():
    """A container or `taskset` may allow fewer CPUs than the machine has: the default pool uses those."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this OS")
    cpu0 = min(os.sched_getaffinity(0))
    code = "from powerinfer_py.kernels.cpu import CpuKernels; print(CpuKernels().n_threads)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, {cpu0})).stdout
    assert out.strip() == "1"
    assert CpuKernels().n_threads == len(os.sched_getaffinity(0))
