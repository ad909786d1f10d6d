"""deepseek2 (MLA + experts) speed against llama.cpp on a synthetic file with DeepSeek-V2-Lite's layer shape.

    python benchmarks/bench_deepseek2.py [--dir /tmp/powerinfer-ds2] [--layers 2] [--dtype q8_0]
        [-n 32] [-p 32] [-t 2] [--reps 3]

The file (written once into --dir, reused afterwards) has V2-Lite's sizes per layer: d 2048, 16 heads of 128
unrotated + 64 rotated q/k dims and 128 value dims, a latent of 512 (the split attn_k_b / attn_v_b layout), layer 0
a dense SwiGLU FFN 10944 wide, the others 64 experts 1408 wide of which 6 run plus 2 shared; a 32000-token
vocabulary (V2-Lite has 102400) and random weights (powerinfer_py.synth). Then `powerinfer bench` runs both
engines in child processes, alternating, and prints the medians of --reps.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py.tools.bench import run_bench  # noqa: E402
from powerinfer_py.synth import write_synthetic_model  # noqa: E402

SHAPE = dict(n_embd=2048, n_ff=10944, n_head=16, n_head_kv=16, n_expert=64, n_expert_used=6, n_ff_exp=1408,
             n_ff_shexp=2 * 1408, n_vocab=32000, nope=128, n_rot=64, v_dim=128, kv_lora=512, split=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/powerinfer-ds2"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", default="q8_0")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-p", type=int, default=32)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    path = a.dir / f"deepseek2-v2lite-shape-{a.layers}l-{a.dtype}.gguf"
    if not path.exists():
        a.dir.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", flush=True)
        write_synthetic_model(path, "deepseek2", dtype=a.dtype, n_layer=a.layers, **SHAPE)
    e = run_bench(path, n_gen=a.n, n_prompt=a.p, threads=a.t, reps=a.reps).summary()["engines"]
    print(f"\n{path.name}: {a.p} prompt + {a.n} decoded tokens, {a.t} threads, medians of {a.reps}")
    print("| prompt tok/s ours / llama.cpp | decode tok/s ours / llama.cpp | peak RSS MiB ours / llama.cpp |")
    print("|---|---|---|")
    print(f"| {e['ours']['prompt_tok_s']:.0f} / {e['llamacpp']['prompt_tok_s']:.0f} | "
          f"{e['ours']['decode_tok_s']:.1f} / {e['llamacpp']['decode_tok_s']:.1f} | "
          f"{e['ours']['peak_rss'] / 2**20:.0f} / {e['llamacpp']['peak_rss'] / 2**20:.0f} |")


if __name__ == "__main__":
    main()
