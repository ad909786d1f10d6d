"""Prefill A/B of two source trees, taking turns call by call: GMAC/s (or prompt tok/s) of each build and whether
their outputs agree.

    python benchmarks/bench_prefill_ab.py OLD_TREE NEW_TREE [--types Q4_K,Q5_K,Q6_K]
        [--shapes 4096x4096,4096x11008,11008x4096] [--threads 1,2] [--n-tok 64] [--rounds 9] [--reps 3]
    python benchmarks/bench_prefill_ab.py OLD_TREE NEW_TREE --model FILE.gguf [-p 128] [--threads 2] [--rounds 9]

Each tree must hold a built extension (powerinfer_py/_pi*.so). Two builds must never share a process (the same
module names; their thread pools would disturb each other), so each tree gets one worker process that lives for
the whole run: it makes every job once (the same random weights and activations in both, fixed seed; or, with
--model, loads the file with --sparse off) and then times what the parent asks for. The parent gives the
workers turns, job by job, swapping their order every round, and sleeps --pause seconds before each turn so the
other worker's pool threads have stopped spinning. A drift of the machine longer than a turn (a fraction of a
second) then hits both builds alike; measuring each build in processes of its own, minutes apart, had swung
0.77-1.41x on identical code on the shared development host.

A matmul turn is `reps` calls of pi_timed_matmul (C-timed, one pi_matmul) and reports the median wall GMAC/s,
the median CPU-time GMAC/s (process CPU time per call divided by the threads) and a hash of the output; a model
turn is one forward over the -p prompt tokens from an empty cache (tok/s) and a hash of the last logits.
Printed per job: the medians over rounds, the median of the per-round ratios new / old (the figure to quote),
and "bits: same" when every output hash matched. Two copies of the same tree give the noise floor.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


class _MatmulJobs:
    """A worker's matmul jobs: key 'TYPE SHAPE THREADS' -> prepared cffi arguments."""

    def __init__(self, types: str, shapes: str, threads: str, n_tok: int):
        import numpy as np
        from bench_kernels import random_weight
        from powerinfer_py.kernels import cpu
        from powerinfer_py.gguf.types import GGMLType

        self.lib, ffi = cpu.lib, cpu.ffi
        self.pools = {t: self.lib.pi_pool_new(t) for t in map(int, threads.split(","))}
        self.jobs, self._keep = {}, []
        for type_name in types.split(","):
            for shape in shapes.split(","):
                n_rows, n_cols = map(int, shape.split("x"))
                ty = GGMLType[type_name]
                rng = np.random.default_rng(1234)  # per job: both trees make the same operands
                w = np.ascontiguousarray(random_weight(ty, n_rows, n_cols, rng).data)
                x = rng.standard_normal((n_tok, n_cols), dtype=np.float32)
                y = np.zeros((n_tok, n_rows), np.float32)
                self._keep.append((w, x, y))
                for t, pool in self.pools.items():
                    args = (pool, int(ty), ffi.from_buffer(w), n_rows, n_cols, ffi.from_buffer("float[]", x), n_tok,
                            ffi.from_buffer("float[]", y))
                    self.jobs[f"{type_name} {shape} {t}"] = (args, n_rows * n_cols * n_tok / 1e9, t, y)
        for args, _, _, _ in self.jobs.values():
            self.lib.pi_timed_matmul(*args)  # warm-up: first touch of every buffer

    def run(self, key: str, reps: int) -> dict:
        args, gmac, threads, y = self.jobs[key]
        walls, cpus = [], []
        for _ in range(reps):
            c0 = time.process_time()
            walls.append(self.lib.pi_timed_matmul(*args))
            cpus.append((time.process_time() - c0) / threads)
        return {"rate": gmac / statistics.median(walls), "cpu": gmac / max(statistics.median(cpus), 1e-9),
                "hash": hashlib.sha256(y.tobytes()).hexdigest()[:16]}


class _ModelJobs:
    """A worker's one job: the prompt of n_tok tokens through the model file, --sparse off."""

    def __init__(self, path: str, threads: int, n_tok: int):
        import numpy as np
        from powerinfer_py import load

        self.np, self.n_tok = np, n_tok
        self.llm = load(path, threads=threads, n_ctx=n_tok + 8, sparse="off")
        vocab = self.llm.model.config.n_vocab
        self.ids = (np.arange(n_tok, dtype=np.int64) * 7919 % max(vocab - 16, 1) + 8).astype(np.int32)
        self.jobs = {f"prompt {n_tok}": None}
        self._forward()  # warm-up: maps the weights in

    def _forward(self):
        net = self.llm.model
        return net.forward(self.ids, net.new_cache(self.n_tok + 8))

    def run(self, key: str, reps: int) -> dict:
        t0 = time.perf_counter()
        logits = self._forward()
        rate = self.n_tok / (time.perf_counter() - t0)
        return {"rate": rate, "cpu": rate, "hash": hashlib.sha256(self.np.ascontiguousarray(logits).tobytes())
                .hexdigest()[:16]}


