"""Threshold sparsity (threshold.py), calibration (calibrate.py) and perplexity (perplexity.py) on tiny
synthetic SwiGLU/GeGLU models: sparsity 0 is dense, the sparse FFN matches a numpy reference of its
definition, calibration skips the asked fraction, the calibrated file round-trips, perplexity matches numpy."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from powerinfer_cli.main import app
from powerinfer_py import load
from powerinfer_py.tools.calibrate import calibrate
from powerinfer_py.config import KEY_FFN_QUANTILES, KEY_FFN_THRESHOLDS, KEY_SPARSITY
from powerinfer_py.errors import ModelFileError, PowerInferError, UnsupportedError
from powerinfer_py.layers.ffn import SparseSettings
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.writer import write_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.tools.perplexity import perplexity, windows

TEXT = ("The river ran past the mill and under the old stone bridge, where children stood to watch the boats. "
        "In spring the water rose and covered the meadows, and in summer it slowed to a quiet stream. ") * 6
IDS = [1, 5, 9, 3, 7, 11, 2, 40, 17, 8, 21, 33]


@pytest.fixture(scope="module")
def calibrated(synthetic_model, tmp_path_factory):
    """(source, calibrated copy at sparsity 0.5, CalibrationResult) for a synthetic gemma3, qwen2 and qwen3."""
    out = {}
    folder = tmp_path_factory.mktemp("calibrated")
    for arch in ("gemma3", "qwen2", "qwen3"):
        src = synthetic_model(arch, "f32")
        res = calibrate(src, folder / f"{arch}.t50.gguf", 0.5, text=TEXT, n_tokens=400, ctx=64, threads=1)
        out[arch] = (src, res.path, res)
    return out


@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "qwen3"])
def test_sparsity_zero_equals_dense(calibrated, arch):
    _, path, _ = calibrated[arch]
    with load(path, threads=1, sparse="off") as dense, load(path, threads=1, sparse="threshold", sparsity=0) as sp:
        assert sp.sparse.thresholds == (0.0,) * sp.config.n_layer
        a = dense.model.forward(IDS, dense.model.new_cache(32), all_logits=True)
        b = sp.model.forward(IDS, sp.model.new_cache(32), all_logits=True)
        np.testing.assert_array_equal(a, b)
        ta = list(dense.generate_tokens(IDS[:4], max_tokens=10, temperature=0))
        tb = list(sp.generate_tokens(IDS[:4], max_tokens=10, temperature=0))
        assert ta == tb
        assert sp.sparsity_stats.skipped_fraction == 0.0


def test_bench_child_takes_the_sparsity_asked_for(calibrated):
    """`powerinfer bench --sparse threshold --sparsity S` measured the file's calibrated sparsity whatever S was
    (the child dropped it): at 0 every neuron is computed, at the file's 0.5 about half."""
    from powerinfer_py.tools.bench import run_child

    _, path, _ = calibrated["qwen2"]
    dense = run_child("ours", path, 8, 4, 1, sparse="threshold", sparsity=0.0, backend="cpu")
    half = run_child("ours", path, 8, 4, 1, sparse="threshold", backend="cpu", use_mmap=False)
    assert dense.active_fraction == 1.0
    assert 0.3 < half.active_fraction < 0.7, half.active_fraction


def test_sparsity_zero_needs_no_calibration(synthetic_model):
    with load(synthetic_model("gemma3", "f32"), threads=1, sparse="threshold", sparsity=0.0) as llm:
        assert llm.sparse.mode == "threshold"


def _ffn_reference(ffn, x, cut):
    """numpy: h = act(gate x) * (up x) on neurons with |act| >= cut, 0 elsewhere; y = down h (f64)."""
    g = x.astype(np.float64) @ ref.dequantize(ffn.w.gate).astype(np.float64).T
    a = ref.gelu(g) if ffn.variant == "geglu" else ref.silu(g)
    u = x.astype(np.float64) @ ref.dequantize(ffn.w.up).astype(np.float64).T
    h = np.where(np.abs(a) >= cut, a * u, 0.0)
    return h @ ref.dequantize(ffn.w.down).astype(np.float64).T, np.abs(a) >= cut


