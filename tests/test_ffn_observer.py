"""The FFN observer hook (ffn.py): profiling and calibration see the activated gating values of the real
forward pass, and observing never changes the result."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py import load
from powerinfer_py.kernels import ref


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_observer_sees_gate_activation_and_keeps_logits(synthetic_model, arch):
    path = synthetic_model(arch)
    ids = [1, 5, 9, 3, 7]
    with load(path, threads=1) as llm:
        plain = llm.model.forward(ids, llm.model.new_cache(16), all_logits=True)
        seen: dict[int, tuple] = {}

        def observer(layer, x, p, act):
            seen[layer] = (x.copy(), p.copy(), act.copy())

        for f in llm.model.ffns:
            f.observer = observer
        observed = llm.model.forward(ids, llm.model.new_cache(16), all_logits=True)
        gate = llm.model.ffns[0].w.gate
    np.testing.assert_array_equal(observed, plain)
    assert sorted(seen) == list(range(len(llm.model.ffns)))
    x, p, act = seen[0]
    assert x.shape[0] == p.shape[0] == act.shape[0] == len(ids)
    pre = x.astype(np.float64) @ ref.dequantize(gate).astype(np.float64).T
    want = ref.gelu(pre) if arch == "gemma3" else ref.silu(pre)
    np.testing.assert_allclose(act, want, rtol=2e-3, atol=2e-4)
