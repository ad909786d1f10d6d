"""Prefill matmul A/B of two source trees: GMAC/s of each build, alternating, and whether their outputs agree.

    python benchmarks/bench_prefill_ab.py OLD_TREE NEW_TREE [--types Q4_K,Q5_K,Q6_K]
        [--shapes 4096x4096,4096x11008,11008x4096] [--threads 1,2] [--n-tok 64] [--rounds 5] [--reps 5]

Each tree must hold a built extension (powerinfer_py/_pi*.so). Two builds must never share a process (their
thread pools disturb each other), so every measurement is a child process of one tree: it makes the same
random weight and activations (fixed seed), times `reps` calls of pi_timed_matmul (C-timed, one pi_matmul) after
a warm-up, and reports the median wall GMAC/s, the median CPU-time GMAC/s (process CPU time per call, divided by
the threads: steadier than wall time when other jobs share the cores) and a hash of the output. The trees take
turns for `rounds` rounds; the medians over rounds are printed with new / old, and "bits: same" when every
output hash matched.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(tree: str, type_name: str, shape: str, threads: int, n_tok: int, reps: int) -> None:
    """Runs in a child process with `tree` first on sys.path: prints 'wall cpu hash'."""
    sys.path[:0] = [tree, str(Path(tree) / "benchmarks")]
    import numpy as np
    from bench_kernels import random_weight
    from powerinfer_py.kernels import cpu
    from powerinfer_py.gguf.types import GGMLType

    n_rows, n_cols = map(int, shape.split("x"))
    ty = GGMLType[type_name]
    rng = np.random.default_rng(1234)
    w = random_weight(ty, n_rows, n_cols, rng)
    x = rng.standard_normal((n_tok, n_cols), dtype=np.float32)
    y = np.zeros((n_tok, n_rows), np.float32)
    lib, ffi = cpu.lib, cpu.ffi
    pool = lib.pi_pool_new(threads)
    wd = np.ascontiguousarray(w.data)
    args = (pool, int(ty), ffi.from_buffer(wd), n_rows, n_cols, ffi.from_buffer("float[]", x), n_tok,
            ffi.from_buffer("float[]", y))
    lib.pi_timed_matmul(*args)
    walls, cpus = [], []
    for _ in range(reps):
        c0 = time.process_time()
        walls.append(lib.pi_timed_matmul(*args))
        cpus.append((time.process_time() - c0) / threads)
    lib.pi_pool_free(pool)
    macs = n_rows * n_cols * n_tok / 1e9
    print(f"{macs / statistics.median(walls):.2f} {macs / max(statistics.median(cpus), 1e-9):.2f} "
          f"{hashlib.sha256(y.tobytes()).hexdigest()[:16]}")


def measure(tree: str, *args) -> tuple[float, float, str]:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, __file__, "--child", tree, *map(str, args)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), out[2]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        tree, type_name, shape, threads, n_tok, reps = sys.argv[2:8]
        child(tree, type_name, shape, int(threads), int(n_tok), int(reps))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--shapes", default="4096x4096,4096x11008,11008x4096", help="rows x cols, comma-separated")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--n-tok", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5, help="timed calls per child (median)")
    a = ap.parse_args()
    trees = [str(Path(a.old).resolve()), str(Path(a.new).resolve())]
    print(f"{'type':7} {'shape':>11} {'thr':>3}  {'wall GMAC/s old -> new':>24}  {'cpu GMAC/s old -> new':>24}  bits")
    for type_name in a.types.split(","):
        for shape in a.shapes.split(","):
            for threads in map(int, a.threads.split(",")):
                res: list[list[tuple[float, float, str]]] = [[], []]
                for _ in range(a.rounds):
                    for k, tree in enumerate(trees):
                        res[k].append(measure(tree, type_name, shape, threads, a.n_tok, a.reps))
                wall = [statistics.median(r[0] for r in res[k]) for k in (0, 1)]
                cpu_ = [statistics.median(r[1] for r in res[k]) for k in (0, 1)]
                same = len({r[2] for r in res[0] + res[1]}) == 1
                print(f"{type_name:7} {shape:>11} {threads:>3}  {wall[0]:7.1f} -> {wall[1]:6.1f} ({wall[1] / wall[0]:.2f}x)"
                      f"  {cpu_[0]:7.1f} -> {cpu_[1]:6.1f} ({cpu_[1] / cpu_[0]:.2f}x)  {'same' if same else 'DIFFER'}",
                      flush=True)


if __name__ == "__main__":
    main()
