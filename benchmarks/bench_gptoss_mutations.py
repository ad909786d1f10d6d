"""How far each gpt-oss piece moves the logits: the 8-layer synthetic F32 file of tests/test_gpt_oss.py against
llama.cpp, once as built and once with each piece switched off (in units of the logits' spread; the test's bound
is 0.01). Run: PYTHONPATH=.:tests python benchmarks/bench_gptoss_mutations.py"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from llama_ref import llama_cpp_logits

from powerinfer_py import load
from powerinfer_py.synth import write_synthetic_model

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]
YARN = {"type": "yarn", "factor": 4.0, "original_context_length": 64}


def switch_off(net, what: str) -> None:
    if what == "no sliding window":
        net.layer_attn = [(0, rope) for _, rope in net.layer_attn]
    for L in net.layers:
        if what == "no attention sinks":
            L.sinks = None
    for f in net.ffns:
        if what == "softmax over all experts before top-k":
            f.weights_after_topk = False
        elif what == "no expert biases":
            f.b_gate = f.b_up = f.b_down = None
        elif what == "plain SwiGLU":
            f.act = net.kernels.swiglu
        elif what == "no router bias":
            f.router_bias = None
    net.fused_attention = False  # the Python path reads the switched layer attributes


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_model(Path(tmp) / "g.gguf", "gpt-oss", n_layer=8, rope_scaling=YARN)
        want = llama_cpp_logits(path, TOKENS)
        spread = float(want.std())
        for what in ("as built", "no attention sinks", "softmax over all experts before top-k", "no expert biases",
                     "plain SwiGLU", "no router bias", "no sliding window"):
            with load(path, threads=2) as llm:
                switch_off(llm.model, what)
                got = llm.model.forward(np.array(TOKENS, np.int32), llm.model.new_cache(64), all_logits=True)
            agree = int((got.argmax(1) == want.argmax(1)).sum())
            print(f"{what:40s} {np.abs(got - want).max() / spread:8.4f} spreads   argmax {agree}/{len(TOKENS)}")


if __name__ == "__main__":
    main()
