"""pi_axpy_rows decode (csrc/axpy.c) at the edges of its work split: live-row counts around the 8-row groups and
around the part counts (one part per 16 live rows, at most 2 per thread), long rows with column tails (the
model-wide mode's q|k|v and gate|up rows), against kernels/ref.py, and the bits that must hold: one thread equals
the batched path token by token, and every thread count repeats itself exactly."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py.kernels import ref
from powerinfer_py.gguf.types import GGMLType, Tensor

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

EPS32 = 2.0 ** -24
TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0)
# live rows: below, at and past one 8-row group and the part thresholds (16 rows per part, 2 parts per thread)
COUNTS = (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 95, 129)


def weight(ggml_type: GGMLType, n_rows: int, n_cols: int, seed: int) -> Tensor:
    w = np.random.default_rng(seed).standard_normal((n_rows, n_cols), dtype=np.float32)
    return Tensor("w_t", ggml_type, (n_rows, n_cols), ref.quantize(w, ggml_type))


def within_bound(w: Tensor, rows: np.ndarray, h: np.ndarray, y: np.ndarray) -> None:
    wd = np.abs(ref.dequantize(w).astype(np.float64))[rows]
    bound = (len(rows) + 2) * EPS32 * (np.abs(h.astype(np.float64)) @ wd) + 1e-30
    err = np.abs(y.astype(np.float64) - ref.axpy_rows(w, rows, h))
    assert (err <= bound).all(), f"{w.type.name} {w.shape} {len(rows)} rows: max err {err.max()}"


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_decode_group_and_part_edges(pools, ggml_type):
    # 160 columns: two 64-column tiles and a 32-column tail (float types: a masked or scalar tail too at 168)
    n_cols = 168 if ggml_type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16) else 160
    w = weight(ggml_type, 200, n_cols, seed=1)
    rng = np.random.default_rng(2)
    for n in COUNTS:
        rows = np.sort(rng.choice(200, n, replace=False)).astype(np.int32)
        h = rng.standard_normal((3, n), dtype=np.float32)
        h[:, rng.random(n) < 0.2] = 0.0  # rows dead for every token: never read, outside the split
        batch = pools[1].axpy_rows(w, rows, h)
        for t in range(3):
            one = pools[1].axpy_rows(w, rows, np.ascontiguousarray(h[t]))
            np.testing.assert_array_equal(one, batch[t])  # one thread: the plain chain, as the batch
            within_bound(w, rows, h[t], one)
            for k in (2, 3):
                y = pools[k].axpy_rows(w, rows, np.ascontiguousarray(h[t]))
                within_bound(w, rows, h[t], y)
                np.testing.assert_array_equal(pools[k].axpy_rows(w, rows, np.ascontiguousarray(h[t])), y)


@pytest.mark.parametrize("ggml_type", (GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0), ids=lambda t: t.name)
def test_decode_long_rows(pools, ggml_type):
    """Rows as long as the wide mode's fused inputs (q|k|v of a 4096-wide model: 12288 columns) plus a tail
    of one block, half of the rows dropped."""
    n_rows, n_cols = 150, 12288 + 32
    w = weight(ggml_type, n_rows, n_cols, seed=3)
    rng = np.random.default_rng(4)
    rows = np.sort(rng.choice(n_rows, n_rows // 2, replace=False)).astype(np.int32)
    h = rng.standard_normal(len(rows), dtype=np.float32)
    y1 = pools[1].axpy_rows(w, rows, h)
    within_bound(w, rows, h, y1)
    for k in (2, 3):
        y = pools[k].axpy_rows(w, rows, h)
        within_bound(w, rows, h, y)
        for _ in range(3):
            np.testing.assert_array_equal(pools[k].axpy_rows(w, rows, h), y)
