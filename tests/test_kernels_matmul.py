"""C quantization / matmul / matmul_rows / get_rows kernels against the numpy reference (kernels/ref.py) and
gguf's codec (llama.cpp's block layouts), on random and on the real model's tensors."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import quants as gguf_quants

from powerinfer_py.errors import UnsupportedError
from powerinfer_py.kernels import ref, ref_iq
from powerinfer_py.gguf.types import KERNEL_TYPES, GGMLType, Tensor

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
Q0_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0)  # value d * q
Q1_TYPES = (GGMLType.Q4_1, GGMLType.Q5_1)  # value d * q + m (Q8_1 activation sums)
# 32-element blocks, Q8_0 activations (IQ4_NL, MXFP4: computed on, not produced: random blocks)
BLOCK_TYPES = Q0_TYPES + Q1_TYPES + (GGMLType.IQ4_NL, GGMLType.MXFP4)
K_TYPES = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,  # 256-element super-blocks, Q8_K activations
           GGMLType.Q2_K,
           GGMLType.Q3_K,
           GGMLType.IQ4_XS,  # IQ4_NL's levels in 8 sub-blocks of 32 with 6-bit scales
           # grid values with sign bits, 4-bit scales (random bytes: any index, sign and scale is valid)
           GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S,
           GGMLType.IQ1_S, GGMLType.IQ1_M,  # grid -1 / 0 / 1 plus a +-1/8 delta, 3-bit scales
           )
RANDOM_TYPES = K_TYPES + (GGMLType.IQ4_NL, GGMLType.MXFP4)  # types tests build from random bytes
QUANTIZABLE = FLOAT_TYPES + Q0_TYPES + Q1_TYPES
EPS32 = 2.0 ** -24  # f32 unit roundoff
# byte offsets of the f16 scales in a K-quant block: random bytes elsewhere are a valid block
K_F16_FIELDS = {GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),
                GGMLType.Q2_K: (80, 82),
                GGMLType.Q3_K: (108,),
                GGMLType.IQ4_XS: (0,),
                **{t: (0,) for t in (GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_XXS, GGMLType.IQ2_XS,
                                     GGMLType.IQ2_S, GGMLType.IQ1_S)},
                GGMLType.IQ1_M: (),  # its f16 d is spread over the scale words' top nibbles (ref_iq.put_iq1m_d)
                }
K_F16_FIELDS[GGMLType.IQ4_NL] = (0,)  # its one f16 d: random bytes after it are a valid IQ4_NL block too
K_F16_FIELDS[GGMLType.MXFP4] = ()  # no f16: byte 0 is an E8M0 exponent (random_k_blocks keeps it sane)
MXFP4_E = (118, 124)  # random MXFP4 exponents: block scales 2^(e - 127) of 2^-9 .. 2^-4, as the f16 scales


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def kernels(request):
    k = cpu.CpuKernels(request.param)
    yield k
    k.close()


def random_k_blocks(ggml_type, n_rows, n_cols, rng, scale=(0.001, 0.02)) -> np.ndarray:
    """Random K-quant (or IQ4_NL, MXFP4) bytes uint8 [n_rows, row_bytes] with finite f16 scales (MXFP4: E8M0
    exponents in MXFP4_E) (we cannot quantize those types)."""
    block, size = GGML_QUANT_SIZES[ggml_type]
    b = rng.integers(0, 256, (n_rows * n_cols // block, size), dtype=np.uint8)
    for off in K_F16_FIELDS[ggml_type]:
        b[:, off:off + 2] = rng.uniform(*scale, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if ggml_type == GGMLType.MXFP4:
        b[:, 0] = rng.integers(*MXFP4_E, len(b))
    if ggml_type == GGMLType.IQ1_M:
        ref_iq.put_iq1m_d(b, rng.uniform(*scale, len(b)))
    return b.reshape(n_rows, -1)


def make_weight(ggml_type, n_rows, n_cols, seed=0) -> Tensor:
    rng = np.random.default_rng(seed)
    if ggml_type in RANDOM_TYPES:
        return Tensor("w", ggml_type, (n_rows, n_cols), random_k_blocks(ggml_type, n_rows, n_cols, rng))
    w = rng.standard_normal((n_rows, n_cols), dtype=np.float32)
    return Tensor("w", ggml_type, (n_rows, n_cols), ref.quantize(w, ggml_type))


def error_bound(w: Tensor, x: np.ndarray) -> np.ndarray:
    """A worst-case bound on f32 accumulation error: n * eps * sum |terms|, with n the longest add chain
    (K / 8 lanes + reduction); the terms are those of llama.cpp's arithmetic (ref.matmul_abs_terms)."""
    n = w.n_cols / 8 + 16
    return n * EPS32 * ref.matmul_abs_terms(w, x) + 1e-30


SHAPES_FLOAT = [(r, c) for r in (1, 7, 33, 4095) for c in (1, 7, 33)] + [(65, 1000)]
SHAPES_BLOCK = [(r, c) for r in (1, 7, 33, 4095) for c in (32, 96, 4096) if r * c <= 4095 * 96 or r < 100] + [
    (33, 640)]  # 20 blocks: two groups of 8 and a tail of 4 (AVX2), Gemma 3 270M's n_embd
SHAPES_K = [(r, c) for r in (1, 7, 33) for c in (256, 512, 2048)] + [(300, 1024)]
SHAPES = {**{t: SHAPES_FLOAT for t in FLOAT_TYPES}, **{t: SHAPES_BLOCK for t in BLOCK_TYPES},
          **{t: SHAPES_K for t in K_TYPES}}


def test_kernel_types_are_tested():
    assert set(KERNEL_TYPES) == set(SHAPES)


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES + BLOCK_TYPES + K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 17, 18, 19])  # 18, 19: 2 and 3 left after the 4-token tiles
def test_matmul_matches_ref(kernels, ggml_type, n_tok):
    shapes = SHAPES[ggml_type]
    rng = np.random.default_rng(n_tok)
    for n_rows, n_cols in shapes:
        w = make_weight(ggml_type, n_rows, n_cols, seed=n_rows + n_cols)
        x = rng.standard_normal((n_tok, n_cols), dtype=np.float32)
        y = kernels.matmul(w, x)
        assert y.shape == (n_tok, n_rows) and y.dtype == np.float32
        err = np.abs(y.astype(np.float64) - ref.matmul(w, x))
        bound = error_bound(w, x)
        assert (err <= bound).all(), f"{ggml_type.name} {n_rows}x{n_cols} n_tok {n_tok}: max err {err.max()}"
        # one token at a time (the decode path) gives the same bits as the batched (prefill) path
        for t in (0, n_tok - 1):
            np.testing.assert_array_equal(kernels.matmul(w, x[t]), y[t])


