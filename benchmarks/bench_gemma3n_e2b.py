"""Gemma 3n E2B-shaped file, fewer layers: the one-call C attention step against the Python one (our engine only).

    python benchmarks/bench_gemma3n_e2b.py [--dir /tmp/powerinfer-gemma3ne2b] [--layers 10] [--dtype q4_0]
        [-n 32] [-p 64] [-t 2] [--rounds 5]

The file (synth/gemma3n.py, random weights; written once into --dir and reused) has the widths of Gemma 3n E2B as
its published config gives them (no real file was read): d 2048, 8 query heads and 2 KV heads of 256, FFN 8192,
4 AltUp streams, LAuReL rank 64, per-layer embeddings 256 wide, 4 sliding layers (window 512) : 1 full, the last
half of the layers sharing K/V, Gaussian top-k FFNs on the first layers. What differs: --layers layers (default 10,
not 30) and a 4096-token vocabulary. llama.cpp runs gemma3n with its own fixed layer counts (20 with their own
K/V, 10 top-k), so it is not measured here: this prints benchmarks/bench_fused_decode_ab.py's A/B (fused
attention on and off in one process, the same bits).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py.synth.gemma3n import write_gemma3n_model


def model_file(folder: Path, layers: int, dtype: str) -> Path:
    if layers < 10 or layers % 10:
        raise SystemExit("--layers must be a multiple of 10")
    path = folder / f"gemma3n-e2b-shape-{layers}l-{dtype}.gguf"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", flush=True)
        write_gemma3n_model(path, dtype=dtype, n_layer=layers, n_embd=2048, n_head=8, n_head_kv=2, head_dim=256,
                            n_ff=8192, n_vocab=4096, sliding_window=512, n_sparse=layers // 3, n_kv=layers // 2,
                            laurel_rank=64, per_layer=256)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/powerinfer-gemma3ne2b"))
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--dtype", default="q4_0")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    path = model_file(a.dir, a.layers, a.dtype)
    ab = Path(__file__).resolve().parent / "bench_fused_decode_ab.py"
    subprocess.run([sys.executable, str(ab), str(path), "-n", str(a.n), "-p", str(a.p), "-t", str(a.t),
                    "--rounds", str(a.rounds)], check=True)


if __name__ == "__main__":
    main()
