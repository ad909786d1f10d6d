"""Gemma 4 26B-A4B-shaped mixture of experts, scaled down, against llama.cpp (decode and prompt speed).

    python benchmarks/bench_gemma4_moe.py [--dir /tmp/powerinfer-gemma4moe] [--layers 6] [--dtype q8_0]
        [-n 32] [-p 64] [-t 2] [--reps 3]

The file (synth/gemma4.py, random weights; written once into --dir and reused) keeps the proportions of the
26B-A4B model (as its published config gives them; no real file was read) at a quarter of its widths: d 704 (2816), a dense GeGLU FFN of 512 (2112) beside 128 GeGLU experts of
192 (704), 8 per token, merged gate/up expert tensors with per-expert scales; sliding layers of 4 heads x 64 with
2 KV heads and a full layer of 4 heads x 128 with 1 KV head and no V projection (5 sliding : 1 full), a window of
128, proportional RoPE on the full layer (a quarter of its pairs turn), no per-layer embeddings, a 4096-token
vocabulary. Then `powerinfer bench` runs on it (both engines in child processes, alternating, medians of
--reps) and the two speeds and their ratio are printed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py.tools.bench import run_bench
from powerinfer_py.synth.gemma4 import write_gemma4_model

FULL_HEAD = 128
SHAPE = {"n_embd": 704, "n_head": 4, "head_dim": FULL_HEAD, "head_dim_swa": 64, "n_head_kv": (1, 2), "n_vocab": 4096,
         "per_layer": 0, "n_shared_kv": 0, "sliding_window": 128, "final_softcap": 30.0, "n_expert": 128,
         "n_expert_used": 8, "n_ff_exp": 192, "merged": True, "expert_scales": True,
         "rope_freqs": np.array([1.0] * (FULL_HEAD // 8) + [1e30] * (FULL_HEAD // 2 - FULL_HEAD // 8), np.float32)}


def model_file(folder: Path, layers: int, dtype: str) -> Path:
    path = folder / f"gemma4-26b-a4b-shape-{layers}l-{dtype}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    pattern = tuple(il % 6 != 5 for il in range(layers))
    print(f"writing {path} ...", flush=True)
    return write_gemma4_model(path, dtype=dtype, swa_pattern=pattern, n_ff=(512,) * layers,
                              no_v_layers=tuple(il for il, swa in enumerate(pattern) if not swa), **SHAPE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/powerinfer-gemma4moe"))
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dtype", default="q8_0")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    path = model_file(a.dir, a.layers, a.dtype)
    r = run_bench(path, n_gen=a.n, n_prompt=a.p, threads=a.t, reps=a.reps).summary()
    e = r["engines"]
    po, pl = e["ours"]["prompt_tok_s"], e["llamacpp"]["prompt_tok_s"]
    do, dl = e["ours"]["decode_tok_s"], e["llamacpp"]["decode_tok_s"]
    print(f"{path.name}: {a.p} prompt + {a.n} decoded tokens, {a.t} threads, medians of {a.reps}")
    print(f"prompt tok/s ours {po:.0f} / llama.cpp {pl:.0f} ({po / pl:.2f}x); "
          f"decode tok/s ours {do:.1f} / llama.cpp {dl:.1f} ({do / dl:.2f}x)")


if __name__ == "__main__":
    main()
