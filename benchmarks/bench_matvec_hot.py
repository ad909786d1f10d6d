"""Mat-vec compute ceiling per block type: one thread, a weight matrix that stays in L2, best of many calls.

    python benchmarks/bench_matvec_hot.py [--rows 192] [--cols 4096] [--calls 400] [--rounds 3]

(`--types Q4_K,IQ4_XS`: the 256-weight super-block types too, random blocks.)
A decode mat-vec is memory-bound only if the kernel digests bytes faster than DRAM delivers them: this prints the
GB/s of weight bytes one thread gets through when the weights are already in cache (each call timed in C,
csrc/bench.c, as bench_sparse.py does), to compare with a thread's share of the read probe (benchmarks/bench_kernels.py). The best of `calls` x `rounds`
runs, so other work on the machine shows up less than in a median.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the source tree, unless installed

from bench_kernels import K_F16_FIELDS  # benchmarks/, beside this script

from powerinfer_py.kernels import cpu
from powerinfer_py.kernels.ref_iq import put_iq1m_d
from powerinfer_py.gguf.types import GGMLType, Tensor

TYPES = ("Q4_0", "Q5_0", "Q4_1", "Q5_1", "IQ4_NL", "MXFP4", "Q8_0")


def weight(name: str, n_rows: int, n_cols: int, rng) -> Tensor:
    t = GGMLType[name]
    if t in K_F16_FIELDS:  # IQ4_NL, MXFP4, K-quants, IQ4_XS: not produced by quantize(): random blocks, sane f16 scales
        block, size = GGML_QUANT_SIZES[t]
        b = rng.integers(0, 256, (n_rows * n_cols // block, size), dtype=np.uint8)
        for off in K_F16_FIELDS[t]:
            b[:, off:off + 2] = np.array([0.01], np.float16).view(np.uint8)
        if t == GGMLType.MXFP4:  # its E8M0 exponent byte: scale 2^-7
            b[:, 0] = 120
        if t == GGMLType.IQ1_M:  # its f16 d: the top nibbles of the scale words
            put_iq1m_d(b, np.full(len(b), 0.01))
        return Tensor("w", t, (n_rows, n_cols), b.reshape(n_rows, -1))
    return Tensor("w", t, (n_rows, n_cols), cpu.quantize(rng.standard_normal((n_rows, n_cols), dtype=np.float32), t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=192)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", default=",".join(TYPES))
    args = ap.parse_args()
    k = cpu.CpuKernels(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.cols, dtype=np.float32)
    names = args.types.split(",")
    best = dict.fromkeys(names, 0.0)
    for _ in range(args.rounds):  # the types take turns, so a busy stretch of the host hits all of them
        for name in names:
            w = weight(name, args.rows, args.cols, rng)
            t_min = min(_timed(k, w, x) for _ in range(args.calls))
            best[name] = max(best[name], w.data.nbytes / t_min / 1e9)
    print(f"1 thread, {args.rows} x {args.cols} weights in cache, best of {args.rounds} x {args.calls} calls")
    for name in names:
        print(f"{name:<7} {best[name]:6.1f} GB/s")
    k.close()


def _timed(k, w, x) -> float:
    y = np.empty(w.shape[0], np.float32)
    return cpu.lib.pi_timed_matmul(k._pool, int(w.type), cpu.ffi.from_buffer(w.data), w.shape[0], w.shape[1],
                                   cpu.ffi.from_buffer("float[]", x), 1, cpu.ffi.from_buffer("float[]", y))


if __name__ == "__main__":
    main()
