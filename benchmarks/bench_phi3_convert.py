"""Agreement of converted tiny HF Phi-3 checkpoints with the numpy HF forward (tests/hf_fixtures.py): for each
variant of tests/test_convert_phi3.py and each factor set, max |diff| / std of the reference logits for our
engine and llama.cpp on the f32 GGUF (reference with K/V rounded to f16, as both caches hold them), plus the
negative controls (gate/up swapped in the checkpoint; the other LongRoPE factor set).

    python benchmarks/bench_phi3_convert.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_convert_phi3 as T

from powerinfer_py.convert import convert
from powerinfer_py.kernels.cpu import CpuKernels


def main() -> None:
    k = CpuKernels(n_threads=2)
    tmp = Path(tempfile.mkdtemp())
    print(f"{'variant':18s} {'n_ctx':>5s} {'factors':7s} {'engine':>9s} {'llama.cpp':>9s}")
    try:
        for i, (variant, n_ctx, factors) in enumerate(T._cases()):
            cfg, w = T._checkpoint(tmp / f"hf{i}", variant)
            out = convert(tmp / f"hf{i}", tmp / f"m{i}.gguf", outtype="f32")
            want = T.hf_phi3_forward(w, cfg, T.TOKENS, factors=factors, kv_f16=True)
            ours, theirs = T._engine_logits(out, k, n_ctx), T._llama_cpp_logits(out, n_ctx)
            print(f"{variant:18s} {n_ctx:5d} {factors:7s} {T._score(ours, want):9.2e} {T._score(theirs, want):9.2e}")
        cfg, w = T._checkpoint(tmp / "swap", "partial-longrope", swap_gate_up=True)
        out = convert(tmp / "swap", tmp / "swap.gguf", outtype="f32")
        want = T.hf_phi3_forward(w, cfg, T.TOKENS, kv_f16=True)
        print(f"{'control: gate/up swapped':32s} {T._score(T._engine_logits(out, k, 32), want):9.2e} "
              f"{T._score(T._llama_cpp_logits(out, 32), want):9.2e}")
        cfg, w = T._checkpoint(tmp / "fac", "partial-longrope")
        out = convert(tmp / "fac", tmp / "fac.gguf", outtype="f32")
        want = T.hf_phi3_forward(w, cfg, T.TOKENS, factors="long", kv_f16=True)
        print(f"{'control: n_ctx 32 vs long ref':32s} {T._score(T._engine_logits(out, k, 32), want):9.2e} "
              f"{T._score(T._llama_cpp_logits(out, 32), want):9.2e}")
    finally:
        k.close()


if __name__ == "__main__":
    main()
