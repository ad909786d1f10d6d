"""LFM2 decode speed: the attention layers as one C call each (fused) against the Python path, on a synthetic
file of LFM2-350M's shape.

    PYTHONPATH=. python benchmarks/bench_lfm2_decode.py [-t THREADS] [--reps 6] [--dtype q8_0]

The file (written to a temporary folder) has LFM2-350M's layers: 16, attention on 2, 5, 8, 10, 12, 14, n_embd
1024, 16 query / 8 KV heads, FFN 4608; the vocabulary is kept at 4096 (the real one has 65536), so the output
head weighs less than in the real model. Each repetition prefills 16 tokens and times 32 decode steps, fused
and Python alternating; prints the median tokens per second of each and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from powerinfer_py import load
from powerinfer_py.synth import write_synthetic_model

SHAPE = dict(n_layer=16, n_embd=1024, n_ff=4608, n_head=16, n_head_kv=8, n_vocab=4096,
             attn_layers=[2, 5, 8, 10, 12, 14])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--dtype", default="q8_0")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_model(Path(tmp) / "lfm2-350m-shape.gguf", "lfm2", dtype=args.dtype, **SHAPE)
        with load(path, threads=args.threads) as llm:
            m = llm.model
            speed: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.reps):
                for fused in (True, False):
                    m.fused_attention = fused
                    cache = m.new_cache(128)
                    m.forward(np.arange(1, 17, dtype=np.int32), cache)
                    t0 = time.perf_counter()
                    for i in range(32):
                        m.forward(np.array([5 + i], np.int32), cache)
                    speed[fused].append(32 / (time.perf_counter() - t0))
    fused, plain = statistics.median(speed[True]), statistics.median(speed[False])
    print(f"{args.dtype}, {args.threads} threads, median of {args.reps}: fused {fused:.1f} tok/s, "
          f"python {plain:.1f} tok/s, ratio {fused / plain:.3f}")


if __name__ == "__main__":
    main()
