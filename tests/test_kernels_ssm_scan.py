"""The one-token Mamba-2 scan in C (csrc/ssm_scan.c, kernels.steps.ssm_scan_step) against the numpy scan of
layers/mamba2_mixer.py (its specification), on odd shapes, over several tokens so the state carries, for 1 and 2
threads; and bad inputs refused on the Python side."""
from __future__ import annotations

from contextlib import closing

import numpy as np
import pytest

from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.kernels.ref import RefKernels
from powerinfer_py.layers.mamba2_mixer import Mamba2Mixer, softplus


class _Numpy(Mamba2Mixer):
    """The numpy scan alone: the reference kernels (no steps), a config with the group count."""

    def __init__(self, H, G):
        self.kernels = RefKernels()
        self.config = type("C", (), {"ssm_n_v_heads": H, "ssm_n_group": G, "ssm_d_state": 1, "ssm_d_inner": H})()


def _inputs(rng, n, H, P, N, G):
    return (rng.standard_normal((n, H, P), dtype=np.float32), softplus(rng.standard_normal((n, H), dtype=np.float32)),
            -np.exp(rng.uniform(-2.0, 0.5, H)).astype(np.float32), rng.standard_normal((n, G, N), dtype=np.float32),
            rng.standard_normal((n, G, N), dtype=np.float32))


@pytest.mark.parametrize("H,P,N,G", [(1, 1, 1, 1), (6, 5, 7, 3), (8, 16, 16, 2), (12, 3, 33, 4), (16, 8, 128, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_steps_match_the_numpy_scan(H, P, N, G, threads):
    rng = np.random.default_rng(H * 1000 + N)
    x, dt, A, B, C = _inputs(rng, 5, H, P, N, G)
    S_ref = rng.standard_normal((H, P, N), dtype=np.float32)
    S = S_ref.copy()
    want = _Numpy(H, G)._scan(S_ref, x, dt, A, B, C)  # all 5 tokens, state in place
    with closing(CpuKernels(threads)) as k:
        got = np.stack([k.steps.ssm_scan_step(S, x[t], dt[t], A, B[t], C[t]) for t in range(5)])
    scale = np.abs(want).max() + 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)
    np.testing.assert_allclose(S, S_ref, rtol=0, atol=2e-5 * (np.abs(S_ref).max() + 1.0))


def test_thread_count_does_not_change_the_bits():
    rng = np.random.default_rng(3)
    x, dt, A, B, C = _inputs(rng, 1, 24, 16, 40, 4)
    S0 = rng.standard_normal((24, 16, 40), dtype=np.float32)
    out = []
    for threads in (1, 2, 3):
        S = S0.copy()
        with closing(CpuKernels(threads)) as k:
            out.append((k.steps.ssm_scan_step(S, x[0], dt[0], A, B[0], C[0]), S))
    for y, S in out[1:]:
        assert np.array_equal(y, out[0][0]) and np.array_equal(S, out[0][1])


def test_bad_inputs_are_refused():
    rng = np.random.default_rng(0)
    x, dt, A, B, C = _inputs(rng, 1, 6, 4, 8, 3)
    S = np.zeros((6, 4, 8), np.float32)
    with closing(CpuKernels(1)) as k:
        with pytest.raises(ValueError, match="x must be"):
            k.steps.ssm_scan_step(S, x[0].astype(np.float64), dt[0], A, B[0], C[0])
        frozen = np.zeros((6, 4, 8), np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="S must be a writable"):
            k.steps.ssm_scan_step(frozen, x[0], dt[0], A, B[0], C[0])
        with pytest.raises(ValueError, match="cannot share 4 groups"):
            k.steps.ssm_scan_step(S, x[0], dt[0], A, np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32))
        with pytest.raises(ValueError, match="C must be"):
            k.steps.ssm_scan_step(S, x[0], dt[0], A, B[0], C[0][:, :4].copy())