@pytest.mark.parametrize("ggml_type", Q0_TYPES, ids=lambda t: t.name)
def test_quantized_matmul_is_exact_integer_arithmetic(kernels, ggml_type):
    """Activations and weights that are exact in Q8_0 with power-of-two scales: every product and sum is
    exact in f32, so C must agree with the reference bit for bit."""
    rng = np.random.default_rng(5)
    n_rows, n_cols = 9, 256
    qmax = {GGMLType.Q8_0: 127, GGMLType.Q4_0: 7, GGMLType.Q5_0: 15}[ggml_type]
    wv = rng.integers(-qmax, qmax + 1, size=(n_rows, n_cols)).astype(np.float32)
    wv[:, ::32] = qmax if ggml_type == GGMLType.Q8_0 else -qmax - 1  # pins d to 1 per block
    w = Tensor("w", ggml_type, wv.shape, ref.quantize(wv, ggml_type))
    np.testing.assert_array_equal(ref.dequantize(w), wv)
    x = rng.integers(-127, 128, size=(4, n_cols)).astype(np.float32)
    x[:, ::32] = 127
    np.testing.assert_array_equal(kernels.matmul(w, x), x @ wv.T)
    np.testing.assert_array_equal(ref.matmul(w, x), x @ wv.T)
    # exact ties (d_x = 1, x = k + 0.5) round half away from zero when the activations are quantized
    x[:, 1::32] = np.float32(0.5) * rng.choice([-5, -3, -1, 1, 3, 5], size=(4, n_cols // 32))
    xq = np.trunc(x + np.copysign(np.float32(0.5), x))
    np.testing.assert_array_equal(kernels.matmul(w, x), xq @ wv.T)
    np.testing.assert_array_equal(ref.matmul(w, x), xq @ wv.T)


@pytest.mark.parametrize("ggml_type", Q1_TYPES + (GGMLType.IQ4_NL, GGMLType.MXFP4), ids=lambda t: t.name)
def test_q1_iq4nl_matmul_is_exact_integer_arithmetic(kernels, ggml_type):
    """Power-of-two d (and m), activations with d_x = 1 and block sums exact in f16: every product and sum is
    exact in f32, so C, the reference and a plain product with the dequantized weights agree bit for bit.
    Pins the min term m_w * s_x (s_x = d_x * sum(q_x)) of Q4_1/Q5_1, IQ4_NL's table and MXFP4's table and
    E8M0 scales (three exponents mixed block by block)."""
    rng = np.random.default_rng(15)
    n_rows, n_cols = 9, 32 * 11
    if ggml_type == GGMLType.IQ4_NL:
        data = random_k_blocks(ggml_type, n_rows, n_cols, rng)
        data.reshape(-1, 18)[:, :2] = np.full(n_rows * n_cols // 32, 2.0 ** -3, np.float16).view(np.uint8).reshape(-1, 2)
        w = Tensor("w", ggml_type, (n_rows, n_cols), data)
        wv = ref.dequantize(w)
    elif ggml_type == GGMLType.MXFP4:
        data = random_k_blocks(ggml_type, n_rows, n_cols, rng)
        data.reshape(-1, 17)[:, 0] = rng.integers(125, 128, n_rows * n_cols // 32)  # 2^-2 .. 1 times E2M1
        w = Tensor("w", ggml_type, (n_rows, n_cols), data)
        wv = ref.dequantize(w)
        np.testing.assert_array_equal(wv, gguf_quants.dequantize(data, ggml_type).reshape(wv.shape))
    else:
        half = 8 if ggml_type == GGMLType.Q4_1 else 16
        wv = rng.integers(-half, half, size=(n_rows, n_cols)).astype(np.float32)
        wv[:, ::32], wv[:, 1::32] = -half, half - 1  # d = 1, m = -half per block
        w = Tensor("w", ggml_type, wv.shape, ref.quantize(wv, ggml_type))
        np.testing.assert_array_equal(ref.dequantize(w), wv)
    x = rng.integers(-3, 4, size=(4, n_cols)).astype(np.float32)
    x[:, ::32] = 127
    want = (x.astype(np.float64) @ wv.T.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(kernels.matmul(w, x), want)
    np.testing.assert_array_equal(kernels.matmul(w, x[1]), want[1])
    np.testing.assert_array_equal(ref.matmul(w, x), want)
    np.testing.assert_array_equal(kernels.matmul_rows(w, np.array([0, 4, 8], np.int32), x), want[:, [0, 4, 8]])


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_cols", [32, 96, 640])
def test_row_tail_ignores_the_bytes_after_it(kernels, ggml_type, n_cols):
    """A row whose block count is not a multiple of 8 ends in a part group; the AVX2 decode reads it in place,
    bytes of the next row included, where they lie inside the weights. Whatever those bytes hold (here: the next
    row's scales all infinite, so a lane that let them in would turn the row's result into NaN or inf), each
    row's result is the one with that next row zeroed, bit for bit, and the batched path's."""
    rng = np.random.default_rng(n_cols)
    n_rows = 12
    w = make_weight(ggml_type, n_rows, n_cols, seed=n_cols)
    x = rng.standard_normal((2, n_cols), dtype=np.float32)
    size = GGML_QUANT_SIZES[ggml_type][1]
    for r in range(0, n_rows - 1, 2):  # poison every odd row; compare the even rows before them
        poisoned = w.data.copy().reshape(n_rows, -1, size)
        zeroed = poisoned.copy()
        if ggml_type == GGMLType.MXFP4:
            poisoned[r + 1, :, 0] = 255  # E8M0 255: NaN
        else:
            poisoned[r + 1, :, :2] = np.array([np.inf], np.float16).view(np.uint8)
        zeroed[r + 1] = 0
        got = kernels.matmul(Tensor("w", ggml_type, w.shape, poisoned.reshape(w.data.shape)), x[0])
        want = kernels.matmul(Tensor("w", ggml_type, w.shape, zeroed.reshape(w.data.shape)), x)
        assert np.isfinite(got[r]), f"{ggml_type.name} row {r}: {got[r]}"
        np.testing.assert_array_equal(got[r], want[0, r])


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.name)
def test_matmul_rows_longer_than_the_row_decoder_takes(kernels, ggml_type):
    """Past 32768 columns the AVX-512 row-at-a-time decoders of the quad types hand over to the tiles, whose
    activations share the quads' layout: decode still matches the reference and the batched bits."""
    w = make_weight(ggml_type, 9, 32 * 1027, seed=17)
    x = np.random.default_rng(18).standard_normal((2, w.n_cols), dtype=np.float32)
    y = kernels.matmul(w, x)
    assert (np.abs(y.astype(np.float64) - ref.matmul(w, x)) <= error_bound(w, x)).all()
    np.testing.assert_array_equal(kernels.matmul(w, x[1]), y[1])


@pytest.mark.parametrize("ggml_type", KERNEL_TYPES, ids=lambda t: t.name)
def test_matmul_bit_identical_across_runs_and_threads(ggml_type):
    w = make_weight(ggml_type, 300, 512, seed=3)
    x = np.random.default_rng(4).standard_normal((13, 512), dtype=np.float32)
    k1, k2 = cpu.CpuKernels(1), cpu.CpuKernels(2)
    try:
        first = k2.matmul(w, x)
        for _ in range(5):
            np.testing.assert_array_equal(k2.matmul(w, x), first)
        np.testing.assert_array_equal(k1.matmul(w, x), first)
    finally:
        k1.close()
        k2.close()


@pytest.mark.parametrize("ggml_type", K_TYPES, ids=lambda t: t.name)
def test_k_quant_matmul_is_exact_integer_arithmetic(kernels, ggml_type):
    """Power-of-two super-block scales and small integer activations whose Q8_K scale is exactly 1 (the first
    largest-magnitude element is -127): every partial sum is an exact f32, so C, the reference and a plain
    f64 product with the dequantized weights agree bit for bit. This pins the Q8_K formula and the min term."""
    rng = np.random.default_rng(8)
    n_rows, n_cols = 5, 512
    data = random_k_blocks(ggml_type, n_rows, n_cols, rng)
    blocks = data.reshape(-1, GGML_QUANT_SIZES[ggml_type][1])
    for off, value in zip(K_F16_FIELDS[ggml_type], (2.0 ** -4, 2.0 ** -5)):
        blocks[:, off:off + 2] = np.full(len(blocks), value, np.float16).view(np.uint8).reshape(-1, 2)
    if ggml_type == GGMLType.IQ1_M:
        ref_iq.put_iq1m_d(blocks, np.full(len(blocks), 2.0 ** -4))
    w = Tensor("w", ggml_type, (n_rows, n_cols), data)
    wv = ref.dequantize(w).astype(np.float64)
    x = rng.integers(-3, 4, size=(3, n_cols)).astype(np.float32)
    x[:, ::256] = -127
    np.testing.assert_array_equal(kernels.matmul(w, x), (x.astype(np.float64) @ wv.T).astype(np.float32))
    np.testing.assert_array_equal(ref.matmul(w, x), (x.astype(np.float64) @ wv.T).astype(np.float32))
    # a positive maximum flips the sign of the Q8_K scale (iscale = -127 / max): same products
    np.testing.assert_array_equal(kernels.matmul(w, -x), (-x.astype(np.float64) @ wv.T).astype(np.float32))


@pytest.mark.parametrize("ggml_type", K_TYPES, ids=lambda t: t.name)
def test_k_quant_prefill_tiles_give_decode_bits(kernels, ggml_type):
    """Prefill runs K-quant rows in blocks of 16 against tiles of 8 tokens and spans of 8 super-blocks, the
    running sums stored between spans (matmul_k.c); decode runs each row whole. A shape with partial row
    blocks, several spans with a partial one (19 super-blocks) and tokens left over after the full tiles
    (8 + 8 + 3) must give every (row, token) the bits of the one-token call, dense and gathered."""
    n_rows, n_cols, n_tok = 37, 19 * 256, 19
    w = make_weight(ggml_type, n_rows, n_cols, seed=3)
    x = np.random.default_rng(4).standard_normal((n_tok, n_cols), dtype=np.float32)
    y = kernels.matmul(w, x)
    want = np.stack([kernels.matmul(w, x[t]) for t in range(n_tok)])
    np.testing.assert_array_equal(y, want)
    assert (np.abs(y.astype(np.float64) - ref.matmul(w, x)) <= error_bound(w, x)).all()
    rows = np.array([0, 3, 4, 17, 18, 19, 20, 33, 36], np.int32)
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x), want[:, rows])


@pytest.mark.parametrize("n_rows,n_cols,n_tok", [(37, 96, 66), (37, 160, 69), (3, 2049 * 32, 6)],
                         ids=["2-left", "1-left", "over-the-scale-buffer"])
def test_q8_0_prefill_token_blocks_give_decode_bits(kernels, n_rows, n_cols, n_tok):
    """Q8_0 prefill takes tokens in blocks of 64 and groups of 4 (on AVX2 with each row block's scales converted
    once per token block, matmul.c q8_chunk; rows of more than 2048 blocks go to the generic tiles): a second
    token block ending in 2 tokens or 1 token, and rows past that limit, give every (row, token) the bits of the
    one-token call, dense and gathered."""
    w = make_weight(GGMLType.Q8_0, n_rows, n_cols, seed=n_tok)
    x = np.random.default_rng(n_cols).standard_normal((n_tok, n_cols), dtype=np.float32)
    y = kernels.matmul(w, x)
    want = np.stack([kernels.matmul(w, x[t]) for t in range(n_tok)])
    np.testing.assert_array_equal(y, want)
    assert (np.abs(y.astype(np.float64) - ref.matmul(w, x)) <= error_bound(w, x)).all()
    rows = np.array([0, 2] + ([17, 18, 33, 36] if n_rows > 36 else []), np.int32)
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x), want[:, rows])


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_cols", [1029, 2048])
@pytest.mark.parametrize("n_tok", [13, 14, 15, 16, 17])
def test_float_prefill_blocks_give_decode_bits(kernels, ggml_type, n_cols, n_tok):
    """Float prefill runs groups of rows (2 on AVX2, 4 on AVX-512) against 6 tokens in column blocks sized
    from L1d, the running sums kept between blocks (matmul.c rows_f_kblocked); rows a multiple of 4 KB get
    their tokens' x copied to padded rows; the 1-5 tokens left after the 6-token groups take the shared
    leftover tiles (4 tokens, then 2-3 in one pass, or 1). Partial row blocks, several column blocks with a short
    last one and a tail past the last full vector (1029), the padded copy (2048) and every leftover count
    (13-17 tokens: 1 to 5 left) must give every (row, token) the bits of the one-token call, dense and
    gathered."""
    n_rows = 37
    w = make_weight(ggml_type, n_rows, n_cols, seed=5)
    x = np.random.default_rng(6).standard_normal((n_tok, n_cols), dtype=np.float32)
    y = kernels.matmul(w, x)
    want = np.stack([kernels.matmul(w, x[t]) for t in range(n_tok)])
    np.testing.assert_array_equal(y, want)
    assert (np.abs(y.astype(np.float64) - ref.matmul(w, x)) <= error_bound(w, x)).all()
    rows = np.array([0, 3, 4, 17, 18, 19, 20, 33, 36], np.int32)
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x), want[:, rows])


