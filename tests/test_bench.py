"""`powerinfer bench` end to end on a tiny model: both engines run in their own processes and the report holds
their medians and ratios (the speed itself is measured by hand, never asserted)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from reference_sparse import write_tiny_sparse


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--sparse", "off", "--backend", "cpu"]])
def test_bench_reports_both_engines(synthetic_model, extra):
    path = synthetic_model("llama", "q8_0")
    proc = subprocess.run([sys.executable, "-m", "powerinfer_cli", "bench", "-m", str(path), "-n", "4", "-p", "8",
                           "-r", "1", "-t", "1", "--json", *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    engines = {r["engine"] for r in report["runs"]}
    assert engines == {"ours", "llamacpp"}, report["runs"]
    assert all(r["n_gen"] == 4 and r["decode_tok_s"] > 0 for r in report["runs"])
    assert report["ratio"]["decode_tok_s"] > 0 and report["ratio"]["prompt_tok_s"] > 0
    assert report["engines"]["ours"]["sparse"] == "off" and report["memory"]["within_budget"] in (True, False)


def test_child_peak_rss_leaves_out_the_parent():
    """A bench child must report its own peak: ru_maxrss would carry the parent's resident set over the exec
    (here 400 MB held by this process while it starts the child)."""
    import numpy as np

    held = np.ones(400 * 2**20, dtype=np.uint8)  # touched, so resident
    code = "from powerinfer_py.tools.bench import _peak_rss_bytes; print(_peak_rss_bytes())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    child = int(out.stdout)
    assert held.sum() == held.size
    assert 10 * 2**20 < child < 300 * 2**20, child


def test_child_reports_the_predictor_share(tmp_path):
    """Predictor mode's bench run carries the predictor's share of the decode time (from the one-token C step's
    timers); modes without a predictor report none."""
    from powerinfer_py.tools.bench import run_child

    path = write_tiny_sparse(tmp_path / "tiny.pwri", "llama", dtype="q4_0")
    pred = run_child("ours", path, 8, 6, 1, sparse="predictor", backend="cpu")
    assert 0 < pred.predictor_share < 1, pred
    for mode in ("exact", "off"):
        assert run_child("ours", path, 8, 6, 1, sparse=mode, backend="cpu").predictor_share is None


def test_llama_cpp_crash_with_repacked_buffers_is_measured_again_without_them(synthetic_model, monkeypatch):
    """llama.cpp's AMX buffers crashed it on an AMX host (SIGSEGV): bench measures it again with repacking off,
    keeps it off for the later reps and says so; a crash without repacking, or of our engine, is an error."""
    from powerinfer_py.errors import PowerInferError
    from powerinfer_py.tools import bench

    path = synthetic_model("llama", "q8_0")
    calls, crash_always = [], []

    def fake(engine, model, n_prompt, n_gen, threads, llamacpp_repack=None, **kw):
        calls.append((engine, llamacpp_repack))
        if engine == "llamacpp" and (llamacpp_repack or crash_always):
            raise bench.ChildCrashed("bench: the llamacpp run failed (exit -11): (no output)", 11)
        return bench.EngineRun(engine, n_prompt, n_gen, threads, 0.1, 0.5, 0.5, 1, 0, 1, 0)

    monkeypatch.delenv(bench.LLAMACPP_REPACK_ENV, raising=False)
    monkeypatch.setattr(bench, "run_child", fake)
    report = bench.run_bench(path, n_gen=4, n_prompt=8, threads=1, reps=2)
    assert calls == [("ours", True), ("llamacpp", True), ("llamacpp", False), ("llamacpp", False), ("ours", False)]
    assert [r.engine for r in report.runs] == ["ours", "llamacpp", "llamacpp", "ours"]
    assert any("signal 11" in w and "--no-repack" in w for w in report.warnings), report.warnings

    monkeypatch.setenv(bench.LLAMACPP_REPACK_ENV, "0")  # already off: the crash is llama.cpp's own, reported
    crash_always.append(True)
    with pytest.raises(PowerInferError, match="exit -11"):
        bench.run_bench(path, n_gen=4, n_prompt=8, threads=1, reps=1)


def test_llama_cpp_ref_can_load_without_repacked_buffers(synthetic_model, monkeypatch):
    """repack=False, or POWERINFER_LLAMACPP_REPACK=0, loads llama.cpp without its repacked buffers (decoding
    with them is not tried here: that is what crashed on an AMX host)."""
    import numpy as np

    from powerinfer_py.tools.bench import LLAMACPP_REPACK_ENV, LlamaCppRef

    path = synthetic_model("llama", "q8_0")
    for env, repack, want in ((None, False, False), ("0", None, False), (None, None, True), ("0", True, True)):
        if env is None:
            monkeypatch.delenv(LLAMACPP_REPACK_ENV, raising=False)
        else:
            monkeypatch.setenv(LLAMACPP_REPACK_ENV, env)
        ref = LlamaCppRef(path, n_ctx=32, threads=1, repack=repack)
        try:
            assert ref.repack is want, (env, repack)
            if not want:
                assert np.isfinite(ref.decode([1, 2, 3, 4])).all()
        finally:
            ref.close()


def test_amx_warning_follows_llama_cpp_and_the_switch(monkeypatch):
    from powerinfer_py.tools.bench import LLAMACPP_REPACK_ENV, llamacpp_amx_risk, llamacpp_reports_amx

    monkeypatch.setenv(LLAMACPP_REPACK_ENV, "0")
    assert llamacpp_amx_risk() is None  # repacking already off: nothing to warn of
    monkeypatch.setenv(LLAMACPP_REPACK_ENV, "1")
    amx = llamacpp_reports_amx()
    risk = llamacpp_amx_risk()
    assert (risk is not None) == amx
    if amx:
        assert f"{LLAMACPP_REPACK_ENV}=0" in risk
