"""The thread pool under oversubscription: more threads than cores, so workers are often preempted and wake
after the job they were woken for has been finished by others (the caller takes every chunk that is left).
Thousands of short jobs back to back must each give the bits that the same kernel gives when the threads
are not fighting for cores, and no late worker may run a chunk of a later job with an earlier job's
function or arguments (that would show up as wrong outputs here)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from powerinfer_py.kernels import ref
from powerinfer_py.gguf.types import GGMLType, Tensor

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)


def test_back_to_back_jobs_with_more_threads_than_cores():
    n_threads = 4 * (os.cpu_count() or 1) + 1
    k, k1 = cpu.CpuKernels(n_threads), cpu.CpuKernels(1)
    rng = np.random.default_rng(0)
    # jobs big enough that workers take part (tens of microseconds); two kernels with different chunk counts and arguments, alternating, so that consecutive jobs differ
    w = Tensor("w", GGMLType.Q8_0, (768, 256), ref.quantize(rng.standard_normal((768, 256)).astype(np.float32),
                                                           GGMLType.Q8_0))
    wd = Tensor("wd", GGMLType.F32, (600, 256), rng.standard_normal((600, 256)).astype(np.float32))
    rows = np.arange(0, 600, 2, dtype=np.int32)
    xs = rng.standard_normal((8, 256)).astype(np.float32)
    hs = rng.standard_normal((8, len(rows))).astype(np.float32)
    want_mm = [k1.matmul(w, x) for x in xs]  # each output row is one chunk's: the same bits for any threads
    want_axpy = [k.axpy_rows(wd, rows, h) for h in hs]  # decode AXPY bits depend on the thread count only
    for i in range(2000):
        j = i % len(xs)
        if i % 2:
            np.testing.assert_array_equal(k.matmul(w, xs[j]), want_mm[j])
        else:
            np.testing.assert_array_equal(k.axpy_rows(wd, rows, hs[j]), want_axpy[j])