@pytest.mark.parametrize("n_tok", [64, 65, 81, 130])  # whole slivers of 32, a 1-token and a 17-token tail, 5 slivers
@pytest.mark.parametrize("n_rows, n_cols", [(12, 64), (37, 1029), (25, 4096), (13, 100)])
def test_f16_outer_product_prefill(kernels, n_tok, n_rows, n_cols):
    """F16 prompts of 64 tokens or more take the outer-product tiles on AVX-512 builds (csrc/matmul_f16p.c: 12
    rows x 32 tokens, rows converted to f32 in blocks of 36, a short last panel of zero rows, column tails past
    the last vector, token tails of one or two vectors). Each output is one sequential FMA chain over the columns
    (in sub-panels of columns, summed in order), so the error bound is that of a chain of n_cols terms. Gathered
    (ascending) rows give the dense bits of those rows, and the bits do not depend on the thread count or the run."""
    w = make_weight(GGMLType.F16, n_rows, n_cols, seed=n_rows + n_tok)
    x = np.random.default_rng(n_cols).standard_normal((n_tok, n_cols), dtype=np.float32)
    y = kernels.matmul(w, x)
    bound = (n_cols + 16) * EPS32 * ref.matmul_abs_terms(w, x) + 1e-30
    err = np.abs(y.astype(np.float64) - ref.matmul(w, x))
    assert (err <= bound).all(), f"max err {err.max()}"
    rows = np.unique(np.array([0, 5, n_rows // 2, n_rows - 1], np.int32))
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x), y[:, rows])
    k3 = cpu.CpuKernels(3)
    try:
        np.testing.assert_array_equal(k3.matmul(w, x), y)
        np.testing.assert_array_equal(k3.matmul(w, x), y)
    finally:
        k3.close()


def test_f16_outer_product_prefill_split_rows(kernels):
    """Where all tokens' packed activations do not fit in half of L3 the rows are converted in several column
    panels, their sums added in order (kc_for in csrc/matmul_f16p.c): 1100 tokens x 8192 columns are 36 MB of
    activations, more than half of any L3 this runs on (up to 64 MB)."""
    w = make_weight(GGMLType.F16, 14, 8192, seed=9)
    x = np.random.default_rng(10).standard_normal((1100, 8192), dtype=np.float32)
    y = kernels.matmul(w, x)
    bound = (8192 + 16) * EPS32 * ref.matmul_abs_terms(w, x) + 1e-30
    assert (np.abs(y.astype(np.float64) - ref.matmul(w, x)) <= bound).all()
    np.testing.assert_array_equal(kernels.matmul_rows(w, np.array([2, 13], np.int32), x), y[:, [2, 13]])


@pytest.mark.parametrize("n_tok", [9, 26])
def test_f16_long_rows_prefill_keeps_the_decode_bits(kernels, n_tok):
    """Long F16 rows (K = 11003: more than 16 rows of them do not fit in half of a 1 MB L2 beside the activations)
    go through the AVX2 build's 3 x 4 tiles in blocks of whole 3-row groups, the 1-2 rows a chunk leaves over
    through the 2 x 6 tiles (frb_for in csrc/matmul.c), and on other builds through their own tiles. Under 64
    tokens every build computes each output as the decode does, one FMA chain in column order, so each token's
    row of the batch has the bits of its own decode, gathered rows those of the dense rows, and the error bound is
    that of one chain; 101 rows leave odd counts everywhere, 11003 columns a scalar tail."""
    w = make_weight(GGMLType.F16, 101, 11003, seed=n_tok)
    x = np.random.default_rng(n_tok + 1).standard_normal((n_tok, 11003), dtype=np.float32)
    y = kernels.matmul(w, x)
    bound = (11003 + 16) * EPS32 * ref.matmul_abs_terms(w, x) + 1e-30
    assert (np.abs(y.astype(np.float64) - ref.matmul(w, x)) <= bound).all()
    for t in (0, n_tok // 2, n_tok - 1):
        np.testing.assert_array_equal(kernels.matmul(w, x[t]), y[t])
    rows = np.array([1, 2, 50, 99, 100], np.int32)
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x), y[:, rows])


