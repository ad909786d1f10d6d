"""One decode token of the Mamba-2 scan: the C step (kernels.steps.ssm_scan_step, csrc/ssm_scan.c) against the numpy
scan of layers/mamba2_mixer.py, on Nemotron-H 4B's mixer shape (112 heads of 64, 8 groups, state 128: a 3.5 MB
state per layer). Prints the median ms per mixer layer and token of each and their ratio.
Run: python benchmarks/bench_ssm_scan.py [THREADS] [ROUNDS]
"""
from __future__ import annotations

import statistics
import sys
import time
from contextlib import closing

import numpy as np

from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.kernels.ref import RefKernels
from powerinfer_py.layers.mamba2_mixer import Mamba2Mixer, softplus

H, P, N, G = 112, 64, 128, 8


class _NumpyScan(Mamba2Mixer):
    def __init__(self):
        self.kernels = RefKernels()  # no steps: the numpy path
        self.config = type("C", (), {"ssm_n_v_heads": H, "ssm_n_group": G, "ssm_d_state": N, "ssm_d_inner": H * P})()


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, H, P), dtype=np.float32)
    dt = softplus(rng.standard_normal((1, H), dtype=np.float32))
    A = np.full(H, -0.5, np.float32)
    B, C = rng.standard_normal((2, 1, G, N), dtype=np.float32)
    S = np.zeros((H, P, N), np.float32)
    ref = _NumpyScan()
    times: dict[str, list[float]] = {"numpy": [], "C": []}
    with closing(CpuKernels(threads)) as k:
        for _ in range(rounds):  # interleaved, so load from other processes hits both alike
            t0 = time.perf_counter()
            for _ in range(20):
                ref._scan(S, x, dt, A, B, C)
            times["numpy"].append((time.perf_counter() - t0) / 20 * 1e3)
            t0 = time.perf_counter()
            for _ in range(20):
                k.steps.ssm_scan_step(S, x[0], dt[0], A, B[0], C[0])
            times["C"].append((time.perf_counter() - t0) / 20 * 1e3)
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, m in med.items():
        print(f"{name:6s} {m:.3f} ms per mixer layer and token (median of {rounds})")
    print(f"ratio numpy / C: {med['numpy'] / med['C']:.2f}x ({threads} threads)")


if __name__ == "__main__":
    main()
