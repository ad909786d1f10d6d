"""Decode and prefill speed of nemotron_h against llama.cpp on a synthetic file of Nemotron-H-4B's layer shapes.

The file has the 4B model's widths (n_embd 3072, 32 query / 8 KV heads, FFN 12288, 112 mixer heads of 64,
8 groups, state 128, conv 4; attention heads of 3072 / 32 = 96 where the real ones are 128) but 8 layers ("M-M*M-M-": 4 mixers, 3 FFNs, 1 attention; the real model's 52 layers
mix about the same shares) and a 32000-token vocabulary, in q8_0, so it fits this machine and writes in a minute.
Run: python benchmarks/bench_nemotron_h.py [FILE] [THREADS]   (writes FILE once, then runs `powerinfer bench`)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from powerinfer_py.synth import write_synthetic_model

SHAPE = dict(n_layer=8, n_embd=3072, n_ff=12288, n_head=32, n_head_kv=8, n_vocab=32000, pattern="M-M*M-M-",
             n_ssm_head=112, ssm_head_dim=64, n_group=8, d_state=128, conv_kernel=4, n_ctx_train=4096)


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/nemotron_h_4b_shape_q8_0.gguf")
    threads = sys.argv[2] if len(sys.argv) > 2 else "2"
    if not path.exists():
        write_synthetic_model(path, "nemotron_h", dtype="q8_0", **SHAPE)
    subprocess.run([sys.executable, "-m", "powerinfer_cli", "bench", "-m", str(path), "-n", "32", "-p", "64",
                    "-t", threads, "-r", "3"], check=True)


if __name__ == "__main__":
    main()