def test_q8_K_activation_quantization():
    """llama.cpp's Q8_K: iscale = -127 / (first element of largest magnitude, sign kept), q = min(127,
    round-half-even(iscale * x)), d = 1 / iscale, bsums = sums of 16; an all-zero block has d = 0."""
    x = np.zeros((3, 256), np.float32)
    x[0, :8] = [-127, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127]  # iscale = 1: ties go to even
    x[1, :3] = [1.0, 100.0, -100.0]  # the first of two equal magnitudes sets the sign
    d, q, bsums = ref.quantize_q8_K_blocks(x)
    assert d[0] == 1 and list(q[0, :8]) == [-127, 0, 2, 2, 0, -2, 126, 127]
    iscale = np.float32(-127) / np.float32(100)
    assert d[1] == np.float32(1) / iscale and list(q[1, :3]) == [np.rint(iscale), -127, 127]
    assert d[2] == 0 and not q[2].any()
    np.testing.assert_array_equal(bsums, q.reshape(3, 16, 16).sum(-1))
    # C quantizes the same way: with unit weights a Q8_0-free check is the dot of each Q8_K block
    w = Tensor("w", GGMLType.Q6_K, (1, 256), np.zeros((1, 210), np.uint8))
    w.data[0, 128:192] = 0xAA  # qh bits = 2 in every field: q = 32 -> value 0 ... plus ql = 1: q - 32 = 1
    w.data[0, :128] = 0x11
    w.data[0, 192:208] = 1
    w.data[0, 208:210] = np.array([1.0], np.float16).view(np.uint8)
    np.testing.assert_array_equal(ref.dequantize(w), np.ones((1, 256), np.float32))
    for row, dd, qq in zip(x, d, q):
        assert cpu.CpuKernels(1).matmul(w, row)[0] == np.float32(dd * np.float32(qq.sum(dtype=np.int64)))


