"""CUDA kernel throughput against the device's own copy bandwidth, measured in the same run.

For each weight type (F16, Q8_0, Q4_0) at the 7B FFN shape (11008 rows x 4096 columns, ffn_up/ffn_gate):
  1. check: the kernel's result against numpy (dequantized weights, f64) before timing anything;
  2. time: dense mat-vec, row-gather mat-vec over a 10% active list, AXPY over 10% of ffn_down_t's rows;
     each launched ITERS times back to back on one stream, one sync, median of REPEATS;
  3. print GB/s on the bytes each kernel must read, beside a device-to-device copy of the same tensor
     (read + write counted), and torch's F16 mat-vec on the same shape when torch is installed.

    make cuda && python benchmarks/bench_cuda.py [--iters 200] [--repeats 5]

Needs a CUDA device; on a machine without one it says why and exits 0.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powerinfer_py.kernels import cuda as C  # noqa: E402
from powerinfer_py.kernels import ref  # noqa: E402
from powerinfer_py.gguf.types import GGMLType, Tensor  # noqa: E402

N_FF, N_EMBD, ACTIVE = 11008, 4096, 0.10
TYPES = (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0)


def _timed(a: C.Arena, launch, iters: int, repeats: int) -> float:
    """Median seconds per launch."""
    launch()
    a.sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            launch()
        a.sync()
        times.append((time.perf_counter() - t0) / iters)
    return float(np.median(times))


def _torch_f16(iters: int, repeats: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    w = torch.randn(N_FF, N_EMBD, device="cuda", dtype=torch.float16)
    x = torch.randn(N_EMBD, device="cuda", dtype=torch.float16)
    torch.mv(w, x)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mv(w, x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
    return float(np.median(times))


def bench_type(ty, iters: int, repeats: int, rng) -> None:
    x_host = rng.standard_normal(N_EMBD).astype(np.float32)
    w = Tensor("w", ty, (N_FF, N_EMBD), ref.quantize(rng.standard_normal((N_FF, N_EMBD)).astype(np.float32), ty))
    planar = C.planar(w)
    rows = np.sort(rng.permutation(N_FF)[:int(ACTIVE * N_FF)]).astype(np.int32)
    h = rng.standard_normal(len(rows)).astype(np.float32)
    a = C.Arena(3 * planar.nbytes + (16 << 20))
    try:
        lib, s = a.lib, a.stream

        def f(p):
            return a.ffi.cast("float *", p)

        def i32(p):
            return a.ffi.cast("int32_t *", p)

        pw, px, pr, ph = a.upload(planar), a.upload(x_host), a.upload(rows), a.upload(h)
        py, part, pcopy = a.alloc(4 * N_FF), a.alloc(4 * 64 * N_EMBD), a.alloc(planar.nbytes)
        t = int(ty)
        def dense():
            a.check(lib.pi_cuda_matvec(t, pw, N_FF, N_EMBD, f(px), f(py), 0, s), "matvec")

        def gather():
            a.check(lib.pi_cuda_matvec_rows(t, pw, N_FF, N_EMBD, i32(pr), len(rows), a.ffi.NULL, f(px), f(py), s),
                    "matvec_rows")

        def axpy():
            a.check(lib.pi_cuda_axpy_rows(t, pw, N_FF, N_EMBD, i32(pr), len(rows), a.ffi.NULL, f(ph), 64, f(part),
                                          f(py), s), "axpy")

        def copy():
            a.check(lib.pi_cuda_memcpy_d2d(pcopy, pw, planar.nbytes, s), "copy")

        # check before timing
        dense()
        y = np.empty(N_FF, np.float32)
        a.download(py, y)
        a.sync()
        wd = ref.dequantize(w).astype(np.float64)
        want = wd @ x_host
        err = np.max(np.abs(y - want) / (np.abs(wd) @ np.abs(x_host) + 1e-30))
        print(f"{ty.name}: dense check max relative error {err:.2e}" + ("" if err < 1e-5 else "  FAILED"))
        t_copy = _timed(a, copy, iters, repeats)
        copy_bw = 2 * planar.nbytes / t_copy
        sel_bytes = len(rows) * planar.nbytes // N_FF
        for name, fn, nbytes in (("dense matvec", dense, planar.nbytes), ("gather matvec 10%", gather, sel_bytes),
                                 ("axpy 10%", axpy, sel_bytes)):
            sec = _timed(a, fn, iters, repeats)
            bw = nbytes / sec
            print(f"  {name:<18} {sec * 1e6:8.1f} us  {bw / 1e9:7.1f} GB/s  {100 * bw / copy_bw:5.1f}% of d2d copy "
                  f"({copy_bw / 1e9:.0f} GB/s)")
    finally:
        a.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    st = C.cuda_status()
    if not st.available:
        print(f"bench_cuda: nothing to measure: {st.reason}")
        return 0
    print(f"device: {st.reason}; shape {N_FF} x {N_EMBD}; median of {args.repeats} x {args.iters} launches")
    rng = np.random.default_rng(0)
    for ty in TYPES:
        bench_type(ty, args.iters, args.repeats, rng)
    t = _torch_f16(args.iters, args.repeats)
    if t is not None:
        print(f"torch F16 mv: {t * 1e6:.1f} us, {N_FF * N_EMBD * 2 / t / 1e9:.1f} GB/s")
    else:
        print("torch not installed: no torch F16 comparison")
    return 0


if __name__ == "__main__":
    sys.exit(main())
