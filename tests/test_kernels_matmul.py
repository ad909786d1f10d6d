"""C quantization / matmul / get_rows kernels against the numpy reference (kernels/ref.py) and gguf's codec."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gguf_quants

from powerinfer_py.errors import UnsupportedError
from powerinfer_py.kernels import ref
from powerinfer_py.tensor import KERNEL_TYPES, GGMLType, Tensor

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
BLOCK_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0)
EPS32 = 2.0 ** -24  # f32 unit roundoff


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def kernels(request):
    k = cpu.CpuKernels(request.param)
    yield k
    k.close()


def make_weight(ggml_type, n_rows, n_cols, seed=0) -> Tensor:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_rows, n_cols), dtype=np.float32)
    return Tensor("w", ggml_type, (n_rows, n_cols), ref.quantize(w, ggml_type))


def error_bound(w: Tensor, x: np.ndarray) -> np.ndarray:
    """A worst-case bound on f32 accumulation error: n * eps * sum |terms|, with n the longest add chain
    (K / 8 lanes + reduction). For block types the terms are the dequantized Q8_0 activations."""
    wd = np.abs(ref.dequantize(w).astype(np.float64))
    x2 = np.atleast_2d(x)
    if w.type in BLOCK_TYPES:
        d, q = ref.quantize_q8_0_blocks(x2.reshape(-1, 32))
        x2 = (d.astype(np.float64)[:, None] * q).reshape(x2.shape)
    s = np.abs(x2.astype(np.float64)) @ wd.T
    n = w.n_cols / 8 + 16
    return (n * EPS32 * s + 1e-30).reshape(np.shape(x)[:-1] + (w.n_rows,))


SHAPES_FLOAT = [(r, c) for r in (1, 7, 33, 4095) for c in (1, 7, 33)] + [(65, 1000)]
SHAPES_BLOCK = [(r, c) for r in (1, 7, 33, 4095) for c in (32, 96, 4096) if r * c <= 4095 * 96 or r < 100]


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES + BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 17])
def test_matmul_matches_ref(kernels, ggml_type, n_tok):
    shapes = SHAPES_FLOAT if ggml_type in FLOAT_TYPES else SHAPES_BLOCK
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


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.name)
def test_quantized_matmul_is_exact_integer_arithmetic(kernels, ggml_type):
    """Activations and weights that are exact in Q8_0 with power-of-two scales: every product and sum is
    exact in f32, so C must agree with the reference bit for bit."""
    rng = np.random.default_rng(5)
    n_rows, n_cols = 9, 256
    qmax = 127 if ggml_type == GGMLType.Q8_0 else 7
    wv = rng.integers(-qmax, qmax + 1, size=(n_rows, n_cols)).astype(np.float32)
    wv[:, ::32] = qmax if ggml_type == GGMLType.Q8_0 else -8  # pins d to 1 per block
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


@pytest.mark.parametrize("ggml_type", KERNEL_TYPES, ids=lambda t: t.name)
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


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.name)
def test_block_layout_is_llama_cpp(ggml_type):
    """gguf's own numpy codec (llama.cpp's layout) decodes our bytes, and encodes to the same bytes."""
    x = np.random.default_rng(6).standard_normal((5, 128), dtype=np.float32)
    ours = cpu.quantize(x, ggml_type)
    t = Tensor("t", ggml_type, x.shape, ours)
    np.testing.assert_array_equal(gguf_quants.dequantize(ours, ggml_type), cpu.dequantize(t))
    np.testing.assert_array_equal(gguf_quants.quantize(x, ggml_type), ours)


@pytest.mark.parametrize("ggml_type", KERNEL_TYPES, ids=lambda t: t.name)
def test_get_rows(kernels, ggml_type):
    w = make_weight(ggml_type, 50, 64, seed=7)
    ids = np.array([3, 0, 49, 3], dtype=np.int32)
    got = kernels.get_rows(w, ids)
    np.testing.assert_array_equal(got, ref.get_rows(w, ids))
    np.testing.assert_array_equal(got, ref.dequantize(w)[ids])
    assert kernels.get_rows(w, np.array([], dtype=np.int32)).shape == (0, 64)


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
    q4k = Tensor("blk.0.ffn_down.weight", GGMLType.Q4_K, (2, 256), np.zeros((2, 144), dtype=np.uint8))
    with pytest.raises(UnsupportedError, match="blk.0.ffn_down.weight.*Q4_K"):
        kernels.matmul(q4k, np.zeros(256, dtype=np.float32))
    short = Tensor("short", GGMLType.Q8_0, (8, 64), np.zeros((8, 34), dtype=np.uint8))
    with pytest.raises(ValueError, match="short"):
        kernels.matmul(short, np.zeros(64, dtype=np.float32))
    for module in (cpu, ref):
        with pytest.raises(ValueError, match="multiple of 32"):
            module.quantize(np.zeros((2, 33), dtype=np.float32), GGMLType.Q4_0)
        with pytest.raises(UnsupportedError):
            module.quantize(np.zeros((2, 32), dtype=np.float32), GGMLType.Q5_0)


def test_read_probe_sums_every_byte(kernels):
    buf = np.arange(100_003, dtype=np.uint64).astype(np.uint8)
    assert kernels.read_probe(buf) > 0
    ones = np.ones(1 << 16, dtype=np.uint8)
    # the probe adds 8-byte words modulo 2^64: 2^16 bytes of 0x01 = 2^13 words of 0x0101010101010101
    assert kernels.read_probe(ones) == float(8192 * 0x0101010101010101 % 2**64)
    assert kernels.read_probe(ones[:-1]) == float((8191 * 0x0101010101010101 + 7) % 2**64)  # byte tail
