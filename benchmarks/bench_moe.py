"""Mixture-of-experts speed against llama.cpp on synthetic files with Qwen3-30B-A3B's layer shape.

    python benchmarks/bench_moe.py [--dir /tmp/powerinfer-moe] [--layers 2] [--dtypes q4_0,q8_0,q4_k_m]
        [-n 64] [-p 64] [-t 2] [--reps 5]

Each file (written once into --dir, reused afterwards) is a qwen3moe model with d 2048, 32 query heads and 4 KV
heads of 128, 128 experts of width 768 per layer of which 8 run per token, and a 32000-token vocabulary
(powerinfer_py.synth, random weights); q4_k_m is llama.cpp's own quantization of the q8_0 file. Writing the
q8_0 file holds all its weights in f32 once: about 2.5 GB per layer. Then `powerinfer bench` runs on each file
(both engines in child processes, alternating, medians of --reps) and the table of ratios is printed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py.tools.bench import run_bench  # noqa: E402
from powerinfer_py.synth import write_synthetic_model  # noqa: E402

SHAPE = dict(n_embd=2048, n_ff=768, n_head=32, n_head_kv=4, head_dim=128, n_expert=128, n_expert_used=8,
             n_vocab=32000)


def model_file(folder: Path, layers: int, dtype: str) -> Path:
    path = folder / f"qwen3moe-30b-a3b-shape-{layers}l-{dtype}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    if dtype != "q4_k_m":
        print(f"writing {path} ...", flush=True)
        return write_synthetic_model(path, "qwen3moe", dtype=dtype, n_layer=layers, **SHAPE)
    import llama_cpp

    src = model_file(folder, layers, "q8_0")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, True
    print(f"quantizing {src} to {path} with llama.cpp ...", flush=True)
    if llama_cpp.llama_model_quantize(str(src).encode(), str(path).encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not quantize {src}")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/powerinfer-moe"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtypes", default="q4_0,q8_0,q4_k_m")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    rows = []
    for dtype in a.dtypes.split(","):
        path = model_file(a.dir, a.layers, dtype)
        r = run_bench(path, n_gen=a.n, n_prompt=a.p, threads=a.t, reps=a.reps).summary()
        e = r["engines"]
        rows.append((dtype, e["ours"]["prompt_tok_s"], e["llamacpp"]["prompt_tok_s"], e["ours"]["decode_tok_s"],
                     e["llamacpp"]["decode_tok_s"], e["ours"]["peak_rss"], e["llamacpp"]["peak_rss"]))
        print(f"{dtype}: done", flush=True)
    print(f"\n{a.layers} layers, {a.p} prompt + {a.n} decoded tokens, {a.t} threads, medians of {a.reps}")
    print("| file | prompt tok/s ours / llama.cpp | ratio | decode tok/s ours / llama.cpp | ratio | peak RSS MiB ours / llama.cpp |")
    print("|---|---|---|---|---|---|")
    for dt, po, pl, do, dl, ro, rl in rows:
        print(f"| {dt} | {po:.0f} / {pl:.0f} | {po / pl:.2f}x | {do:.1f} / {dl:.1f} | {do / dl:.2f}x | "
              f"{ro / 2**20:.0f} / {rl / 2**20:.0f} |")


if __name__ == "__main__":
    main()