@pytest.mark.parametrize("down", ["dense", "transposed"])
@pytest.mark.parametrize("n_tok", [1, 5])
def test_threshold_ffn_matches_numpy_reference(synthetic_model, down, n_tok):
    path = synthetic_model("gemma3", "q8_0")
    with load(path, threads=2) as llm:
        from powerinfer_py.layers.ffn import FFN

        base = llm.model.ffns[2]
        x = np.random.default_rng(n_tok).standard_normal((n_tok, llm.config.n_embd)).astype(np.float32)
        a = np.abs(ref.gelu(x.astype(np.float64) @ ref.dequantize(base.w.gate).astype(np.float64).T))
        cut = float(np.quantile(a, 0.5))
        settings = SparseSettings("threshold", 0.0, 0.5, (cut,) * llm.config.n_layer, down)
        from powerinfer_py.layers.ffn import SparsityStats

        stats = SparsityStats(llm.config.n_layer, llm.config.n_ff, "threshold", 0.0)
        ffn = FFN(llm.kernels, base.w, base.variant, settings, layer=2, stats=stats)
        assert (ffn.threshold_path.down_t is not None) == (down == "transposed")
        y = ffn(x)
        want, mask = _ffn_reference(base, x, cut)
    scale = np.abs(want).max()
    assert np.abs(y - want).max() <= 2e-2 * scale  # Q8_0 weights and activations (transposed copy: twice)
    assert abs(int(stats.active[2]) - int(mask.sum())) <= 2  # a neuron at the cut may round either way
    assert 0.3 < stats.skipped_fraction < 0.7


@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "qwen3"])
def test_skipped_fraction_on_calibration_text(calibrated, arch):
    _, path, res = calibrated[arch]
    assert all(abs(s - 0.5) < 0.01 for s in res.skipped)  # on the dense activations, by construction
    with load(path, threads=2, sparse="threshold") as llm:
        assert llm.sparse.sparsity == pytest.approx(0.5)
        perplexity(llm, TEXT, ctx=64, max_tokens=400)  # the same windows the calibration used
        st = llm.sparsity_stats
        assert abs(st.skipped_fraction - 0.5) <= 0.03
        assert all(abs((1 - f) - 0.5) <= 0.06 for f in st.fractions)


def test_other_sparsity_from_the_quantile_table(calibrated):
    _, path, _ = calibrated["gemma3"]
    with load(path, threads=2, sparse="threshold", sparsity=0.3) as llm:
        perplexity(llm, TEXT, ctx=64, max_tokens=400)
        assert abs(llm.sparsity_stats.skipped_fraction - 0.3) <= 0.03


def test_calibrate_round_trip(calibrated):
    src, path, res = calibrated["gemma3"]
    with open_gguf(src) as a, open_gguf(path) as b:
        assert b.metadata[KEY_SPARSITY] == pytest.approx(0.5)
        np.testing.assert_allclose(b.metadata[KEY_FFN_THRESHOLDS], res.thresholds, rtol=1e-6)
        assert len(b.metadata[KEY_FFN_QUANTILES]) == 6 * 101
        assert list(a.tensors) == list(b.tensors)
        for name, t in a.tensors.items():
            np.testing.assert_array_equal(np.asarray(t.data), np.asarray(b.tensors[name].data))
        for key, value in a.metadata.items():
            assert b.metadata[key] == value
    with load(path, threads=1, sparse="threshold") as llm:
        np.testing.assert_allclose(llm.sparse.thresholds, res.thresholds, rtol=1e-6)
        q = np.asarray(llm.config.ffn_quantiles)
        assert q.shape == (6, 101) and (np.diff(q, axis=1) >= 0).all()


def test_calibrate_is_atomic(synthetic_model, tmp_path, monkeypatch):
    import powerinfer_py.gguf.writer as writer

    out = tmp_path / "out.gguf"
    out.write_bytes(b"old")

    def broken(*args, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_write_data", broken)
    with pytest.raises(OSError):
        calibrate(synthetic_model("gemma3", "f32"), out, 0.4, text=TEXT, n_tokens=40, ctx=32, threads=1)
    assert out.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.gguf"]


def test_calibrate_and_threshold_errors(synthetic_model, tmp_path):
    src = synthetic_model("gemma3", "f32")
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(PowerInferError, match="sparsity"):
            calibrate(src, tmp_path / "x.gguf", bad, text=TEXT)
    with pytest.raises(PowerInferError, match="does not exist"):
        calibrate(src, tmp_path / "no" / "x.gguf", 0.4, text=TEXT)
    with pytest.raises(PowerInferError, match="empty"):
        calibrate(src, tmp_path / "x.gguf", 0.4, text="")
    with pytest.raises(PowerInferError, match="powerinfer calibrate"):
        load(src, threads=1, sparse="threshold")
    with pytest.raises(PowerInferError, match="threshold"):
        load(src, threads=1, sparse="off", sparsity=0.4)
    relu = tmp_path / "relu.gguf"
    with open_gguf(synthetic_model("llama", "f32")) as f:
        write_gguf(relu, {**f.metadata, "powerinfer.hidden_act": "relu"}, f.tensors, types=f.metadata_types)
    with pytest.raises(UnsupportedError, match="SwiGLU"):
        calibrate(relu, tmp_path / "x.gguf", 0.4, text=TEXT)
    assert not (tmp_path / "x.gguf").exists()
    with pytest.raises(UnsupportedError, match="SwiGLU"):
        load(relu, threads=1, sparse="threshold")
    # mixer-only layers (mamba2) have no FFN to calibrate: a named error, not an AttributeError
    with pytest.raises(UnsupportedError, match="mamba2 model has none in 2 of its 2 layers"):
        calibrate(synthetic_model("mamba2", "f32", n_layer=2), tmp_path / "x.gguf", 0.4, text=TEXT)
    assert not (tmp_path / "x.gguf").exists()


def test_corrupt_calibration_metadata(synthetic_model, tmp_path):
    with open_gguf(synthetic_model("gemma3", "f32")) as f:
        meta = dict(f.metadata)
        meta[KEY_SPARSITY] = np.float32(0.4)
        meta[KEY_FFN_THRESHOLDS] = np.zeros(3, dtype=np.float32)  # 6 layers
        write_gguf(tmp_path / "bad.gguf", meta, f.tensors, types=f.metadata_types)
    with pytest.raises(ModelFileError, match="ffn_thresholds"):
        load(tmp_path / "bad.gguf", threads=1)


def _numpy_nll(logits, ids):
    lg = logits.astype(np.float64)
    lse = np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) + lg.max(1)
    return lse[:-1] - lg[np.arange(len(ids) - 1), ids[1:]]


