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