@pytest.mark.parametrize("ggml_type", QUANTIZABLE, ids=lambda t: t.name)
def test_quantize_dequantize_match_ref(ggml_type):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((37, 96), dtype=np.float32) * rng.uniform(0.01, 100, size=(37, 1)).astype(np.float32)
    x[0] = 0.0   # all-zero blocks
    x[1, :32] = -3.0  # ties for the largest magnitude
    got, want = cpu.quantize(x, ggml_type), ref.quantize(x, ggml_type)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    t = Tensor("t", ggml_type, x.shape, got)
    back = cpu.dequantize(t)
    np.testing.assert_array_equal(back, ref.dequantize(t))
    if ggml_type == GGMLType.F32:
        np.testing.assert_array_equal(back, x)


def test_f16_bf16_conversions_exact():
    # every finite f16 value round-trips exactly; f32 -> f16 / bf16 round to nearest even like numpy / ref
    h = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    f = h.astype(np.float32).reshape(1, -1)
    np.testing.assert_array_equal(cpu.quantize(f, GGMLType.F16).view(np.uint16), h.view(np.uint16)[None])
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 1 << 32, size=(1, 20000), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = np.where(np.isfinite(x), x, np.float32(1.5)).astype(np.float32)
    with np.errstate(over="ignore"):  # values past 65504 become inf, in numpy as in C
        want16 = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(cpu.quantize(x, GGMLType.F16).view(np.uint16), want16)
    np.testing.assert_array_equal(cpu.quantize(x, GGMLType.BF16), ref.quantize(x, GGMLType.BF16))
    # ties: 1 + 2^-8 sits halfway between two bf16 values and rounds to the even one (1.0)
    tie = np.array([[1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]], dtype=np.float32)
    np.testing.assert_array_equal(cpu.quantize(tie, GGMLType.BF16), np.array([[0x3F80, 0x3F82]], dtype=np.uint16))


@pytest.mark.parametrize("n_tok", [1, 7])
@pytest.mark.parametrize("n_cols", [37, 4096])
def test_bf16_weights_take_bf16_rounded_activations(kernels, n_tok, n_cols):
    """BF16 weights multiply activations rounded to bf16 (nearest even), as llama.cpp does, on every build:
    with weights of 1 and activations 1 + e, each one's rounded value is known, and the sums are exact in f32
    (small integers and halves), so the result must be that sum bit for bit."""
    rng = np.random.default_rng(n_cols + n_tok)
    w = Tensor("w", GGMLType.BF16, (5, n_cols), ref.quantize(np.ones((5, n_cols), np.float32), GGMLType.BF16))
    # 1 + 2^-9 rounds down to 1, 1 + 3 * 2^-8 (a tie) up to 1 + 2^-6, 1 + 2^-8 (a tie) down to the even 1.0,
    # 2 - 2^-9 up to 2, -1.5 - 2^-10 to -1.5
    vals = np.array([1 + 2.0 ** -9, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8, 2 - 2.0 ** -9, -1.5 - 2.0 ** -10], np.float32)
    want_vals = np.array([1.0, 1 + 2.0 ** -6, 1.0, 2.0, -1.5], np.float64)
    idx = rng.integers(0, len(vals), (n_tok, n_cols))
    x = vals[idx]
    want = want_vals[idx].sum(axis=1)  # exact: multiples of 2^-6 far below 2^24 * 2^-6
    y = kernels.matmul(w, x)
    np.testing.assert_array_equal(y, np.repeat(want[:, None], 5, axis=1).astype(np.float32))
    np.testing.assert_array_equal(ref.matmul(w, x), y)


@pytest.mark.parametrize("ggml_type", RANDOM_TYPES, ids=lambda t: t.name)
def test_k_quant_dequantize_is_llama_cpp(ggml_type):
    """gguf's numpy decoder (llama.cpp's layout) and ours give the same f32 values, bit for bit."""
    data = random_k_blocks(ggml_type, 9, 768, np.random.default_rng(9), scale=(-0.05, 0.05))
    t = Tensor("t", ggml_type, (9, 768), data)
    want = gguf_quants.dequantize(data, ggml_type)
    np.testing.assert_array_equal(ref.dequantize(t), want)
    np.testing.assert_array_equal(cpu.dequantize(t), want)
    with pytest.raises(UnsupportedError, match="not produced"):
        cpu.quantize(np.zeros((1, 256), np.float32), ggml_type)
    with pytest.raises(UnsupportedError, match="not produced"):
        ref.quantize(np.zeros((1, 256), np.float32), ggml_type)


def test_mxfp4_every_exponent_and_code_is_llama_cpp(kernels):
    """All 256 E8M0 exponents (0 and 1: subnormal scales; 255: 2^128 halved, not NaN as llama.cpp reads it) with
    all 16 codes: our dequantize (numpy and C), get_rows and the matmul with a one-hot x give gguf's values
    (the largest codes overflow to inf at the top exponents, in gguf as here)."""
    blocks = np.zeros((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:, 1:] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    t = Tensor("t", GGMLType.MXFP4, (256, 32), blocks)
    with np.errstate(over="ignore"):
        want = gguf_quants.dequantize(blocks, GGMLType.MXFP4)
    assert want[255, 1] == 2.0 ** 127 and want[0, 1] == 2.0 ** -128 and want[0, 9] == -(2.0 ** -128)
    assert not np.isnan(want).any()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ref.dequantize(t), want)
    np.testing.assert_array_equal(cpu.dequantize(t), want)
    np.testing.assert_array_equal(kernels.get_rows(t, np.arange(256, dtype=np.int32)), want)
    # x = 127 at element 7 (code 7: 6.0) alone: d_x = 1, so y = 127 * 6 * 2^(e - 127), exact where no overflow
    x = np.zeros(32, np.float32)
    x[7] = 127
    # (exponents past ~240 overflow f32 in the partial sums: not a scale real weights have)
    rows = np.arange(0, 200, dtype=np.int32)
    np.testing.assert_array_equal(kernels.matmul_rows(t, rows, x), want[rows, 7] * np.float32(127))
    few = Tensor("t", GGMLType.MXFP4, (200, 32), blocks[:200])
    both = np.stack([want[:200, 7], -want[:200, 7]]) * np.float32(127)
    np.testing.assert_array_equal(kernels.matmul(few, np.stack([x, -x])), both)  # prefill tiles


