"""The model-wide mode from the command line: `calibrate --wide` and the per-layer, per-input reports of
`run -v`, `run --json`, `info -v`, `perplexity` and bench's child run."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from powerinfer_cli.main import app
from powerinfer_py.layers.wide import INPUTS

TEXT = " ".join(["a small bird sat on the old wall and sang to the morning sun over the hills"] * 10)
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(synthetic_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("wide_cli")
    (d / "t.txt").write_text(TEXT)
    src = synthetic_model("llama", "q8_0")
    out = d / "w.gguf"
    res = invoke("calibrate", "-m", src, "--wide", "--sparsity", "0.4", "--text", d / "t.txt", "--tokens", "150",
                 "-c", "64", "-t", "1", "--criterion", "greedy", "-o", out)
    assert res.exit_code == 0, res.stderr
    return src, out, d / "t.txt", res.stdout


def test_calibrate_wide_prints_the_criterion_types_and_the_per_input_table(files):
    _, out, _, stdout = files
    assert out.is_file()
    assert "model-wide sparsity 0.4, criterion greedy" in stdout
    # Q8 tiles: 8 bits a code and a 4-byte scale per 32 x 32 tile; a Q8_0 source reads fewer bytes at S = 0
    assert "Q8_0 -> Q8_TILES, 8.50 -> 8.03 bits per weight" in stdout
    assert "note:" not in stdout
    header = next(line for line in stdout.splitlines() if line.startswith("layer"))
    assert all(name in header for name in INPUTS)


def test_calibrate_wide_json_and_the_reencoding_note(synthetic_model, files, tmp_path):
    res = invoke("calibrate", "-m", synthetic_model("llama", "q4_0"), "--wide", "--sparsity", "0.2", "--text",
                 files[2], "--tokens", "100", "-c", "64", "-t", "1", "--criterion", "plain", "-o",
                 tmp_path / "q4.gguf", "--rotate")
    assert res.exit_code == 0, res.stderr
    assert "note: the transposed copy reads" in res.stdout and "ffn_in rotations" in res.stdout
    res = invoke("calibrate", "-m", synthetic_model("llama", "q4_0"), "--wide", "--sparsity", "0.2", "--text",
                 files[2], "--tokens", "100", "-c", "64", "-t", "1", "--criterion", "plain", "-o",
                 tmp_path / "q4b.gguf", "--json")
    out = json.loads(res.stdout)
    assert out["criterion"] == "plain" and out["source_types"] == "Q4_0" and out["stored_types"] == "Q8_TILES"
    assert out["source_bits_per_weight"] == pytest.approx(4.5)
    assert out["stored_bits_per_weight"] == pytest.approx(8 + 32 / 1024)  # every dimension a multiple of 32
    assert len(out["input_skipped"]) == 2 and len(out["input_skipped"][0]) == 4 and not out["rotated"]
    # rotated: one n_embd x n_embd Q8_0 matrix per layer on top
    res = invoke("calibrate", "-m", synthetic_model("llama", "q4_0"), "--wide", "--sparsity", "0.2", "--text",
                 files[2], "--tokens", "100", "-c", "64", "-t", "1", "--criterion", "plain", "-o",
                 tmp_path / "q4c.gguf", "--json", "--rotate")
    rot = json.loads(res.stdout)
    assert rot["rotated"] and rot["rotation_bytes"] == 2 * 64 * 64 * 34 // 32
    assert rot["stored_bytes"] == out["stored_bytes"] + rot["rotation_bytes"]


def test_calibrate_wide_auto_reports_each_criterion(synthetic_model, files, tmp_path):
    res = invoke("calibrate", "-m", synthetic_model("llama", "f32"), "--wide", "--sparsity", "0.3", "--text",
                 files[2], "--tokens", "100", "-c", "64", "-t", "1", "-o", tmp_path / "a.gguf", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out["selection_perplexity"]) == {"plain", "wina", "greedy"}
    assert out["criterion"] == min(out["selection_perplexity"], key=out["selection_perplexity"].get)


def test_run_verbose_reports_every_layer_and_input(files):
    _, out, _, _ = files
    res = invoke("run", "-m", out, "a small bird", "-n", "4", "--temp", "0", "-t", "1", "-v")
    assert res.exit_code == 0, res.stderr
    assert "sparse mode: wide, target sparsity 0.4" in res.stderr
    assert "model-wide sparsity:" in res.stderr and "of the projection weight bytes skipped" in res.stderr
    assert "layer  0:" in res.stderr and "layer  1:" in res.stderr
    for name in INPUTS:
        assert name in res.stderr
    res = invoke("run", "-m", out, "a small bird", "-n", "4", "--temp", "0", "-t", "1", "--json", "--sparsity", "0.2")
    data = json.loads(res.stdout)["sparse"]
    assert data["mode"] == "wide" and data["sparsity"] == 0.2
    w = data["wide"]
    assert w["inputs"] == list(INPUTS) and len(w["layer_input_skipped"]) == 2
    assert 0.0 < w["skipped_fraction"] < 0.5


def test_off_reports_nothing_skipped(files):
    _, out, _, _ = files
    res = invoke("run", "-m", out, "a small bird", "-n", "2", "--temp", "0", "-t", "1", "--json", "--sparse", "off")
    data = json.loads(res.stdout)["sparse"]
    assert data["mode"] == "off" and data["wide"]["skipped_fraction"] == 0.0


def test_info_verbose_and_perplexity_report_the_model_wide_sparsity(files):
    _, out, text, _ = files
    res = invoke("info", str(out), "-v")
    assert res.exit_code == 0, res.stderr
    assert "model-wide sparsity" in res.stdout and "layer  1:" in res.stdout
    res = invoke("perplexity", "-m", out, "--text", text, "-c", "64", "--tokens", "60", "-t", "1")
    assert res.exit_code == 0, res.stderr
    assert "sparse mode wide, skipped" in res.stdout and "of the projection weight bytes (model-wide)" in res.stdout
    assert "layer  0:" in res.stdout
    res = invoke("perplexity", "-m", out, "--text", text, "-c", "64", "--tokens", "60", "-t", "1", "--json")
    data = json.loads(res.stdout)
    assert data["sparse"] == "wide" and 0.2 < data["skipped_fraction"] < 0.6
    assert len(data["wide"]["input_skipped"]) == 4


def test_info_names_the_wide_calibration(files):
    src, out, _, _ = files
    res = invoke("info", str(out))
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())  # the table wraps long cells
    assert "no (dense)" not in text and "run with --sparse wide" in text
    assert "target 0.4 of the projection weight bytes" in text and "criterion greedy" in text
    assert "--sparsity may ask for another fraction" in text
    data = json.loads(invoke("info", str(out), "--json").stdout)
    assert data["wide"] == {"sparsity": 0.4, "criterion": "greedy", "rotated": [], "other_sparsities": True}
    src_data = json.loads(invoke("info", str(src), "--json").stdout)
    assert src_data["wide"] is None
    assert "no (dense)" in invoke("info", str(src)).stdout


def test_bench_child_reports_the_per_input_and_per_layer_shares(files):
    from powerinfer_py.tools.bench import run_child

    _, out, _, _ = files
    r = run_child("ours", out, 8, 6, 1)
    assert r.sparse == "wide"
    assert len(r.wide_skipped) == 4 and len(r.wide_layers) == 2
    assert 0 < 1 - r.active_fraction < 1
    off = run_child("ours", out, 8, 6, 1, sparse="off")
    assert off.wide_layers == [0.0, 0.0]
