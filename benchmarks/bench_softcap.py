"""What Gemma 2's attention logit soft-cap costs in the attention kernel (csrc/attention.c).

    PYTHONPATH=. python benchmarks/bench_softcap.py [--ctx 512 4096] [-t THREADS] [--repeat 30]

One decode token (and, for comparison, a 64-token prefill chunk) against a cache of --ctx positions, in the
shape of Gemma 2 2B's attention (8 query heads, 4 KV heads, head_dim 256), with the cap off (0) and at 50.
The cap is one tanhf per score after q.k, so its cost grows with the positions attended, like the rest of the
kernel. Prints median times (round robin, benchmarks/roundrobin.py) and the ratio capped / uncapped.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from roundrobin import round_robin

from powerinfer_py.kernels.cpu import CpuKernels

N_HEAD, N_HEAD_KV, HEAD_DIM = 8, 4, 256  # Gemma 2 2B


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    k = CpuKernels(args.threads)
    print(f"attention, {N_HEAD} heads / {N_HEAD_KV} KV heads x {HEAD_DIM}, {args.threads} thread(s); "
          f"median of {args.repeat}")
    print(f"{'ctx':>6} {'tokens':>6} {'cap 0 (ms)':>11} {'cap 50 (ms)':>12} {'ratio':>6}")
    for n_ctx in args.ctx:
        kc = rng.standard_normal((N_HEAD_KV, n_ctx, HEAD_DIM)).astype(np.float16)
        vc = rng.standard_normal((N_HEAD_KV, n_ctx, HEAD_DIM)).astype(np.float16)
        for n_tok in (1, 64):
            q = rng.standard_normal((n_tok, N_HEAD, HEAD_DIM)).astype(np.float32)
            p0 = n_ctx - n_tok
            def call(cap, q=q, kc=kc, vc=vc, p0=p0):
                return lambda: k.attention(q, kc, vc, p0, 0, HEAD_DIM ** -0.5, cap)
            times = round_robin({cap: call(cap) for cap in (0.0, 50.0)}, args.repeat)
            off, on = (1e3 * statistics.median(times[c]) for c in (0.0, 50.0))
            print(f"{n_ctx:>6} {n_tok:>6} {off:>11.3f} {on:>12.3f} {on / off:>6.2f}")
    k.close()


if __name__ == "__main__":
    main()
