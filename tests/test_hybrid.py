"""The hybrid executor on the emulated device (`cpu-emulated`): hot neurons gathered into compact "device"
tensors, the predicted active set split between the two halves, partial outputs summed. It must reproduce the
CPU-only run token for token, bit for bit when one half is empty, and never use more than its budget."""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import powerinfer_py
from powerinfer_py.errors import PowerInferError
from powerinfer_py.hybrid.gpuidx import read_gpuidx, write_gpuidx
from powerinfer_py.hybrid.placement import GIB, GROUP
from powerinfer_py.synth.sparse import SHAPES, write_sparse_model

PROMPT = [1, 17, 230, 45, 99, 3, 310, 77]
N_GEN = 12


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hybrid")
    return {dt: write_sparse_model(folder / f"m-{dt}.pwri", n_layer=2, dtype=dt, n_sample=256, **SHAPES["tiny"])[0]
            for dt in ("f16", "q4_0")}


def _run(path, **kw):
    """(generated tokens, logits of the prompt's last token, the LLM's backend report lines)."""
    llm = powerinfer_py.load(path, threads=1, n_ctx=64, **kw)
    try:
        toks = list(llm.generate_tokens(PROMPT, max_tokens=N_GEN, temperature=0))
        llm.reset()
        logits = llm.model.forward(PROMPT, llm.cache)
        lines = llm.backend.lines() if llm.backend is not None else []
        used = getattr(llm.backend.device, "used", None) if llm.backend and llm.backend.device else None
        plan = llm.backend.plan if llm.backend else None
        return toks, logits, lines, used, plan
    finally:
        llm.close()


def _fixed_and_ffn(path):
    """(fixed bytes, all FFN neuron bytes) of a model, for budgets relative to it."""
    from powerinfer_py.models import read_config
    from powerinfer_py.gguf import open_gguf
    from powerinfer_py.hybrid.placement import footprint
    f = open_gguf(path)
    c = read_config(f)
    fp = footprint(c, f.tensors, 64)
    return fp.fixed_bytes, sum(fp.neuron_bytes) * c.n_ff


@pytest.mark.parametrize("dtype", ["f16", "q4_0"])
def test_emulated_hybrid_matches_cpu_token_for_token(models, dtype):
    path = models[dtype]
    cpu_toks, cpu_logits, lines, _, _ = _run(path, backend="cpu")
    assert lines == ["backend: cpu (asked for)"]
    fixed, ffn = _fixed_and_ffn(path)
    for frac in (0.3, 0.6):
        budget = fixed + int(frac * ffn)
        toks, logits, lines, used, plan = _run(path, backend="cpu-emulated", vram_budget=budget / GIB)
        assert toks == cpu_toks
        np.testing.assert_allclose(logits, cpu_logits, rtol=1e-5, atol=1e-5 * np.abs(cpu_logits).max())
        assert used == plan.device_bytes <= budget  # the arena holds exactly the plan, within the budget
        assert 0 < sum(plan.n_hot) < plan.n_ff * len(plan.hot)
        assert lines[0].startswith("backend: hybrid cpu-emulated")
        share = float(lines[-1].split(": ")[1].rstrip("%"))
        assert 0 < share < 100  # both halves computed active neurons


@pytest.mark.parametrize("dtype", ["f16", "q4_0"])
def test_one_empty_half_is_bit_identical(models, dtype):
    path = models[dtype]
    _, cpu_logits, _, _, _ = _run(path, backend="cpu")
    fixed, ffn = _fixed_and_ffn(path)
    for budget in (fixed, fixed + ffn):  # nothing on the device / everything on the device
        _, logits, _, _, plan = _run(path, backend="cpu-emulated", vram_budget=budget / GIB)
        assert sum(plan.n_hot) == (0 if budget == fixed else plan.n_ff * len(plan.hot))
        assert np.array_equal(logits, cpu_logits)


