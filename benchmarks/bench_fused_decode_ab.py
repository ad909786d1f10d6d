"""Decode speed with the one-call C attention blocks against the Python attention path, in one process.

    python benchmarks/bench_fused_decode_ab.py MODEL.gguf [-n 32] [-p 64] [-t 2] [--rounds 5] [--stack]

Loads the model once, prefills a prompt of -p tokens, then decodes -n tokens with model.fused_attention on and
off in alternation (--rounds rounds each, order swapped every round, each round from a copy of the same prefilled
cache), and prints the median tok/s of each and their ratio. The two paths give the same bits (tests compare
them), so this isolates what the Python between the attention kernels costs. Works for any architecture whose
decode step uses attn_plans (llama, gemma3, gemma4, gemma3n, ...).
--stack compares instead the whole stack of layers in one C call (models/base.py _decode_stack, csrc/
step_stack.c) with one C call per attention block and per FFN (the Python loop between them): what the
interpreter costs per layer.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py import load


def decode_rate(net, cache0, first: int, n: int) -> float:
    """tok/s of n one-token steps from a copy of the prefilled cache0 (feeding token ids first, first+1, ...)."""
    cache = net.new_cache(cache0.n_ctx)
    for il in range(len(cache.k)):
        if cache.k[il] is not cache.k[il - 1] or il == 0:  # layers sharing K/V hold the same arrays
            cache.k[il][...] = cache0.k[il]
            cache.v[il][...] = cache0.v[il]
    cache.n_past = cache0.n_past
    t = time.perf_counter()
    for i in range(n):
        net.forward(np.array([first + i], np.int32), cache)
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stack", action="store_true", help="the one-call layer stack against per-layer calls")
    a = ap.parse_args()
    with load(a.model, threads=a.t) as llm:
        net = llm.model
        n_vocab = net.config.n_vocab
        cache0 = net.new_cache(a.p + a.n + 8)
        net.forward(np.arange(1, a.p + 1, dtype=np.int32) % n_vocab, cache0)
        rates = {True: [], False: []}
        net.fused_attention = True
        if net.attn_plans() is None:
            raise SystemExit(f"{a.model.name}: this model has no one-call attention step on these kernels")
        if a.stack and getattr(net, "_decode_stack", lambda p: None)(net.attn_plans()) is None:
            raise SystemExit(f"{a.model.name}: this model's layers do not all fit the one-call stack")
        for r in range(a.rounds):
            for fused in ((True, False) if r % 2 == 0 else (False, True)):
                if a.stack:  # off: an instance attribute hides the method, so each layer is called from Python
                    net.__dict__.pop("_decode_stack", None)
                    if not fused:
                        net._decode_stack = lambda plans: None
                else:
                    net.fused_attention = fused
                rates[fused].append(decode_rate(net, cache0, 7 % n_vocab, a.n))
        net.__dict__.pop("_decode_stack", None)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"{a.model.name}: {a.p} prompt, {a.n} decoded tokens, {a.t} threads, medians of {a.rounds} rounds")
    if a.stack:
        print(f"decode tok/s one-call layer stack {on:.1f} / per-layer calls {off:.1f} ({on / off:.2f}x)")
    else:
        print(f"decode tok/s one-call attention {on:.1f} / Python attention {off:.1f} ({on / off:.2f}x)")


if __name__ == "__main__":
    main()
