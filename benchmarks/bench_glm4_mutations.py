"""How far each glm4 / glm4moe piece moves the logits: the synthetic files of tests/test_glm4.py against llama.cpp,
as built (F32 and Q8_0, with the share of positions whose top-1 agrees) and with each piece changed (F32), in units
of the logits' spread (the test's bounds: 0.01 at F32, 0.12 at Q8_0).
Run: PYTHONPATH=.:tests python benchmarks/bench_glm4_mutations.py"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
from llama_ref import llama_cpp_logits
from test_glm4 import CASES, IDS, TOKENS

from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.layers.moe import MoEFFN
from powerinfer_py.synth import write_synthetic_model


def distance(kernels, path, ref, hook=None, **config_changes) -> tuple[float, float]:
    """(max |ours - ref| / spread, share of equal top-1s) with the config changed and hook(model) applied."""
    w = load_weights(open_gguf(path), expected_tensors)
    net = build_model(dataclasses.replace(w.config, **config_changes), w.tensors, kernels)
    if hook is not None:
        hook(net)
    out = net.forward(np.array(TOKENS, np.int32), net.new_cache(64), all_logits=True)
    return float(np.abs(out - ref).max() / ref.std()), float((out.argmax(1) == ref.argmax(1)).mean())


def swap_halves(net):
    for f in net.ffns:
        f.w.gate, f.w.up = f.w.up, f.w.gate


def no_post_norms(net):
    net.post_norms = False


def experts(attr, value):
    return lambda net: [setattr(f, attr, value) for f in net.ffns if isinstance(f, MoEFFN)]


MUTATIONS = {
    "glm4": [("no post norms", no_post_norms, {}), ("full rotary", None, {"n_rot": 16}),
             ("NeoX layout", None, {"rope_neox": True}), ("gate/up halves swapped", swap_halves, {})],
    "glm4moe": [("normal layout", None, {"rope_neox": False}), ("full rotary", None, {"n_rot": 32}),
                ("no routed scale", experts("weights_scale", 1.0), {}),
                ("softmax router", experts("gating", "softmax"), {}),
                ("no selection bias", experts("select_bias", None), {}),
                ("no shared expert", experts("shared", None), {}),
                ("weights not renormalized", experts("norm_weights", False), {}),
                ("prediction block run as a 4th layer", None,
                 {"n_layer": 4, "n_nextn": 0, "moe_layers": (False, True, True, True)})],
}


def main() -> None:
    k = CpuKernels(n_threads=2)
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for dtype in ("f32", "q8_0"):
            for (arch, kw), name in zip(CASES, IDS):
                path = write_synthetic_model(Path(tmp) / f"{name}-{dtype}.gguf", arch, dtype=dtype, **kw)
                files[name, dtype] = path
                print(f"{dtype:5s} {name:30s} as built: %.4f (top-1 agrees at %.2f)"
                      % distance(k, path, llama_cpp_logits(path, TOKENS)))
        for name, changes in MUTATIONS.items():
            path = files[name, "f32"]
            ref = llama_cpp_logits(path, TOKENS)
            for what, hook, config_changes in changes:
                print(f"f32   {name:30s} {what}: %.3f" % distance(k, path, ref, hook, **config_changes)[0])
    k.close()


if __name__ == "__main__":
    main()