def test_perplexity_of_a_model_with_nan_logits_is_a_named_error(synthetic_model, monkeypatch):
    """It used to print "perplexity nan"; now the chunk whose logits are not finite is named."""
    with load(synthetic_model("llama", "f32"), threads=1) as llm:
        forward = llm.model.forward

        def poisoned(tokens, cache, *args, **kw):
            start = cache.n_past
            logits = forward(tokens, cache, *args, **kw)
            if start >= 7:
                logits[..., 3] = np.nan
            return logits

        monkeypatch.setattr(llm.model, "forward", poisoned)
        ids = llm.tokenize(TEXT, add_bos=False, special=False)[:30]
        with pytest.raises(PowerInferError, match=r"logits at positions 7-13 are not finite \(nan\)"):
            perplexity(llm, ids, ctx=32, batch=7)


def test_perplexity_matches_numpy(synthetic_model):
    with load(synthetic_model("llama", "f32"), threads=1) as llm:
        bos = llm.tokenizer.bos_id
        text_ids = llm.tokenize(TEXT, add_bos=False, special=False)[:50]
        # one window: every token scored from BOS on
        seq = np.array([bos] + text_ids, dtype=np.int32)
        nll = _numpy_nll(llm.model.forward(seq, llm.model.new_cache(64), all_logits=True), seq)
        res = perplexity(llm, text_ids, ctx=64, batch=7)
        assert res.n_tokens == 50 and res.n_windows == 1
        assert res.perplexity == pytest.approx(np.exp(nll.mean()), rel=1e-5)
        # windows of 16: [BOS] + 15 tokens each, from an empty cache
        ws = list(windows(text_ids, 16, bos))
        assert [len(w) for w in ws] == [16, 16, 16, 6] and sum(len(w) - 1 for w in ws) == 50
        total = np.concatenate([_numpy_nll(llm.model.forward(np.array(w, np.int32), llm.model.new_cache(16),
                                                             all_logits=True), np.array(w)) for w in ws])
        res = perplexity(llm, text_ids, ctx=16, batch=5)
        assert res.n_windows == 4 and res.n_tokens == 50
        assert res.nll == pytest.approx(total.mean(), rel=1e-5)