@pytest.mark.parametrize("ggml_type", Q0_TYPES + Q1_TYPES, ids=lambda t: t.name)
def test_block_layout_is_llama_cpp(ggml_type):
    """gguf's own numpy codec (llama.cpp's layout) decodes our bytes, and encodes to the same bytes."""
    x = np.random.default_rng(6).standard_normal((5, 128), dtype=np.float32)
    ours = cpu.quantize(x, ggml_type)
    t = Tensor("t", ggml_type, x.shape, ours)
    np.testing.assert_array_equal(gguf_quants.dequantize(ours, ggml_type), cpu.dequantize(t))
    np.testing.assert_array_equal(gguf_quants.quantize(x, ggml_type), ours)


@pytest.mark.parametrize("ggml_type", KERNEL_TYPES, ids=lambda t: t.name)
def test_get_rows(kernels, ggml_type):
    n_cols = 512 if ggml_type in K_TYPES else 64
    w = make_weight(ggml_type, 50, n_cols, seed=7)
    ids = np.array([3, 0, 49, 3], dtype=np.int32)
    got = kernels.get_rows(w, ids)
    np.testing.assert_array_equal(got, ref.get_rows(w, ids))
    np.testing.assert_array_equal(got, ref.dequantize(w)[ids])
    assert kernels.get_rows(w, np.array([], dtype=np.int32)).shape == (0, n_cols)


