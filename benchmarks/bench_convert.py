"""Convert a ~1 GB synthetic BF16 LLaMA checkpoint to Q4_0 and report throughput and peak memory.

    python benchmarks/bench_convert.py [--size-gb 1.0] [--outtype q4_0] [--threads N] [--keep]

Writes the checkpoint (two safetensors shards with an index, a tokenizer.json) under a temporary folder in
/tmp, then runs `powerinfer_py.convert.convert` in a child process so that its peak resident memory
(ru_maxrss) is the conversion's alone. Prints:
  - MB/s of input converted, and the same run's plain read speed of the input files (the reference: a
    converter cannot beat reading its input), as a ratio;
  - peak RSS against the budget 1.5 x largest tensor + 300 MB (issue 4), as a ratio.
Targets: >= 100 MB/s of input, peak RSS under the budget. The input is in the page cache (just written).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from powerinfer_py.convert.safetensors import write_safetensors  # noqa: E402

SHAPE = dict(n_embd=2048, n_ff=5632, n_head=16, n_vocab=32000)


def _bf16(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def write_checkpoint(folder: Path, size_gb: float) -> tuple[int, int]:
    """A BF16 LLaMA of SHAPE with as many layers as fit in size_gb. Returns (input bytes, largest tensor)."""
    d, ff, v = SHAPE["n_embd"], SHAPE["n_ff"], SHAPE["n_vocab"]
    per_layer = (4 * d * d + 3 * d * ff + 2 * d) * 2
    n_layer = max(1, int((size_gb * 1e9 - 2 * v * d * 2) // per_layer))
    rng = np.random.default_rng(0)
    pool = _bf16(rng.standard_normal(32 << 20, dtype=np.float32) * 0.02)  # 64 MB of values to slice from

    def tensor(shape, salt):
        n = int(np.prod(shape))
        start = (salt * 7919) % (len(pool) - 1)
        reps = -(-(start + n) // len(pool))
        return np.tile(pool, reps)[start:start + n].reshape(shape) if reps > 1 else pool[start:start + n].reshape(shape)

    names: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d)}
    for il in range(n_layer):
        p = f"model.layers.{il}."
        names.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                      p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (d, d),
                      p + "self_attn.v_proj.weight": (d, d), p + "self_attn.o_proj.weight": (d, d),
                      p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                      p + "mlp.down_proj.weight": (d, ff)})
    names.update({"model.norm.weight": (d,), "lm_head.weight": (v, d)})
    keys = list(names)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for fname, part in shards.items():
        write_safetensors(folder / fname, {k: ("BF16", tensor(names[k], i)) for i, k in enumerate(part)})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, part in shards.items() for k in part}}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": d, "intermediate_size": ff,
        "num_hidden_layers": n_layer, "num_attention_heads": SHAPE["n_head"],
        "num_key_value_heads": SHAPE["n_head"], "vocab_size": v, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "tie_word_embeddings": False}))
    vocab = {bytes([b]).hex(): b for b in range(256)}
    vocab.update({f"tok{i}": i for i in range(256, v)})
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []}}))
    return sum(int(np.prod(s)) * 2 for s in names.values()), v * d * 2


def read_speed(folder: Path) -> float:
    """MB/s of reading the shard files once (the same page-cache state the converter sees)."""
    t0, n = time.perf_counter(), 0
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb", buffering=0) as fh:
            buf = bytearray(16 << 20)
            while (k := fh.readinto(buf)):
                n += k
    return n / (time.perf_counter() - t0) / 1e6


CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from powerinfer_py.convert import convert
t0 = time.perf_counter()
convert({src!r}, {out!r}, outtype={outtype!r}, n_threads={threads})
dt = time.perf_counter() - t0
# VmHWM: this process's own peak RSS (ru_maxrss would include the parent's memory at fork time)
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(dt, hwm)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--outtype", default="q4_0")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_convert_", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        (work / "hf").mkdir()
        n_in, largest = write_checkpoint(work / "hf", args.size_gb)
        print(f"checkpoint: {n_in / 1e6:.0f} MB BF16, largest tensor {largest / 1e6:.0f} MB "
              f"(written in {time.perf_counter() - t0:.1f} s)")
        ref_mbs = read_speed(work / "hf")
        code = CHILD.format(root=str(ROOT), src=str(work / "hf"), out=str(work / "out.gguf"),
                            outtype=args.outtype, threads=args.threads)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"convert failed:\n{proc.stderr}")
        inner, peak = (float(v) for v in proc.stdout.strip().splitlines()[-1].split())
        budget = 1.5 * largest + 300e6
        mbs = n_in / inner / 1e6
        print(f"convert -> {args.outtype}: {inner:.2f} s ({wall:.2f} s with interpreter start), "
              f"output {(work / 'out.gguf').stat().st_size / 1e6:.0f} MB, {args.threads} threads")
        print(f"throughput: {mbs:.0f} MB/s of input (target >= 100: {mbs / 100:.2f}x); plain read of the "
              f"input {ref_mbs:.0f} MB/s (convert/read = {mbs / ref_mbs:.2f})")
        print(f"peak RSS: {peak / 1e6:.0f} MB vs budget 1.5 x {largest / 1e6:.0f} MB + 300 MB = "
              f"{budget / 1e6:.0f} MB (ratio {peak / budget:.2f}, must be < 1)")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
