"""The kernel tiers' interface (kernels/__init__.py Ops and Steps, kernels/cpu_steps.py): CpuKernels.steps is the
one place the optional one-call steps are reached, RefKernels has none, the steps share their kernels object's
pool without keeping it alive, a kernels object without steps runs every layer on the Python path (tier 1) with
the bits of tiers 2 and 3, and no runtime module probes a kernels object for a step by name."""
from __future__ import annotations

import ast
import gc
import inspect
from pathlib import Path

import numpy as np
import pytest

from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.kernels import Ops, Steps
from powerinfer_py.kernels.ref import RefKernels
from powerinfer_py.models import build_model, expected_tensors

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)
from powerinfer_py.kernels.cpu_steps import CpuSteps  # noqa: E402  (needs the extension too)

ROOT = Path(__file__).resolve().parent.parent
TOKENS = [1, 332, 292, 263, 270, 270, 273, 455]


def _public(cls) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_interfaces():
    """CpuKernels is Ops with a Steps; the Steps protocol names exactly CpuSteps' public members; RefKernels is
    Ops without steps."""
    k = cpu.CpuKernels(1)
    try:
        assert isinstance(k, Ops) and isinstance(k.steps, CpuSteps) and isinstance(k.steps, Steps)
        want = {n for n in Steps.__dict__ if not n.startswith("_")} | set(Steps.__annotations__)
        assert _public(CpuSteps) == want
        assert not _public(CpuSteps) & _public(cpu.CpuKernels)  # no step left on the ops class
    finally:
        k.close()
    r = RefKernels()
    assert isinstance(r, Ops) and r.steps is None


def test_steps_share_the_pool_without_keeping_it():
    k = cpu.CpuKernels(2)
    steps = k.steps
    assert steps._pool is k._pool
    k.close()
    with pytest.raises(ValueError, match="closed"):
        steps.ssm_scan_step(np.zeros((1, 1, 1), np.float32), *(np.zeros(s, np.float32) for s in
                                                                  ((1, 1), (1,), (1,), (1, 1), (1, 1))))
    k2 = cpu.CpuKernels(1)
    steps2 = k2.steps
    del k2
    gc.collect()
    assert steps2._pool is None  # the kernels object (and its pool) went: the steps held it weakly


def _decode(model) -> list[np.ndarray]:
    cache = model.new_cache(32)
    out = [model.forward(TOKENS[:3], cache)]
    out += [model.forward(TOKENS[i:i + 1], cache) for i in range(3, len(TOKENS))]
    return out


@pytest.mark.parametrize("mode", [None, "predictor"])
def test_no_steps_means_tier_1_with_the_same_bits(synthetic_model, tmp_path, mode):
    """The same model on kernels whose steps are removed takes the Python path everywhere (no attention plans,
    no FFN step plans) and gives the logits of the one-call tiers bit for bit: a dense llama file, and a PWRI
    llama file in predictor mode."""
    from reference_sparse import write_tiny_sparse

    from powerinfer_py.layers.ffn import resolve_sparse

    path = synthetic_model("llama", "f32") if mode is None else write_tiny_sparse(tmp_path / "s.gguf", "llama")
    w = load_weights(open_gguf(path), expected_tensors)
    with_steps, without = cpu.CpuKernels(1), cpu.CpuKernels(1)
    without.steps = None
    try:
        fast, slow = (build_model(w.config, w.tensors, k, resolve_sparse(w.config, mode, None))
                      for k in (with_steps, without))
        assert fast.attn_plans() is not None and fast._decode_stack(fast.attn_plans()) is not None  # tier 3
        assert any(f.fused is not None or f.fused_dense is not None for f in fast.ffns)
        assert slow.attn_plans() is None
        assert all(f.fused is None and f.fused_dense is None for f in slow.ffns)
        for a, b in zip(_decode(fast), _decode(slow)):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    finally:
        with_steps.close()
        without.close()


STEP_NAMES = {n for n in Steps.__dict__ if not n.startswith("_")}


def test_no_runtime_probe_for_a_step():
    """The tier is chosen by `kernels.steps is not None`, never by hasattr/getattr on a step's name."""
    found = []
    for path in (ROOT / "powerinfer_py").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in STEP_NAMES | {"steps"}):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found
    assert "hasattr" not in inspect.getsource(CpuSteps)
