"""Gemma 4 E2B-shaped dense model, fewer layers, against llama.cpp (decode and prompt speed).

    python benchmarks/bench_gemma4_e2b.py [--dir /tmp/powerinfer-gemma4e2b] [--layers 10] [--dtype q4_0]
        [-n 64] [-p 64] [-t 2] [--reps 3] [--write-only]

The file (synth/gemma4.py, random weights; written once into --dir and reused) has the widths of Gemma 4 E2B as
its published config gives them (no real file was read): d 1536, 8 query heads and 1 KV head, head dim 256 on the
sliding layers and 512 on the full ones (4 sliding : 1 full), a window of 512, proportional RoPE on the full layers
(a quarter of their pairs turn), GeGLU FFN 6144 wide (12288 on the KV-sharing layers, which are the second half,
as 20 of E2B's 35), per-layer embeddings 256 wide, layer output scales, final soft-cap 30. What differs: --layers
layers (default 10, not 35) and a 4096-token vocabulary (not 262144), to keep the file small; so the numbers
weigh the layers more than the real model does (its tied head is as large as all these layers).
Then `powerinfer bench` runs on it (both engines in child processes, alternating, medians of --reps) and the
two speeds and their ratio are printed. The file alone: --write-only (prints its path).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py.tools.bench import run_bench
from powerinfer_py.synth.gemma4 import write_gemma4_model

FULL_HEAD = 512
SHAPE = {"n_embd": 1536, "n_head": 8, "head_dim": FULL_HEAD, "head_dim_swa": 256, "n_head_kv": (1, 1),
         "n_vocab": 4096, "per_layer": 256, "sliding_window": 512, "final_softcap": 30.0, "no_v_layers": (),
         "rope_freqs": np.array([1.0] * (FULL_HEAD // 8) + [1e30] * (FULL_HEAD // 2 - FULL_HEAD // 8), np.float32)}


def model_file(folder: Path, layers: int, dtype: str) -> Path:
    """The E2B-shaped file of `layers` layers (a multiple of 10: the sharing rule needs the last own-K/V layers to
    be a sliding and a full one), written on first use."""
    if layers < 10 or layers % 10:
        raise SystemExit("--layers must be a multiple of 10")
    path = folder / f"gemma4-e2b-shape-{layers}l-{dtype}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    pattern = tuple(il % 5 != 4 for il in range(layers))
    shared = layers // 2
    n_ff = tuple(12288 if il >= layers - shared else 6144 for il in range(layers))
    print(f"writing {path} ...", flush=True)
    return write_gemma4_model(path, dtype=dtype, swa_pattern=pattern, n_shared_kv=shared, n_ff=n_ff, **SHAPE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/powerinfer-gemma4e2b"))
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--dtype", default="q4_0")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write-only", action="store_true")
    a = ap.parse_args()
    path = model_file(a.dir, a.layers, a.dtype)
    if a.write_only:
        print(path)
        return
    r = run_bench(path, n_gen=a.n, n_prompt=a.p, threads=a.t, reps=a.reps).summary()
    e = r["engines"]
    po, pl = e["ours"]["prompt_tok_s"], e["llamacpp"]["prompt_tok_s"]
    do, dl = e["ours"]["decode_tok_s"], e["llamacpp"]["decode_tok_s"]
    print(f"{path.name}: {a.p} prompt + {a.n} decoded tokens, {a.t} threads, medians of {a.reps}")
    print(f"prompt tok/s ours {po:.0f} / llama.cpp {pl:.0f} ({po / pl:.2f}x); "
          f"decode tok/s ours {do:.1f} / llama.cpp {dl:.1f} ({do / dl:.2f}x)")


if __name__ == "__main__":
    main()