def worker(tree: str, spec: dict) -> None:
    """Runs in a child process with `tree` first on sys.path: reads 'KEY REPS' lines, answers JSON lines."""
    sys.path[:0] = [tree, str(Path(tree) / "benchmarks")]
    import powerinfer_py

    if Path(powerinfer_py.__file__).resolve().parent != Path(tree) / "powerinfer_py":
        raise SystemExit(f"bench_prefill_ab: {tree} did not provide powerinfer_py ({powerinfer_py.__file__} did)")
    if spec.get("model"):
        jobs = _ModelJobs(spec["model"], spec["threads"], spec["n_tok"])
    else:
        jobs = _MatmulJobs(spec["types"], spec["shapes"], spec["threads"], spec["n_tok"])
    print(json.dumps(list(jobs.jobs)), flush=True)
    for line in sys.stdin:
        key, reps = line.rstrip("\n").rsplit(" ", 1)
        print(json.dumps(jobs.run(key, int(reps))), flush=True)


class _Worker:
    def __init__(self, tree: str, spec: dict):
        env = dict(os.environ, PYTHONPATH=tree)
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", tree, json.dumps(spec)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline()
        if not first:
            raise SystemExit(f"bench_prefill_ab: the worker of {tree} did not start (is its extension built?)")
        self.keys = json.loads(first)

    def run(self, key: str, reps: int) -> dict:
        self.proc.stdin.write(f"{key} {reps}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], json.loads(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--shapes", default="4096x4096,4096x11008,11008x4096", help="rows x cols, comma-separated")
    ap.add_argument("--threads", help="thread counts, comma-separated (default 1,2; with --model one count, 2)")
    ap.add_argument("--n-tok", type=int, default=64, help="tokens per matmul")
    ap.add_argument("--model", help="a GGUF file: time its prompt instead of single matmuls")
    ap.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens with --model")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=3, help="timed calls per matmul turn (median)")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds of quiet before each turn")
    a = ap.parse_args()
    if a.model:
        a.model = str(Path(a.model).resolve())
        if a.threads and "," in a.threads:
            ap.error("--model takes one thread count")
        spec = {"model": a.model, "threads": int(a.threads or 2), "n_tok": a.n_prompt}
        unit = "tok/s"
    else:
        spec = {"types": a.types, "shapes": a.shapes, "threads": a.threads or "1,2", "n_tok": a.n_tok}
        unit = "GMAC/s"
    trees = [str(Path(a.old).resolve()), str(Path(a.new).resolve())]
    for tree in trees:
        if not list((Path(tree) / "powerinfer_py").glob("_pi*.so")):
            ap.error(f"{tree} holds no built extension (powerinfer_py/_pi*.so): run python csrc/build_ffi.py there")
    workers = []
    try:
        for tree in trees:
            workers.append(_Worker(tree, spec))
        keys = workers[0].keys
        res = {key: ([], []) for key in keys}
        for rnd in range(a.rounds):
            for key in keys:
                for k in ((0, 1) if rnd % 2 == 0 else (1, 0)):
                    time.sleep(a.pause)
                    res[key][k].append(workers[k].run(key, a.reps))
    finally:
        for w in workers:
            w.close()
    print(f"{a.rounds} rounds, turns alternating; wall {unit} old -> new (median of the per-round ratios)"
          + ("" if a.model else "; CPU-time GMAC/s"))
    for key, (old, new) in res.items():
        ratio = statistics.median(n["rate"] / o["rate"] for o, n in zip(old, new))
        cpu_ratio = statistics.median(n["cpu"] / o["cpu"] for o, n in zip(old, new))
        same = len({r["hash"] for r in old + new}) == 1
        line = (f"{key:28} {statistics.median(r['rate'] for r in old):8.1f} -> "
                f"{statistics.median(r['rate'] for r in new):8.1f} ({ratio:.3f}x)")
        if not a.model:
            line += (f"  cpu {statistics.median(r['cpu'] for r in old):7.1f} -> "
                     f"{statistics.median(r['cpu'] for r in new):7.1f} ({cpu_ratio:.3f}x)")
        print(line + f"  bits: {'same' if same else 'DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