def test_sidecar_placement_is_used_and_checked(models, tmp_path):
    path = models["f16"]
    fixed, ffn = _fixed_and_ffn(path)
    _, cpu_logits, _, _, _ = _run(path, backend="cpu")
    _, _, _, _, plan = _run(path, backend="cpu-emulated", vram_budget=(fixed + ffn // 2) / GIB)
    side = write_gpuidx(tmp_path / "p.gpuidx", plan)
    _, logits, _, used, got = _run(path, backend="cpu-emulated", placement=side)
    assert [list(h) for h in got.hot] == [list(h) for h in read_gpuidx(side).hot]
    assert used == plan.device_bytes
    np.testing.assert_allclose(logits, cpu_logits, rtol=1e-5, atol=1e-5 * np.abs(cpu_logits).max())
    with pytest.raises(PowerInferError, match="budget"):
        _run(path, backend="cpu-emulated", placement=side, vram_budget=(fixed + GROUP) / GIB)


def test_auto_without_a_device_runs_on_the_cpu_and_says_why(models):
    from powerinfer_py.kernels.cuda import cuda_status
    if cuda_status().available:
        pytest.skip("a CUDA device is present: auto runs the hybrid backend (tests/test_cuda.py)")
    _, _, lines, _, _ = _run(models["f16"], backend="auto")
    assert lines[0].startswith("backend: cpu (CUDA unavailable: ")


def test_place_cli_prints_and_writes_the_plan(models, tmp_path):
    from powerinfer_cli.main import app
    path = models["q4_0"]
    fixed, ffn = _fixed_and_ffn(path)
    out = tmp_path / "m.gpuidx"
    res = CliRunner().invoke(app, ["place", "-m", str(path), "--vram-budget", str((fixed + ffn / 2) / GIB),
                                   "-c", "64", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "layer" in res.output and "activations on the device" in res.output
    plan = read_gpuidx(out, n_layer=2)
    assert all(len(h) % GROUP == 0 for h in plan.hot) and sum(map(len, plan.hot)) > 0
    res = CliRunner().invoke(app, ["place", "-m", str(path), "--vram-budget", "0.000001", "-c", "64"])
    assert res.exit_code == 1 and "below" in res.output


def test_info_and_verbose_run_say_which_backend_runs_and_why(models):
    import json

    from powerinfer_cli.main import app

    from powerinfer_py.kernels.cuda import cuda_status
    path = str(models["f16"])
    res = CliRunner().invoke(app, ["info", path, "--json"])
    assert res.exit_code == 0
    assert json.loads(res.output)["cuda"] == {"available": cuda_status().available, "reason": cuda_status().reason}
    res = CliRunner().invoke(app, ["run", "-m", path, "hello", "-n", "2", "--temp", "0", "-c", "64", "-v",
                                   "--backend", "cpu-emulated", "--vram-budget", "0.01"])
    assert res.exit_code == 0, res.output
    assert "backend: hybrid cpu-emulated" in res.output and "placement:" in res.output
    res = CliRunner().invoke(app, ["run", "-m", path, "hello", "-n", "2", "--temp", "0", "-c", "64", "-v"])
    assert res.exit_code == 0 and "backend: " in res.output
    if not cuda_status().available:
        assert "CUDA unavailable" in res.output


@pytest.mark.parametrize("arch,act,param", [("llama", "fatrelu", 0.1), ("bamboo", None, None),
                                            ("falcon", None, None), ("opt", None, None)])
def test_emulated_hybrid_every_sparse_architecture(tmp_path, arch, act, param):
    """ReGLU/FATReLU/dReLU/ReLU FFNs, opt's ffn_up and ffn_down_t biases (b_up gathered, b_down added once),
    batched prefill (per-token masks split between the halves) and decode, against the unsplit model."""
    from reference_sparse import write_tiny_sparse
    from test_sparse_engine import greedy, load

    from powerinfer_py.hybrid import attach_backend
    from powerinfer_py.kernels.cpu import CpuKernels
    from powerinfer_py.hybrid.placement import footprint

    kw = {"hidden_act": act, "hidden_act_param": param} if act else {}
    path = write_tiny_sparse(tmp_path / f"{arch}.gguf", arch, **kw)
    k = CpuKernels(n_threads=1)
    try:
        want_toks, want = greedy(load(path, k))
        model = load(path, k)
        from powerinfer_py.gguf import open_gguf
        tensors = open_gguf(path).tensors
        fp = footprint(model.config, tensors, 64)
        budget = fp.fixed_bytes + sum(fp.neuron_bytes) * model.config.n_ff // 2
        report = attach_backend(model, tensors, path, 64, "cpu-emulated", budget / GIB)
        assert 0 < sum(report.plan.n_hot) < model.config.n_ff * model.config.n_layer
        toks, got = greedy(model)
        assert toks == want_toks
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        assert sum(s.device_rows for s in report.splits) and sum(s.cpu_rows for s in report.splits)
    finally:
        k.close()
