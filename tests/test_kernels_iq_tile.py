"""The I-quant prefill path of csrc/matmul_iq_tile.h (super-blocks unpacked once per group of 8 tiles of 8
tokens, activations offset to unsigned, 16 rows reduced at once): bit for bit the one-token (decode) results,
dense and row-gathered, across a token group boundary, a partial tile, a partial span and a partial row block."""
import numpy as np
import pytest

from powerinfer_py.kernels import ref, ref_iq
from powerinfer_py.gguf.types import Tensor

from test_kernels_iq import random_iq

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built")


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def kernels(request):
    k = cpu.CpuKernels(request.param)
    yield k
    k.close()


@pytest.mark.parametrize("ggml_type", ref_iq.IQ_TYPES, ids=lambda t: t.name)
def test_prefill_groups_match_decode(kernels, ggml_type):
    """75 tokens (a group of 64, then 8 + 3), 37 rows (16 + 16 + 5), 9 super-blocks (a span of 8, then 1)."""
    n_rows, n_cols, n_tok = 37, 9 * 256, 75
    w = random_iq(ggml_type, n_rows, n_cols, seed=5)
    x = np.random.default_rng(6).standard_normal((n_tok, n_cols), dtype=np.float32)
    y = kernels.matmul(w, x)
    one = np.stack([kernels.matmul(w, x[t]) for t in range(n_tok)])
    np.testing.assert_array_equal(y, one)
    rows = np.array([0, 1, 2, 4, 5, 8, 9, 11, 16, 17, 20, 22, 30, 31, 33, 35, 36], np.int32)  # 16 + 1
    np.testing.assert_array_equal(kernels.matmul_rows(w, rows, x), one[:, rows])
    want = ref.matmul(w, x)
    bound = (n_cols / 8 + 16) * 2.0 ** -24 * ref.matmul_abs_terms(w, x) + 1e-30
    assert (np.abs(y - want) <= bound).all()


@pytest.mark.parametrize("ggml_type", [ref_iq.IQ_TYPES[0], ref_iq.IQ_TYPES[-1]], ids=lambda t: t.name)
def test_expert_groups_match_per_expert_calls(kernels, ggml_type):
    """Expert groups of 3, 12 and 70 tokens in one call (the per-thread work areas sit after the quantized
    activations of all 85 tokens; a group of KT tokens or fewer takes the other path): each group's rows have the
    bits of matmul on that expert's slice."""
    n_expert, n_rows, n_cols = 3, 20, 2 * 256
    flat = random_iq(ggml_type, n_expert * n_rows, n_cols, seed=7)
    w = Tensor("w", ggml_type, (n_expert, n_rows, n_cols), flat.data.reshape(n_expert, n_rows, -1))
    x = np.random.default_rng(8).standard_normal((85, n_cols), dtype=np.float32)
    experts, tok_off = np.array([2, 0, 1], np.int32), np.array([0, 3, 15, 85], np.int64)
    y = kernels.matmul_experts(w, experts, tok_off, x)
    for g, e in enumerate(experts):
        sl = Tensor("w", ggml_type, (n_rows, n_cols), flat.data[e * n_rows:(e + 1) * n_rows])
        np.testing.assert_array_equal(y[tok_off[g]:tok_off[g + 1]], kernels.matmul(sl, x[tok_off[g]:tok_off[g + 1]]))