def test_bad_input_raises(kernels):
    w = make_weight(GGMLType.Q8_0, 8, 64)
    with pytest.raises(ValueError, match="columns"):
        kernels.matmul(w, np.zeros(32, dtype=np.float32))
    with pytest.raises(ValueError, match="float32"):
        kernels.matmul(w, np.zeros(64, dtype=np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.matmul(w, np.zeros((64, 4), dtype=np.float32).T)
    with pytest.raises(ValueError, match="shape"):
        kernels.matmul(w, np.zeros((2, 2, 64), dtype=np.float32))
    with pytest.raises(IndexError, match=r"\[0, 8\)"):
        kernels.get_rows(w, np.array([0, 8], dtype=np.int32))
    with pytest.raises(IndexError):
        kernels.get_rows(w, np.array([-1], dtype=np.int32))
    with pytest.raises(ValueError, match="integer"):
        kernels.get_rows(w, np.array([0.5]))
    iq = Tensor("blk.0.ffn_down.weight", GGMLType.TQ2_0, (2, 256), np.zeros((2, 66), dtype=np.uint8))
    with pytest.raises(UnsupportedError, match="blk.0.ffn_down.weight.*TQ2_0"):
        kernels.matmul(iq, np.zeros(256, dtype=np.float32))
    q4k = Tensor("odd", GGMLType.Q4_K, (2, 128), np.zeros((2, 72), dtype=np.uint8))
    with pytest.raises(ValueError, match="odd.*multiple of 256"):
        kernels.matmul(q4k, np.zeros(128, dtype=np.float32))
    short = Tensor("short", GGMLType.Q8_0, (8, 64), np.zeros((8, 34), dtype=np.uint8))
    with pytest.raises(ValueError, match="short"):
        kernels.matmul(short, np.zeros(64, dtype=np.float32))
    for module in (cpu, ref):
        with pytest.raises(ValueError, match="multiple of 32"):
            module.quantize(np.zeros((2, 33), dtype=np.float32), GGMLType.Q4_0)
        for unsupported in (GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K):
            with pytest.raises(UnsupportedError):
                module.quantize(np.zeros((2, 256), dtype=np.float32), unsupported)


def test_read_probe_sums_every_byte(kernels):
    buf = np.arange(100_003, dtype=np.uint64).astype(np.uint8)
    assert kernels.read_probe(buf) > 0
    ones = np.ones(1 << 16, dtype=np.uint8)
    # the probe adds 8-byte words modulo 2^64: 2^16 bytes of 0x01 = 2^13 words of 0x0101010101010101
    assert kernels.read_probe(ones) == float(8192 * 0x0101010101010101 % 2**64)
    assert kernels.read_probe(ones[:-1]) == float((8191 * 0x0101010101010101 + 7) % 2**64)  # byte tail


def _word_sum(rows: np.ndarray) -> float:
    """The probes' sum: 8-byte little-endian words modulo 2^64, then the tail bytes of each row one by one."""
    w = rows.shape[1] // 8 * 8
    total = int(np.ascontiguousarray(rows[:, :w]).view(np.uint64).sum(dtype=np.uint64))
    return float((total + int(rows[:, w:].astype(np.uint64).sum())) % 2**64)


@pytest.mark.parametrize("row_bytes", [2304, 4352, 100, 7])
@pytest.mark.parametrize("ahead", [0, 4])
def test_read_rows_probe_reads_exactly_the_listed_rows(kernels, row_bytes, ahead):
    rng = np.random.default_rng(row_bytes)
    buf = rng.integers(0, 256, size=(300, row_bytes), dtype=np.uint8)
    for rows in (np.sort(rng.choice(300, 37, replace=False)), np.arange(300), np.array([299]), np.array([], int)):
        want = _word_sum(buf[rows]) if rows.size else 0.0
        assert kernels.read_rows_probe(buf, row_bytes, rows, ahead) == want
    with pytest.raises(ValueError, match="rows must lie"):
        kernels.read_rows_probe(buf, row_bytes, [300])


def test_benchmark_stopwatch_runs_the_kernel_it_names(kernels):
    """csrc/bench.c: each pi_timed_* makes the same call as the kernel it names (same outputs, bit for bit) and
    returns a positive time in seconds, so the benchmarks may time kernels in C."""
    lib, ffi, pool = cpu.lib, cpu.ffi, kernels._pool
    rng = np.random.default_rng(5)
    n_rows, n_cols = 70, 96
    w = cpu.quantize(rng.standard_normal((n_rows, n_cols), dtype=np.float32), GGMLType.Q4_0)
    x = rng.standard_normal(n_cols, dtype=np.float32)
    rows = np.array([1, 5, 6, 40, 69], dtype=np.int32)
    h = rng.standard_normal(len(rows), dtype=np.float32)
    fp = lambda a: ffi.from_buffer("float[]", a)  # noqa: E731
    rp = ffi.from_buffer("int32_t[]", rows)
    calls = {  # name: (output buffer, plain call, timed call)
        "matmul": (n_rows, lambda y: lib.pi_matmul(pool, int(GGMLType.Q4_0), ffi.from_buffer(w), n_rows, n_cols,
                                                   fp(x), 1, fp(y)),
                   lambda y: lib.pi_timed_matmul(pool, int(GGMLType.Q4_0), ffi.from_buffer(w), n_rows, n_cols,
                                                 fp(x), 1, fp(y))),
        "rows": (len(rows), lambda y: lib.pi_matmul_rows(pool, int(GGMLType.Q4_0), ffi.from_buffer(w), n_cols, rp,
                                                         len(rows), fp(x), 1, fp(y)),
                 lambda y: lib.pi_timed_matmul_rows(pool, int(GGMLType.Q4_0), ffi.from_buffer(w), n_cols, rp,
                                                    len(rows), fp(x), 1, fp(y))),
        "axpy": (n_cols, lambda y: lib.pi_axpy_rows(pool, int(GGMLType.Q4_0), ffi.from_buffer(w), n_cols, rp, fp(h),
                                                    len(rows), 1, fp(y)),
                 lambda y: lib.pi_timed_axpy_rows(pool, int(GGMLType.Q4_0), ffi.from_buffer(w), n_cols, rp, fp(h),
                                                  len(rows), 1, fp(y))),
    }
    for name, (n_out, plain, timed) in calls.items():
        y0, y1 = np.full(n_out, np.nan, np.float32), np.full(n_out, np.nan, np.float32)
        plain(y0)
        seconds = timed(y1)
        assert 0.0 < seconds < 1.0, name
        np.testing.assert_array_equal(y1, y0, err_msg=name)
        assert np.isfinite(y0).all(), name
    for fn in (lambda: lib.pi_timed_read_probe(pool, ffi.from_buffer(w), w.nbytes),
               lambda: lib.pi_timed_read_rows_probe(pool, ffi.from_buffer(w), w.shape[1], rp, len(rows), 4)):
        assert 0.0 < fn() < 1.0


# ---- row gather (sparse FFN) ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ggml_type", FLOAT_TYPES + BLOCK_TYPES + K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 17])
def test_matmul_rows_matches_dense_and_ref(kernels, ggml_type, n_tok):
    n_rows, n_cols = 70, (512 if ggml_type in K_TYPES else 96)
    w = make_weight(ggml_type, n_rows, n_cols, seed=11)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((n_tok, n_cols), dtype=np.float32)
    dense = kernels.matmul(w, x)
    for frac in (0.0, 0.1, 0.5, 1.0):
        rows = np.sort(rng.choice(n_rows, int(frac * n_rows), replace=False)).astype(np.int32)
        y = kernels.matmul_rows(w, rows, x)
        assert y.shape == (n_tok, len(rows)) and y.dtype == np.float32
        np.testing.assert_array_equal(y, dense[:, rows])  # the same bits as the dense product's rows
        want = ref.matmul_rows(w, rows, x)
        assert want.shape == y.shape
        assert (np.abs(y.astype(np.float64) - want) <= error_bound(w, x)[:, rows]).all()
        np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x[0]), y[0])  # 1-D x


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES + (GGMLType.F16, GGMLType.BF16), ids=lambda t: t.name)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_matmul_rows_decode_tiles(ggml_type, n_threads):
    """One token over rows long enough for the vector tiles' main loops (and their gather prefetch), plus a
    tail block, with more selected rows than a tile holds: the same bits as the dense product's rows. The
    selections cover both decode paths: scattered rows (tiles) and all rows, nearly all, or long runs of
    consecutive rows with gaps between them, as a MoE layer's chosen experts are (the row-at-a-time stream, whose
    prefetch runs on into the next selected rows, across the gaps)."""
    from powerinfer_py.kernels.cpu import CpuKernels

    n_rows, n_cols = 203, 32 * 41
    w = make_weight(ggml_type, n_rows, n_cols, seed=21)
    x = np.random.default_rng(22).standard_normal(n_cols, dtype=np.float32)
    k = CpuKernels(n_threads)
    try:
        dense = k.matmul(w, x)
        nearly_all = np.array([r for r in range(n_rows) if r % 20 != 7], dtype=np.int32)
        runs = np.concatenate([np.arange(0, 40), np.arange(80, 120), np.arange(163, 203)]).astype(np.int32)
        for rows in (np.arange(0, n_rows, 3, dtype=np.int32), np.arange(n_rows, dtype=np.int32), nearly_all, runs,
                     np.array([5, 17, 18, 150, 202], dtype=np.int32)):
            np.testing.assert_array_equal(k.matmul_rows(w, rows, x), dense[rows])
    finally:
        k.close()


def test_matmul_rows_bad_input(kernels):
    w = make_weight(GGMLType.Q8_0, 8, 64)
    x = np.zeros(64, np.float32)
    for module in (kernels, ref):
        with pytest.raises(IndexError, match=r"\[0, 8\)"):
            module.matmul_rows(w, np.array([0, 8], np.int32), x)
        with pytest.raises(IndexError):
            module.matmul_rows(w, np.array([-1, 2], np.int32), x)
        with pytest.raises(ValueError, match="ascending"):
            module.matmul_rows(w, np.array([3, 3], np.int32), x)
        with pytest.raises(ValueError, match="ascending"):
            module.matmul_rows(w, np.array([4, 2], np.int32), x)
        with pytest.raises(ValueError, match="integer"):
            module.matmul_rows(w, np.array([0.5]), x)
    np.testing.assert_array_equal(kernels.matmul_rows(w, np.array([1, 5], np.int64), x), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="columns"):
        kernels.matmul_rows(w, np.array([1], np.int32), np.zeros(32, np.float32))


# ---- the real model's tensors ----------------------------------------------------------------------------------

