"""A Q4_0 / Q8_0 predictor's fc2 . r: the dense mat-vec against fc2t_logits on fc2's copy by hidden unit
(csrc/fc2t.c), by the share of the hidden units r that are non-zero.

    python benchmarks/bench_fc2_qt.py [--type Q4_0|Q8_0] [--threads 2] [--n-ff 11008] [--rank 1024] [--rounds 15]

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
from powerinfer_py.gguf.types import GGMLType, Tensor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="Q4_0", choices=("Q4_0", "Q8_0"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ff", type=int, default=11008)
    ap.add_argument("--rank", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--matrices", type=int, default=0, help="matrices taken in turn (default: 64 MB of them)")
    ap.add_argument("--nonzero", default="0.25,0.5,0.7,0.8,0.9,1.0", help="shares of non-zero hidden units")
    a = ap.parse_args()
    k = CpuKernels(a.threads)
    rng = np.random.default_rng(0)
    ty = GGMLType[a.type]
    row = a.rank // 32 * (18 if ty == GGMLType.Q4_0 else 34)
    n_mat = a.matrices or max(2, -(-64 * 2**20 // (a.n_ff * row)))
    mats = [Tensor("fc2", ty, (a.n_ff, a.rank),
                   ref.quantize(rng.standard_normal((a.n_ff, a.rank)).astype(np.float32), ty))
            for _ in range(n_mat)]
    packed = [k.fc2t_pack(m) for m in mats]
    dense_bytes = mats[0].data.nbytes
    np_ = ref.fc2t_padded(a.n_ff)
    row_bytes = np_ // 2 if ty == GGMLType.Q4_0 else np_  # one hidden unit's codes in the copy
    scale_bytes = a.rank // 32 * np_ * 2
    print(f"fc2 {a.n_ff} x {a.rank} {a.type} ({dense_bytes / 1e6:.1f} MB), {n_mat} matrices in turn, {a.threads} "
          f"threads, {a.rounds} rounds; the step uses the copy by hidden unit up to {lib.PI_FC2_AXPY_MAX_PERCENT}% "
          f"non-zero")
    print(f"{'non-zero':>8} {'mat-vec us':>11} {'GB/s':>6} {'copy us':>8} {'MB read':>8} {'GB/s':>6} {'speed-up':>9}")
    for share in (float(s) for s in a.nonzero.split(",")):
        rs = []
        for _ in range(n_mat):
            r = np.abs(rng.standard_normal(a.rank)).astype(np.float32)
            r[rng.permutation(a.rank)[:round(a.rank * (1 - share))]] = 0
            rs.append(r)
        times = {"matvec": [], "copy": []}
        for rnd in range(a.rounds):
            for name in (("matvec", "copy") if rnd % 2 else ("copy", "matvec")):
                t0 = time.perf_counter()
                for m, q, r in zip(mats, packed, rs):
                    if name == "matvec":
                        k.matmul(m, r)
                    else:
                        k.fc2t_logits(q, r)
                times[name].append((time.perf_counter() - t0) / n_mat)
        mv, qt = statistics.median(times["matvec"]), statistics.median(times["copy"])
        read = np.mean([np.count_nonzero(r) for r in rs]) * row_bytes + scale_bytes
        print(f"{share:8.0%} {mv * 1e6:11.0f} {dense_bytes / mv / 1e9:6.1f} {qt * 1e6:8.0f} {read / 1e6:8.2f} "
              f"{read / qt / 1e9:6.1f} {mv / qt:8.2f}x")
    k.close()


if __name__ == "__main__":
    main()
