"""Sparse FFN kernel benchmark: AXPY over ffn_down_t rows and the row-gather mat-vec, against dense.

    python benchmarks/bench_sparse.py [--threads N] [--repeat R] [--types F16,Q8_0,Q4_0] [--n-embd 4096 --n-ff 11008]

One decode token of a LLaMA-7B FFN layer (n_embd 4096, n_ff 11008) at 0/50/80/90/95% sparsity. The active
sets are random with a power-law skew: neuron i fires with probability ~ (i + 1)^-0.5 (scaled to the
target count), so the hot neurons cluster at low indices, the case that unbalances an index split.
For each kernel the table prints the median time, GB/s on the bytes it touches (active rows x row bytes),
that as % of pi_read_probe's bandwidth measured in the same run, and the time relative to the dense kernel:
  axpy:  pi_axpy_rows on ffn_down_t [n_ff, n_embd] vs pi_matmul on ffn_down [n_embd, n_ff]
  rows:  pi_matmul_rows on ffn_gate [n_ff, n_embd] vs pi_matmul on the whole ffn_gate
  load:  pi_read_rows_probe over the same rows with no arithmetic (the best of prefetching 4 rows ahead, as
         the gathers do, and of the hardware prefetcher alone): what the access pattern itself allows. Columns
         "load % probe" and "% of load" set each kernel against it, so a shortfall can be told apart from the
         cost of scattered rows on this host.
Every figure is the C call's own time, read in C (csrc/bench.c): timed from Python, a call on cold caches
carries ~10 us of cffi call around it, which the decode paths (kernels called from C) do not pay; the
end-to-end benchmark counts everything.
Every timed call starts with cold caches (a buffer of 4x the L3 is read between calls), as in a real model
whose layers together are far larger than the caches. All configurations of a type and the probe are timed
round-robin, one call each per round, so drifts of a shared machine's bandwidth hit them alike. Targets: >= 70% of the probe at 50-95% sparsity and
dense/sparse time ratio <= 1.10 at 0%.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the source tree, unless installed

from powerinfer_py.kernels import cpu  # noqa: E402
from powerinfer_py.gguf.types import GGMLType, Tensor  # noqa: E402
from roundrobin import round_robin  # noqa: E402  (benchmarks/, beside this script)

SPARSITY = (0.0, 0.5, 0.8, 0.9, 0.95)


def random_weight(ggml_type: GGMLType, n_rows: int, n_cols: int, rng, name: str) -> Tensor:
    parts = [cpu.quantize(rng.standard_normal((min(1024, n_rows - r), n_cols), dtype=np.float32), ggml_type)
             for r in range(0, n_rows, 1024)]
    return Tensor(name, ggml_type, (n_rows, n_cols), np.concatenate(parts))


def active_set(n_ff: int, sparsity: float, rng) -> np.ndarray:
    """About (1 - sparsity) * n_ff ascending neuron ids, neuron i weighted (i + 1)^-0.5 (hot ones first)."""
    n = int(round((1.0 - sparsity) * n_ff))
    if n >= n_ff:
        return np.arange(n_ff, dtype=np.int32)
    p = (np.arange(n_ff) + 1.0) ** -0.5
    return np.sort(rng.choice(n_ff, size=n, replace=False, p=p / p.sum())).astype(np.int32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    ap.add_argument("--repeat", type=int, default=15, help="timed calls per figure (median)")
    ap.add_argument("--types", default="F16,Q8_0,Q4_0", help="comma-separated weight types")
    ap.add_argument("--n-embd", type=int, default=4096)
    ap.add_argument("--n-ff", type=int, default=11008)
    ap.add_argument("--sparsity", default=",".join(f"{s:g}" for s in SPARSITY), help="comma-separated fractions")
    ap.add_argument("--kernels", default="axpy,rows", help="axpy, rows or both")
    ap.add_argument("--l3-mib", type=int, default=32, help="last-level cache size (evicted between calls)")
    ap.add_argument("--row-sizes", default="", help="instead of the kernels: the load-only probe over n_ff rows "
                    "of each of these byte sizes (comma-separated, e.g. 2304,6912: a Q4_0 row of ffn_down_t, and "
                    "a neuron's gate, up and down rows side by side), to see what a longer-row layout would allow")
    ap.add_argument("--ahead", default="", help="with --row-sizes: one column per prefetch distance (rows ahead, "
                    "comma-separated, 0 = the hardware prefetcher alone) instead of the best of 0 and 4")
    ap.add_argument("--compute", action="store_true", help="instead of the table: each kernel's arithmetic rate "
                    "(G weights/s per thread) over 8 rows that stay in L1, read 256 times each, to tell "
                    "compute-bound kernels from memory-bound ones")
    args = ap.parse_args()
    if args.row_sizes:
        return row_size_study(args, [int(v) for v in args.row_sizes.split(",")])
    if args.compute:
        return compute_rate(args)

    k = cpu.CpuKernels(args.threads)
    lib, ffi = cpu.lib, cpu.ffi
    rng = np.random.default_rng(0)
    probe = np.ones(256 << 20, dtype=np.uint8)
    probe_p = ffi.from_buffer(probe)
    flush = np.ones(4 * args.l3_mib << 20, dtype=np.uint8)

    def evict():
        k.read_probe(flush)

    has_rows = hasattr(lib, "pi_matmul_rows") and "rows" in args.kernels
    do_axpy = "axpy" in args.kernels
    print(f"threads {k.n_threads}, layer n_embd {args.n_embd} n_ff {args.n_ff}, median of {args.repeat} "
          f"interleaved rounds{'' if hasattr(lib, 'pi_matmul_rows') else ' (pi_matmul_rows not built: row-gather skipped)'}")
    print(f"{'type':5} {'kernel':5} {'sparsity':>8} {'active':>6} {'time us':>9} {'GB/s':>6} {'% probe':>7} "
          f"{'vs dense':>8} {'load % probe':>12} {'% of load':>9}")
    for name in args.types.split(","):
        ty = GGMLType[name.strip().upper()]
        w_t = random_weight(ty, args.n_ff, args.n_embd, rng, "ffn_down_t")   # also serves as ffn_gate
        w_d = random_weight(ty, args.n_embd, args.n_ff, rng, "ffn_down")
        rb = w_t.data.nbytes // args.n_ff
        x_ff = rng.standard_normal(args.n_ff, dtype=np.float32)
        x_embd = rng.standard_normal(args.n_embd, dtype=np.float32)
        wp = ffi.from_buffer(w_t.data)
        fns = {"probe": lambda: lib.pi_timed_read_probe(k._pool, probe_p, probe.nbytes)}
        wdp = ffi.from_buffer(w_d.data)
        y_dense = (np.empty(args.n_embd, np.float32), np.empty(args.n_ff, np.float32))
        if do_axpy:  # dense references as C calls too
            fns["dense axpy"] = lambda: lib.pi_timed_matmul(k._pool, int(ty), wdp, args.n_embd, args.n_ff,
                                                      ffi.from_buffer("float[]", x_ff), 1,
                                                      ffi.from_buffer("float[]", y_dense[0]))
        if has_rows:
            fns["dense rows"] = lambda: lib.pi_timed_matmul(k._pool, int(ty), wp, args.n_ff, args.n_embd,
                                                      ffi.from_buffer("float[]", x_embd), 1,
                                                      ffi.from_buffer("float[]", y_dense[1]))
        sizes = {}
        for s in (float(v) for v in args.sparsity.split(",")):
            rows = active_set(args.n_ff, s, rng)
            h = np.abs(rng.standard_normal(len(rows), dtype=np.float32)) + np.float32(0.01)
            sizes[s] = (len(rows), len(rows) * rb)
            for ahead in (0, 4):  # the same rows read with no arithmetic
                fns[("load", s, ahead)] = (lambda rows=rows, ahead=ahead: lib.pi_timed_read_rows_probe(
                    k._pool, wp, rb, ffi.from_buffer("int32_t[]", rows), len(rows), ahead))
            if do_axpy:
                y_embd = np.empty(args.n_embd, np.float32)
                fns[("axpy", s)] = (lambda rows=rows, h=h, y=y_embd: lib.pi_timed_axpy_rows(
                    k._pool, int(ty), wp, args.n_embd, ffi.from_buffer("int32_t[]", rows),
                    ffi.from_buffer("float[]", h), len(rows), 1, ffi.from_buffer("float[]", y)))
            if has_rows:
                y = np.empty(len(rows), np.float32)
                fns[("rows", s)] = (lambda rows=rows, y=y: lib.pi_timed_matmul_rows(
                    k._pool, int(ty), wp, args.n_embd, ffi.from_buffer("int32_t[]", rows), len(rows),
                    ffi.from_buffer("float[]", x_embd), 1, ffi.from_buffer("float[]", y)))
        med = {name: statistics.median(t) for name, t in round_robin(fns, args.repeat, evict, self_timed=True).items()}
        probe_gbs = probe.nbytes / med["probe"] / 1e9
        for s, (n_active, nbytes) in sizes.items():
            for kernel in ("axpy", "rows"):
                if (kernel, s) not in med:
                    continue
                t, t_dense = med[(kernel, s)], med[f"dense {kernel}"]
                gbs = nbytes / t / 1e9
                load_gbs = nbytes / min(med[("load", s, 0)], med[("load", s, 4)]) / 1e9
                print(f"{name:5} {kernel:5} {s:8.0%} {n_active:6d} {t * 1e6:9.1f} {gbs:6.1f} "
                      f"{gbs / probe_gbs:7.0%} {t / t_dense:8.2f} {load_gbs / probe_gbs:12.0%} {gbs / load_gbs:9.0%}")
        print(f"{name:5} dense: ffn_down mat-vec {med.get('dense axpy', 0) * 1e6:.1f} us, ffn_gate mat-vec "
              f"{med.get('dense rows', 0) * 1e6:.1f} us; read probe {probe_gbs:.1f} GB/s")
        del w_t, w_d


def compute_rate(args) -> None:
    """The AXPY and the row gather over a list of 2048 rows that cycles through 8 distinct rows (L1-resident),
    1 thread and all: weights converted per second, and that rate in GB/s of the type's bytes, to compare with
    what one thread reads (the probe's rate per thread)."""
    rng = np.random.default_rng(0)
    probe = np.ones(256 << 20, dtype=np.uint8)
    lib, ffi = cpu.lib, cpu.ffi
    rows = (np.arange(2048) % 8).astype(np.int32)
    h = np.ones(len(rows), np.float32)
    x = rng.standard_normal(args.n_embd, dtype=np.float32)
    y_axpy, y_rows = np.empty(args.n_embd, np.float32), np.empty(len(rows), np.float32)
    for threads in sorted({1, args.threads or os.cpu_count() or 1}):
        k = cpu.CpuKernels(threads)
        fns = {"probe": lambda k=k: lib.pi_timed_read_probe(k._pool, ffi.from_buffer(probe), probe.nbytes)}
        weights = {}
        for name in args.types.split(","):
            ty = GGMLType[name.strip().upper()]
            w = weights[name] = random_weight(ty, 8, args.n_embd, rng, "w")
            fns[("axpy", name)] = lambda k=k, ty=ty, w=w: lib.pi_timed_axpy_rows(
                k._pool, int(ty), ffi.from_buffer(w.data), args.n_embd, ffi.from_buffer("int32_t[]", rows),
                ffi.from_buffer("float[]", h), len(rows), 1, ffi.from_buffer("float[]", y_axpy))
            fns[("rows", name)] = lambda k=k, ty=ty, w=w: lib.pi_timed_matmul_rows(
                k._pool, int(ty), ffi.from_buffer(w.data), args.n_embd, ffi.from_buffer("int32_t[]", rows),
                len(rows), ffi.from_buffer("float[]", x), 1, ffi.from_buffer("float[]", y_rows))
        med = {n: statistics.median(t) for n, t in round_robin(fns, args.repeat, None, self_timed=True).items()}
        per_thread = probe.nbytes / med["probe"] / 1e9 / threads
        print(f"{threads} thread(s): read probe {per_thread:.1f} GB/s per thread")
        for name, w in weights.items():
            for kernel in ("axpy", "rows"):
                t = med[(kernel, name)]
                n_w = len(rows) * args.n_embd
                gbs = len(rows) * (w.data.nbytes // 8) / t / 1e9
                print(f"  {name:5} {kernel:5} {n_w / t / 1e9 / threads:6.1f} G weights/s per thread = "
                      f"{gbs / threads:5.1f} GB/s per thread ({gbs / threads / per_thread:.0%} of the probe's)")
        k.close()


def row_size_study(args, sizes: list[int]) -> None:
    """The load-only probe (pi_read_rows_probe, best of prefetching 4 rows ahead and none) over the same active
    sets on matrices of n_ff rows of each size, round-robin with the read probe: % of the probe per sparsity.
    With --ahead: one figure per prefetch distance instead of the best of two."""
    aheads = [int(v) for v in args.ahead.split(",")] if args.ahead else [0, 4]
    k = cpu.CpuKernels(args.threads)
    rng = np.random.default_rng(0)
    probe = np.ones(256 << 20, dtype=np.uint8)
    flush = np.ones(4 * args.l3_mib << 20, dtype=np.uint8)
    bufs = {rb: np.ones(args.n_ff * rb, dtype=np.uint8) for rb in sizes}
    sets = {float(v): active_set(args.n_ff, float(v), rng) for v in args.sparsity.split(",")}
    lib, ffi = cpu.lib, cpu.ffi
    fns = {"probe": lambda p=ffi.from_buffer(probe): lib.pi_timed_read_probe(k._pool, p, probe.nbytes)}
    for rb, buf in bufs.items():
        for s, rows in sets.items():
            for ahead in aheads:  # timed in C, like the main table (the Python wrapper checks the rows too)
                fns[(rb, s, ahead)] = (lambda p=ffi.from_buffer(buf), rb=rb, r=ffi.from_buffer("int32_t[]", rows),
                                       n=len(rows), ahead=ahead: lib.pi_timed_read_rows_probe(k._pool, p, rb, r, n, ahead))
    med = {name: statistics.median(t)
           for name, t in round_robin(fns, args.repeat, lambda: k.read_probe(flush), self_timed=True).items()}
    probe_gbs = probe.nbytes / med["probe"] / 1e9
    print(f"threads {k.n_threads}, {args.n_ff} rows, median of {args.repeat} interleaved rounds; read probe "
          f"{probe_gbs:.1f} GB/s; load only, % of the probe:")
    if not args.ahead:
        print(f"{'row bytes':>9} " + " ".join(f"{s:>6.0%}" for s in sets))
        for rb in bufs:
            pct = [len(rows) * rb / min(med[(rb, s, a)] for a in aheads) / 1e9 / probe_gbs for s, rows in sets.items()]
            print(f"{rb:9d} " + " ".join(f"{p:6.0%}" for p in pct))
        return
    print(f"{'row bytes':>9} {'ahead':>5} " + " ".join(f"{s:>6.0%}" for s in sets))
    for rb in bufs:
        for a in aheads:
            pct = [len(rows) * rb / med[(rb, s, a)] / 1e9 / probe_gbs for s, rows in sets.items()]
            print(f"{rb:9d} {a:5d} " + " ".join(f"{p:6.0%}" for p in pct))


if __name__ == "__main__":
    main()
