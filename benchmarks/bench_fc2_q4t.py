"""A Q4_0 predictor's fc2 . r: the dense Q4_0 mat-vec against q4t_logits on the Q4T copy (csrc/fc2_q4t.c),
by the share of the hidden units r that are non-zero.

    python benchmarks/bench_fc2_q4t.py [--threads 2] [--n-ff 11008] [--rank 1024] [--rounds 15]

Several random matrices of the given shape (7B: 11008 x 1024, 6.3 MB each in Q4_0; enough of them that they
do not fit in the last-level cache, so each call reads from memory, as in a decode) are taken in turn; the two
methods alternate round by round (order swapped every round) and the medians over rounds are printed, with
the bytes each method reads per call and its rate on them. The choice the one-token step makes
(PI_FC2_AXPY_MAX_PERCENT) is printed beside it.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from powerinfer_py.kernels import ref
from powerinfer_py.kernels.cpu import CpuKernels, lib
from powerinfer_py.tensor import GGMLType, Tensor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ff", type=int, default=11008)
    ap.add_argument("--rank", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--matrices", type=int, default=0, help="matrices taken in turn (default: 64 MB of them)")
    ap.add_argument("--nonzero", default="0.25,0.5,0.7,0.8,0.9,1.0", help="shares of non-zero hidden units")
    a = ap.parse_args()
    k = CpuKernels(a.threads)
    rng = np.random.default_rng(0)
    row = a.rank // 32 * 18
    n_mat = a.matrices or max(2, -(-64 * 2**20 // (a.n_ff * row)))
    mats = [Tensor("fc2", GGMLType.Q4_0, (a.n_ff, a.rank),
                   ref.quantize(rng.standard_normal((a.n_ff, a.rank)).astype(np.float32), GGMLType.Q4_0))
            for _ in range(n_mat)]
    packed = [k.q4t_pack(m) for m in mats]
    dense_bytes = mats[0].data.nbytes
    scale_bytes = a.rank // 32 * ref.q4t_padded(a.n_ff) * 2
    print(f"fc2 {a.n_ff} x {a.rank} Q4_0 ({dense_bytes / 1e6:.1f} MB), {n_mat} matrices in turn, {a.threads} threads, "
          f"{a.rounds} rounds; the step uses the Q4T copy up to {lib.PI_FC2_AXPY_MAX_PERCENT}% non-zero")
    print(f"{'non-zero':>8} {'mat-vec us':>11} {'GB/s':>6} {'q4t us':>8} {'MB read':>8} {'GB/s':>6} {'speed-up':>9}")
    for share in (float(s) for s in a.nonzero.split(",")):
        rs = []
        for _ in range(n_mat):
            r = np.abs(rng.standard_normal(a.rank)).astype(np.float32)
            r[rng.permutation(a.rank)[:round(a.rank * (1 - share))]] = 0
            rs.append(r)
        times = {"matvec": [], "q4t": []}
        for rnd in range(a.rounds):
            for name in (("matvec", "q4t") if rnd % 2 else ("q4t", "matvec")):
                t0 = time.perf_counter()
                for m, q, r in zip(mats, packed, rs):
                    if name == "matvec":
                        k.matmul(m, r)
                    else:
                        k.q4t_logits(q, r)
                times[name].append((time.perf_counter() - t0) / n_mat)
        mv, qt = statistics.median(times["matvec"]), statistics.median(times["q4t"])
        read = np.mean([np.count_nonzero(r) for r in rs]) * ref.q4t_padded(a.n_ff) // 2 + scale_bytes
        print(f"{share:8.0%} {mv * 1e6:11.0f} {dense_bytes / mv / 1e9:6.1f} {qt * 1e6:8.0f} {read / 1e6:8.2f} "
              f"{read / qt / 1e9:6.1f} {mv / qt:8.2f}x")
    k.close()


if __name__ == "__main__":
    main()
