"""How closely our phi3 matches llama.cpp (llama-cpp-python) on tiny synthetic phi3 files, per variant.

Prints, per case, the largest logit difference over 12 tokens relative to the spread of llama.cpp's logits,
and whether every position's argmax agrees. Cases: full and partial rotary, separate q/k/v, F32 and Q8_0,
and a long-context file (short/long RoPE factors, attn_factor 1.3) at a context below and above its
original length. Run:  python benchmarks/bench_phi3_agreement.py
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.synth import write_synthetic_model

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]
_RNG = np.random.default_rng(7)
LONGROPE = {"n_rot": 12, "rope_factors": (1 + 3 * _RNG.random(6), 1 + 20 * _RNG.random(6)), "orig_ctx": 256,
            "attn_factor": 1.3}
CASES = [  # (label, dtype, n_ctx, synth options)
    ("partial rotary 12/16 (default)", "f32", 32, {}),
    ("partial rotary, Q8_0", "q8_0", 32, {}),
    ("full rotary 16/16", "f32", 32, {"n_rot": 16}),
    ("separate attn_q/k/v", "f32", 32, {"fused_qkv": False}),
    ("longrope, n_ctx 32 (short)", "f32", 32, LONGROPE),
    ("longrope, n_ctx 512 (long)", "f32", 512, LONGROPE),
]


def main() -> None:
    kernels = CpuKernels(n_threads=2)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, dtype, n_ctx, opts) in enumerate(CASES):
            path = write_synthetic_model(Path(tmp) / f"phi3-{i}.gguf", "phi3", dtype=dtype, **opts)
            w = load_weights(open_gguf(path), expected_tensors)
            model = build_model(w.config, w.tensors, kernels)
            ours = model.forward(np.array(TOKENS, dtype=np.int32), model.new_cache(n_ctx), all_logits=True)
            llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, n_threads=2, verbose=False)
            try:
                llm.eval(TOKENS)
                theirs = np.array(llm.scores[:len(TOKENS)], dtype=np.float32)
            finally:
                llm.close()
            rel = float(np.abs(ours - theirs).max() / theirs.std())
            same = bool((ours.argmax(1) == theirs.argmax(1)).all())
            print(f"{label:34s} {dtype:5s} max |ours - llama.cpp| / std = {rel:.2e}   argmax all equal: {same}")
    kernels.close()


if __name__ == "__main__":
    main()