@pytest.mark.real_model
def test_real_model_tensors(kernels, real_model):
    """Every weight type of Gemma 3 270M: dequantize / get_rows equal gguf's decoder bit for bit, and matmul
    on a slice of rows matches the reference."""
    from powerinfer_py.gguf import open_gguf

    f = open_gguf(real_model)
    try:
        seen = {}
        for t in f.tensors.values():
            if t.type in K_TYPES + BLOCK_TYPES and len(t.shape) == 2:
                seen.setdefault(t.type, t)
        assert {GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0} <= set(seen)
        rng = np.random.default_rng(13)
        for ty, t in seen.items():
            part = Tensor(t.name, t.type, (64, t.n_cols), np.asarray(t.data[:64]))
            want = gguf_quants.dequantize(part.data, ty)
            np.testing.assert_array_equal(cpu.dequantize(part), want)
            np.testing.assert_array_equal(ref.dequantize(part), want)
            ids = np.array([63, 0, 17], np.int32)
            np.testing.assert_array_equal(kernels.get_rows(part, ids), want[ids])
            x = rng.standard_normal((3, t.n_cols), dtype=np.float32)
            err = np.abs(kernels.matmul(part, x).astype(np.float64) - ref.matmul(part, x))
            assert (err <= error_bound(part, x)).all(), t.name
    finally:
        f.close()


_AMX_CHILD = """
import hashlib, sys
import numpy as np
from powerinfer_py.kernels import cpu
from powerinfer_py.gguf.types import GGMLType, Tensor
sys.path.insert(0, sys.argv[1])
from test_kernels_matmul import make_weight
k = cpu.CpuKernels(2)
out = [str(cpu.lib.pi_k_amx())]
for name in ("Q4_K", "Q5_K", "Q6_K"):
    w = make_weight(GGMLType[name], 37, 3 * 256, seed=5)
    x = np.random.default_rng(6).standard_normal((19, 3 * 256), dtype=np.float32)
    out.append(hashlib.sha256(k.matmul(w, x).tobytes()).hexdigest())
k.close()
print(" ".join(out))
"""


def _amx_child(amx: str) -> list[str]:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, POWERINFER_AMX=amx)
    run = subprocess.run([sys.executable, "-c", _AMX_CHILD, str(Path(__file__).parent)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_k_quant_amx_switch():
    """POWERINFER_AMX=0 turns the AMX prefill (matmul_k_amx.h) off. Where this process takes it, the other path
    (the AVX-512 tiles, another order of f32 additions) must give other bits for Q4_K / Q5_K / Q6_K; where it
    does not (no AMX in the build or the CPU), the variable changes nothing."""
    on, off = _amx_child("1"), _amx_child("0")
    assert off[0] == "0"
    assert on[0] == str(cpu.lib.pi_k_amx())
    if on[0] == "1":
        assert all(a != b for a, b in zip(on[1:], off[1:]))
    else:
        assert on[1:] == off[1:]


@pytest.mark.parametrize("ggml_type", (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K), ids=lambda t: t.name)
def test_k_quant_without_amx_gives_decode_bits(ggml_type):
    """The AVX-512 tiles, as an AMX host runs them with POWERINFER_AMX=0: the prefill, the gathered rows and the
    expert groups still give each (row, token) its one-token bits, within the reference's error bound (the
    checks of test_k_quant_prefill_tiles_give_decode_bits, in a child process where the variable is read)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = dict(os.environ, POWERINFER_AMX="0")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "test_kernels_matmul.py"),
                          "-k", f"prefill_tiles_give_decode_bits and {ggml_type.name}"],
                         env=env, capture_output=True, text=True, timeout=600, cwd=here.parent)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


@pytest.mark.parametrize("rows_per_tile", [1, 2, 4])
@pytest.mark.parametrize("ggml_type", (GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0,
                                       GGMLType.IQ4_NL), ids=lambda t: t.name)
@pytest.mark.parametrize("n_rows,n_cols", [(37, 1056), (203, 32 * 41), (9, 4096)])
def test_decode_row_choice_keeps_the_bits(kernels, ggml_type, rows_per_tile, n_rows, n_cols):
    """The decode mat-vecs that read one row at a time or several side by side (pi_decode_rows: F16 on vector
    builds, Q8_0, BF16 and the 8-block groups on AVX2; chosen per process from a timed FMA chain, matmul.c)
    compute each row by the same operations in the same order, so both give every row the bits of the batched (prefill)
    product, dense and gathered, with leftover rows, a group tail (1056, 1312 columns) and (F16) a column tail."""
    w = make_weight(ggml_type, n_rows, n_cols, seed=31)
    x = np.random.default_rng(32).standard_normal((5, n_cols), dtype=np.float32)
    batched = kernels.matmul(w, x)
    lib, ty = cpu.lib, int(ggml_type)
    before = lib.pi_decode_rows(ty, 0)
    try:
        got = lib.pi_decode_rows(ty, rows_per_tile)
        if ggml_type == GGMLType.BF16:  # AVX2: F16's count of 2 or 4 rows, no one-row path (set = 1 leaves it)
            assert got == 0 or (got in (2, 4) and rows_per_tile in (1, got))
        else:
            assert got == 0 or (got == 1) == (rows_per_tile == 1)  # 0: no choice in this build
        for t in range(len(x)):
            np.testing.assert_array_equal(kernels.matmul(w, x[t]), batched[t])
        rows = np.array([0, 2, 3, n_rows - 5, n_rows - 1], np.int32)
        np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x[1]), batched[1, rows])
    finally:
        lib.pi_decode_rows(ty, before)


def test_decode_rows_variable():
    """POWERINFER_DECODE_ROWS=1 fixes one row at a time for the process, 4 (any number >= 2) several (the F16
    decode on vector builds; the portable build has no choice and answers 0); others leave the timed choice,
    which on AVX2 builds may also be 2 rows per tile for F16."""
    import os
    import subprocess
    import sys

    code = "from powerinfer_py.kernels.cpu import lib; print(lib.pi_decode_rows(1, 0))"  # 1: GGML F16
    got = {}
    for value in ("1", "4", "x"):
        run = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, POWERINFER_DECODE_ROWS=value),
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        got[value] = int(run.stdout)
    if cpu.lib.pi_decode_rows(int(GGMLType.F16), 0) == 0:
        assert got == {"1": 0, "4": 0, "x": 0}
    else:
        assert got["1"] == 1 and got["4"] == 4 and got["x"] in (1, 2, 4)
