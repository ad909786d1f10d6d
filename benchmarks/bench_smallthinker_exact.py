"""Decode speed of `--sparse exact` against `off` on a synthetic SmallThinker file whose ReLU experts are really
sparse (synth/smallthinker.py's sparsity option: gate rows shifted along the embeddings' common direction), plus
the measured fraction of active expert neurons. Prints the median ms per token of each mode over REPEATS runs
(alternated) and checks that both modes give the same logits bits.

    PYTHONPATH=. python benchmarks/bench_smallthinker_exact.py [--dtype q8_0] [--sparsity 1.3] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from powerinfer_py import load
from powerinfer_py.synth.smallthinker import write_smallthinker_model


def decode_ms(path, mode, threads, n_tok):
    with load(path, threads=threads, sparse=mode) as llm:
        m = llm.model
        cache = m.new_cache(n_tok + 8)
        m.forward(np.array([1, 5, 9, 13], np.int32), cache)
        m.sparsity.reset()
        t0 = time.perf_counter()
        last = None
        tok = 20
        for _ in range(n_tok):
            last = m.forward(np.array([tok], np.int32), cache)
            tok = int(last.argmax())
        dt = (time.perf_counter() - t0) * 1000 / n_tok
        return dt, last, m.sparsity.mean_fraction


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="q8_0")
    ap.add_argument("--sparsity", type=float, default=1.3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        # experts as wide as SmallThinker-4B's (768 neurons, 1536 model width would be larger than we need):
        # 32 experts, 4 chosen, n_embd 512, 8 layers
        path = write_smallthinker_model(Path(d) / "st.gguf", dtype=a.dtype, n_layer=8, n_embd=512, n_ff_exp=768,
                                        n_head=8, n_head_kv=2, n_expert=32, n_expert_used=4, sparsity=a.sparsity,
                                        sliding_window=None)
        times = {"off": [], "exact": []}
        out = {}
        for _ in range(a.repeats):
            for mode in ("off", "exact"):
                ms, last, frac = decode_ms(path, mode, a.threads, a.tokens)
                times[mode].append(ms)
                out[mode] = (last, frac)
        same = np.array_equal(out["off"][0].view(np.uint32), out["exact"][0].view(np.uint32))
        off, ex = statistics.median(times["off"]), statistics.median(times["exact"])
        print(f"{a.dtype}, sparsity option {a.sparsity}, {a.threads} threads: active expert neurons "
              f"{100 * out['exact'][1]:.1f}%")
        print(f"decode ms/token (median of {a.repeats}): off {off:.2f}, exact {ex:.2f}, speed-up {off / ex:.2f}x; "
              f"same logits bits: {same}")


if __name__ == "__main__":
    main()