def test_windows_without_bos():
    assert list(windows(list(range(7)), 3, None)) == [[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    with pytest.raises(PowerInferError):
        list(windows([1, 2], 1, 0))


def test_cli_calibrate_and_perplexity(synthetic_model, tmp_path):
    runner = CliRunner()
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "c.gguf"
    res = runner.invoke(app, ["calibrate", "-m", str(synthetic_model("qwen2", "f32")), "--sparsity", "0.4",
                              "--text", str(text), "-o", str(out), "--tokens", "100", "-c", "64", "--json", "-t", "1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["sparsity"] == pytest.approx(0.4)
    res = runner.invoke(app, ["perplexity", "-m", str(out), "--text", str(text), "--sparse", "threshold",
                              "--tokens", "60", "-c", "64", "--json", "-t", "1"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["n_tokens"] == 60 and got["sparse"] == "threshold" and 0.3 < got["skipped_fraction"] < 0.5
    res = runner.invoke(app, ["perplexity", "-m", str(synthetic_model("qwen2", "f32")), "--text", str(text),
                              "--sparse", "threshold"])
    assert res.exit_code == 1 and "powerinfer calibrate" in res.stderr


@pytest.mark.parametrize("cmd", ["calibrate", "perplexity"])
def test_help_has_examples(cmd):
    res = CliRunner().invoke(app, [cmd, "--help"])
    assert res.exit_code == 0 and "Examples" in res.stdout and f"powerinfer {cmd} " in res.stdout


def test_calibrate_without_text_samples_the_model(synthetic_model, tmp_path):
    res = calibrate(synthetic_model("qwen2", "f32"), tmp_path / "s.gguf", 0.3, n_tokens=50, ctx=32, threads=1)
    assert res.text_source == "sampled from the model" and res.n_tokens == 50
    assert all(abs(s - 0.3) < 0.02 for s in res.skipped)


def test_auto_down_choice_by_bytes():
    from powerinfer_py.gguf.types import GGMLType, Tensor
    from powerinfer_py.layers.threshold import transposed_type, use_transposed

    def t(ty, nbytes):
        return Tensor("blk.0.ffn_down.weight", ty, (64, 256), np.zeros(nbytes, dtype=np.uint8))

    q8, q4, f16 = t(GGMLType.Q8_0, 64 * 8 * 34), t(GGMLType.Q4_0, 64 * 8 * 18), t(GGMLType.F16, 64 * 256 * 2)
    assert transposed_type(q4) == GGMLType.Q8_0 and transposed_type(f16) == GGMLType.F16
    assert use_transposed(q8, 0.5) and not use_transposed(q4, 0.5)  # a Q8_0 copy of Q4_0 reads ~as much
    assert use_transposed(f16, 0.3) and not use_transposed(f16, 0.2)
    assert not use_transposed(q8, 0.9, "dense") and use_transposed(q4, 0.0, "transposed")


def test_info_shows_the_calibration(calibrated, synthetic_model):
    """`info` names the calibrated sparsity (table and JSON) and keeps the per-neuron arrays out of the JSON."""
    src, path, res = calibrated["gemma3"]
    table = CliRunner().invoke(app, ["info", "-m", str(path)])
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())  # the table wraps long cells
    assert "threshold sparsity" in text and "50% of FFN neurons zeroed, 25% of ffn_up rows skipped (two stages)" in text
    facts = json.loads(CliRunner().invoke(app, ["info", str(path), "--json"]).stdout)
    cal = facts["calibration"]
    assert cal["sparsity"] == 0.5 and cal["up_sparsity"] == 0.25  # two stages by default: half as many up rows
    assert cal["neuron_scales"] is True and cal["other_sparsities"] is True
    np.testing.assert_allclose(cal["thresholds"], res.thresholds, rtol=1e-6)
    assert all(k not in facts["config"] for k in ("ffn_neuron_scales", "ffn_quantiles", "ffn_up_quantiles"))
    plain = json.loads(CliRunner().invoke(app, ["info", str(src), "--json"]).stdout)
    assert plain["calibration"] is None
    assert "threshold sparsity" not in CliRunner().invoke(app, ["info", str(src)]).output
    measured = CliRunner().invoke(app, ["info", str(path), "-v", "-t", "1"])  # runs its default mode: threshold
    assert measured.exit_code == 0, measured.output
    text = " ".join(measured.output.split())  # the table wraps long cells
    assert "computed (above the cut-off) per token, mode threshold" in text


def test_info_takes_the_model_once(calibrated):
    _, path, _ = calibrated["gemma3"]
    for args in (["info"], ["info", str(path), "-m", str(path)]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "give the model once" in res.output


def test_calibrated_file_runs_threshold_by_default(calibrated):
    """A file `calibrate` wrote runs sparse without --sparse (what it was calibrated for); --sparse off is dense;
    the uncalibrated source stays dense; --sparsity alone picks another fraction of the quantile table."""
    src, path, res = calibrated["qwen2"]
    with load(path, threads=1) as llm:
        assert llm.sparse.mode == "threshold" and llm.sparse.sparsity == pytest.approx(0.5)
        default = _all_logits(llm)
    with load(path, threads=1, sparse="threshold") as llm:
        np.testing.assert_array_equal(default, _all_logits(llm))
    with load(path, threads=1, sparse="off") as llm, load(src, threads=1) as plain:
        assert llm.sparse.mode == "off" and plain.sparse.mode == "off"
        dense = _all_logits(llm)
        np.testing.assert_array_equal(dense, _all_logits(plain))
        assert not np.array_equal(dense, default)  # the default really skipped neurons
    with load(path, threads=1, sparsity=0.2) as llm:
        assert llm.sparse.mode == "threshold" and llm.sparse.sparsity == pytest.approx(0.2)


def _all_logits(llm) -> np.ndarray:
    return llm.model.forward(IDS, llm.model.new_cache(32), all_logits=True)
