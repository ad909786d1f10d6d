"""The I-quants IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S (csrc/matmul_iq.c, matmul_iq.h): the generated grid header
is the gguf package's grids, the sign-index rule is gguf's ksigns table, and C agrees with the numpy reference
and with gguf's decoder on random valid blocks: dequantize, dense, row-gathered and prefill products, the
sparse AXPY, 1 and 2 threads, bit for bit between paths. (test_kernels_matmul / _sparse run the generic K-quant
checks on these types too.)"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from gguf import quants as gguf_quants

from powerinfer_py.kernels import ref, ref_iq
from powerinfer_py.gguf.types import GGML_QUANT_SIZES, GGMLType, Tensor

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built")

CSRC = Path(__file__).resolve().parent.parent / "csrc"
IQ_TYPES = ref_iq.IQ_TYPES


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def kernels(request):
    k = cpu.CpuKernels(request.param)
    yield k
    k.close()


def random_iq(ggml_type, n_rows, n_cols, seed) -> Tensor:
    """Random blocks: any grid index, sign and scale byte is valid; only the f16 d (bytes 0..1; IQ1_M: the top
    nibbles of its four scale words, bytes 48..55) is set finite."""
    rng = np.random.default_rng(seed)
    _, size = GGML_QUANT_SIZES[ggml_type]
    b = rng.integers(0, 256, (n_rows * n_cols // 256, size), dtype=np.uint8)
    d = rng.uniform(-0.02, 0.02, len(b)).astype(np.float16)
    if ggml_type == GGMLType.IQ1_M:
        ref_iq.put_iq1m_d(b, d)
    else:
        b[:, :2] = d.view(np.uint8).reshape(-1, 2)
    return Tensor("w", ggml_type, (n_rows, n_cols), b.reshape(n_rows, -1))


def test_grid_header_is_gguf(monkeypatch):
    """The committed csrc/iq_grids.h is what build_ffi.py generates from the installed gguf package."""
    text = (CSRC / "iq_grids.h").read_text()
    monkeypatch.setenv("PI_IQ_GRIDS", "0")  # importing build_ffi must not rewrite the file under test
    spec = importlib.util.spec_from_file_location("build_ffi_for_test", CSRC / "build_ffi.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert (CSRC / "iq_grids.h").read_text() == text == build.iq_grids_text()
    # and the packing: entry 1 of IQ3_XXS's grid, value j in byte j
    g = ref_iq.grid(GGMLType.IQ3_XXS)[1]
    packed = int(g[0]) | int(g[1]) << 8 | int(g[2]) << 16 | int(g[3]) << 24
    row = text.split("pi_iq3xxs_grid[256] = {")[1].split(",")[1].strip()
    assert int(row, 16) == packed


def test_sign_rule_is_gguf_table():
    want = np.frombuffer(gguf_quants.IQ2_XXS.ksigns, np.uint8)
    np.testing.assert_array_equal(ref_iq.sign_bytes(np.arange(128)), want)


@pytest.mark.parametrize("ggml_type", IQ_TYPES, ids=lambda t: t.name)
def test_dequantize_is_gguf(ggml_type):
    w = random_iq(ggml_type, 7, 768, seed=1)
    want = gguf_quants.dequantize(w.data, ggml_type)
    np.testing.assert_array_equal(ref.dequantize(w), want)
    np.testing.assert_array_equal(cpu.dequantize(w), want)
    ids = np.array([6, 0, 3], np.int32)
    np.testing.assert_array_equal(cpu.CpuKernels(1).get_rows(w, ids), want[ids])


@pytest.mark.parametrize("ggml_type", IQ_TYPES, ids=lambda t: t.name)
def test_matmul_paths_agree(kernels, ggml_type):
    """Odd row count, 10 super-blocks (a partial span), 11 tokens (a full tile and a partial one): the prefill
    result is within the f32 bound of the reference and has the bits of the one-token calls, dense and gathered;
    the dot products equal the dequantized weights' times the Q8_K activations (exact integers per block)."""
    n_rows, n_cols, n_tok = 45, 10 * 256, 11
    w = random_iq(ggml_type, n_rows, n_cols, seed=2)
    x = np.random.default_rng(3).standard_normal((n_tok, n_cols), dtype=np.float32)
    y = kernels.matmul(w, x)
    want = ref.matmul(w, x)
    bound = (n_cols / 8 + 16) * 2.0 ** -24 * ref.matmul_abs_terms(w, x) + 1e-30
    assert (np.abs(y - want) <= bound).all()
    one = np.stack([kernels.matmul(w, x[t]) for t in range(n_tok)])
    np.testing.assert_array_equal(y, one)
    rows = np.array([0, 1, 15, 16, 17, 30, 44], np.int32)
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x), one[:, rows])
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x[4]), one[4, rows])
    # the same sums from gguf's dequantized weights and the Q8_K activations (f64: exact up to the scale products)
    dx, qx, _ = ref.quantize_q8_K_blocks(x.reshape(-1, 256))
    xq = (qx.astype(np.float64) * dx.astype(np.float64)[:, None]).reshape(n_tok, n_cols)
    wv = gguf_quants.dequantize(w.data, ggml_type).astype(np.float64)
    np.testing.assert_allclose(y, xq @ wv.T, rtol=0, atol=1e-4 * np.abs(xq).max() * np.abs(wv).sum(1).max())


@pytest.mark.parametrize("ggml_type", IQ_TYPES, ids=lambda t: t.name)
def test_sparse_axpy(kernels, ggml_type):
    w = random_iq(ggml_type, 9, 512, seed=4)
    rows = np.array([0, 2, 3, 8], np.int32)
    h = np.random.default_rng(5).standard_normal((2, 4), dtype=np.float32)
    h[1, 1] = 0.0
    y = kernels.axpy_rows(w, rows, h)
    wv = gguf_quants.dequantize(w.data, ggml_type)[rows].astype(np.float64)
    np.testing.assert_allclose(y, h.astype(np.float64) @ wv, rtol=1e-5, atol=1e-6)
