"""Mat-vec speed of a model's own weights where they live (the file's memory map, page-cache pages) against the
same bytes copied into anonymous memory, cold caches, round-robin.

    python benchmarks/bench_mmap_vs_anon.py MODEL.gguf [--tensors blk.0.attn_q.weight,...] [--threads 2]
        [--rounds 15]
    python benchmarks/bench_mmap_vs_anon.py MODEL.gguf --decode [--sparse predictor] [--rounds 10]

We map model files and run the kernels on the mapping (no copy at load, pages shared with the page cache).
Whether the kernels read those pages as fast as freshly allocated memory depends on the machine and the
kernel's page cache; this prints both, per tensor, as GB/s of the C call's own time (csrc/bench.c), median of
`rounds` rounds with a cache flush before every call. Types must be ones pi_matmul runs (not the K-quants'
separate entry point: Q4_0, Q8_0, F16, ...). With --decode: whole decodes instead, the model loaded twice in
one process (mapped, and with use_mmap=False) taking turns of 24 greedy tokens, and the median of the paired
ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the source tree, unless installed

from powerinfer_py.gguf import open_gguf  # noqa: E402
from powerinfer_py.kernels import cpu  # noqa: E402
from roundrobin import round_robin  # noqa: E402  (benchmarks/, beside this script)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tensors", default="blk.0.attn_q.weight,blk.1.attn_q.weight,blk.0.ffn_gate.weight")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: the CPUs this process may use)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--l3-mib", type=int, default=32, help="last-level cache size (evicted between calls)")
    ap.add_argument("--decode", action="store_true", help="time whole decodes instead of single mat-vecs")
    ap.add_argument("--sparse", default=None, help="with --decode: the FFN mode (default: the file's)")
    args = ap.parse_args()
    if args.decode:
        return decode_ab(args)

    k = cpu.CpuKernels(args.threads)
    lib, ffi = cpu.lib, cpu.ffi
    f = open_gguf(args.model)
    flush = np.ones(4 * args.l3_mib << 20, dtype=np.uint8)
    rng = np.random.default_rng(0)
    fns, sizes = {}, {}
    for name in args.tensors.split(","):
        t = f.tensors.get(name)
        if t is None or len(t.shape) != 2:
            sys.exit(f"{args.model}: no 2-D tensor {name!r}")
        rows, cols = t.shape
        x = rng.standard_normal(cols, dtype=np.float32)
        y = np.empty(rows, np.float32)
        sizes[name] = t.data.nbytes
        for where, buf in (("file map", t.data), ("anonymous copy", np.array(t.data, copy=True))):
            fns[(name, where)] = (lambda buf=buf, x=x, y=y, rows=rows, cols=cols, ty=int(t.type):
                                  lib.pi_timed_matmul(k._pool, ty, ffi.from_buffer(buf), rows, cols,
                                                      ffi.from_buffer("float[]", x), 1, ffi.from_buffer("float[]", y)))
    med = {key: statistics.median(v)
           for key, v in round_robin(fns, args.rounds, lambda: k.read_probe(flush), self_timed=True).items()}
    print(f"threads {k.n_threads}, median of {args.rounds} interleaved rounds, cold caches")
    for name in sizes:
        a, b = med[(name, "file map")], med[(name, "anonymous copy")]
        print(f"{name:28} {f.tensors[name].type.name:5} file map {sizes[name] / a / 1e9:5.1f} GB/s   "
              f"anonymous copy {sizes[name] / b / 1e9:5.1f} GB/s   ({a / b:.2f}x)")


def decode_ab(args) -> None:
    from powerinfer_py import load

    llms = {"file map": load(args.model, threads=args.threads, n_ctx=512, sparse=args.sparse),
            "anonymous copy": load(args.model, threads=args.threads, n_ctx=512, sparse=args.sparse, use_mmap=False)}
    rates: dict[str, list[float]] = {name: [] for name in llms}
    for r in range(args.rounds):
        for name in (list(llms) if r % 2 == 0 else list(reversed(list(llms)))):  # alternate who goes first
            llm = llms[name]
            list(llm.generate_tokens("Once upon a time", max_tokens=24, temperature=0))
            rates[name].append(llm.last_stats.decode_tok_s)
    mode = next(iter(llms.values())).sparse.mode
    print(f"{args.model}: --sparse {mode}, {args.rounds} rounds of 24 decode tokens each, taking turns")
    for name, v in rates.items():
        print(f"  {name:15} median {statistics.median(v):6.1f} tok/s  ({min(v):.1f}-{max(v):.1f})")
    paired = statistics.median(b / a for a, b in zip(rates["file map"], rates["anonymous copy"]))
    print(f"  anonymous copy / file map, paired median: {paired:.2f}x")
    for llm in llms.values():
        llm.close()


if __name__ == "__main__":
    main()
