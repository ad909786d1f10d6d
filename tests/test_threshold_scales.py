"""Neuron scales of threshold sparsity (threshold.py, calibrate.py): the calibrated scales equal a numpy
reference (mean |up·x| per neuron over the calibration windows, normalized to mean 1), the FFN keeps exactly
the neurons with |act| * scale >= cut, files calibrated without scales keep the plain |act| rule, and bad
scale metadata is a ModelFileError."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py import load
from powerinfer_py.tools.calibrate import calibrate
from powerinfer_py.config import KEY_FFN_NEURON_SCALES
from powerinfer_py.errors import ModelFileError
from powerinfer_py.layers.ffn import FFN, SparseSettings, SparsityStats
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.writer import write_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.tools.perplexity import perplexity, windows
from powerinfer_py.tools.predictor_train import LayerData

TEXT = ("A lighthouse keeper wrote every evening about the weather, the passing ships and the gulls on the "
        "rocks below. Some nights the fog came in so thick that the lamp seemed to shine into wool. ") * 5
N_TOKENS, CTX = 300, 64


@pytest.fixture(scope="module")
def pair(synthetic_model, tmp_path_factory):
    """(source, scaled calibration, plain calibration) of a synthetic gemma3 at sparsity 0.4."""
    src = synthetic_model("gemma3", "f32")
    folder = tmp_path_factory.mktemp("scales")
    scaled = calibrate(src, folder / "scaled.gguf", 0.4, text=TEXT, n_tokens=N_TOKENS, ctx=CTX, threads=1)
    plain = calibrate(src, folder / "plain.gguf", 0.4, text=TEXT, n_tokens=N_TOKENS, ctx=CTX, threads=1,
                      scales=False)
    return src, scaled, plain


def _reference_scales(path) -> list[np.ndarray]:
    """Per layer mean |up·x| (f64, numpy dequantized up) over the calibration windows' non-BOS rows, / mean."""
    with load(path, threads=1, n_ctx=CTX, sparse="off") as llm:
        model = llm.model
        xs = [[] for _ in range(llm.config.n_layer)]

        def keep_x(layer, x, p, act):
            xs[layer].append(np.array(x[1:], dtype=np.float64))  # row 0 is BOS: left out, as calibrate does

        ids = llm.tokenize(TEXT, add_bos=False, special=False)[:N_TOKENS]
        cache = model.new_cache(CTX)
        for f in model.ffns:
            f.observer = keep_x
        for w in windows(ids, CTX, llm.tokenizer.bos_id):
            cache.clear()
            model.forward(np.asarray(w, dtype=np.int32), cache)
        out = []
        for il, f in enumerate(model.ffns):
            u = np.concatenate(xs[il]) @ ref.dequantize(f.w.up).astype(np.float64).reshape(f.w.up.shape).T
            c = np.abs(u).mean(axis=0)
            out.append(c / c.mean())
        return out


def test_scales_match_numpy_reference(pair):
    src, scaled, _ = pair
    assert scaled.scaled
    want = _reference_scales(src)
    with open_gguf(scaled.path) as f:
        got = [np.asarray(f.metadata[f"{KEY_FFN_NEURON_SCALES}{il}"]) for il in range(len(want))]
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4)
        assert g.mean() == pytest.approx(1.0, rel=1e-5)
        assert g.std() > 0.01  # the neurons really differ, so the scaled rule is not the plain one
    with load(scaled.path, threads=1, sparse="threshold") as llm:
        assert len(llm.sparse.scales) == llm.config.n_layer
        np.testing.assert_allclose(llm.sparse.scales[2], got[2], rtol=1e-6)
        assert llm.model.ffns[2].threshold_path.scale is not None


def test_plain_calibration_has_no_scales(pair):
    src, scaled, plain = pair
    assert not plain.scaled
    with open_gguf(plain.path) as f:
        assert not [k for k in f.metadata if k.startswith(KEY_FFN_NEURON_SCALES)]
    with load(plain.path, threads=1, sparse="threshold") as llm:
        assert llm.config.ffn_neuron_scales == () and llm.sparse.scales == ()
        assert all(f.threshold_path.scale is None for f in llm.model.ffns)
    assert scaled.thresholds != plain.thresholds  # the cut-offs are on different scores
    # calibrating a scaled file again without scales drops its stale scales
    again = calibrate(scaled.path, scaled.path.with_name("again.gguf"), 0.4, text=TEXT, n_tokens=N_TOKENS,
                      ctx=CTX, threads=1, scales=False)
    with open_gguf(again.path) as f:
        assert not [k for k in f.metadata if k.startswith(KEY_FFN_NEURON_SCALES)]
    np.testing.assert_allclose(again.thresholds, plain.thresholds, rtol=1e-6)


@pytest.mark.parametrize("kind", ["scaled", "plain"])
def test_skipped_fraction_on_calibration_text(pair, kind):
    res = pair[1] if kind == "scaled" else pair[2]
    assert all(abs(s - 0.4) < 0.01 for s in res.skipped)
    with load(res.path, threads=1, sparse="threshold") as llm:
        perplexity(llm, TEXT, ctx=CTX, max_tokens=N_TOKENS)
        assert abs(llm.sparsity_stats.skipped_fraction - 0.4) <= 0.03


@pytest.mark.parametrize("n_tok", [1, 4])
def test_ffn_keeps_by_scaled_score(synthetic_model, n_tok):
    """y = down · (act * up) over the neurons with |act| * scale >= cut only, against numpy in f64."""
    with load(synthetic_model("gemma3", "f32"), threads=1) as llm:
        base = llm.model.ffns[1]
        rng = np.random.default_rng(7 + n_tok)
        x = rng.standard_normal((n_tok, llm.config.n_embd)).astype(np.float32)
        gate, up, down = (ref.dequantize(t).astype(np.float64).reshape(t.shape) for t in
                          (base.w.gate, base.w.up, base.w.down))
        a = ref.gelu(x.astype(np.float64) @ gate.T)
        scale = rng.uniform(0.1, 3.0, llm.config.n_ff).astype(np.float32)
        score = np.abs(a) * scale
        cut = float(np.quantile(score, 0.5))
        n = llm.config.n_layer
        settings = SparseSettings("threshold", 0.0, 0.5, (cut,) * n, "dense", (tuple(scale),) * n)
        stats = SparsityStats(n, llm.config.n_ff, "threshold", 0.0)
        y = FFN(llm.kernels, base.w, base.variant, settings, layer=1, stats=stats)(x)
    keep = score >= cut
    plain = np.abs(a) >= np.quantile(np.abs(a), 0.5)
    assert (keep != plain).any()  # the scales change which neurons run
    want = np.where(keep, a * (x.astype(np.float64) @ up.T), 0.0) @ down.T
    np.testing.assert_allclose(y, want, atol=1e-4 * np.abs(want).max())
    assert abs(int(stats.active[1]) - int(keep.sum())) <= 1  # a neuron at the cut may round either way


def test_bad_scale_metadata(pair, tmp_path):
    _, scaled, _ = pair
    with open_gguf(scaled.path) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        short = dict(meta)
        short[f"{KEY_FFN_NEURON_SCALES}3"] = np.ones(5, dtype=np.float32)
        write_gguf(tmp_path / "short.gguf", short, f.tensors, types=types)
        negative = dict(meta)
        negative[f"{KEY_FFN_NEURON_SCALES}0"] = -np.asarray(meta[f"{KEY_FFN_NEURON_SCALES}0"], dtype=np.float32)
        write_gguf(tmp_path / "negative.gguf", negative, f.tensors, types=types)
        missing = {k: v for k, v in meta.items() if k != f"{KEY_FFN_NEURON_SCALES}4"}
        write_gguf(tmp_path / "missing.gguf", missing, f.tensors,
                   types={k: v for k, v in types.items() if k in missing})
    with pytest.raises(ModelFileError, match=r"ffn_neuron_scales\.3"):
        load(tmp_path / "short.gguf", threads=1)
    with pytest.raises(ModelFileError, match="negative"):
        load(tmp_path / "negative.gguf", threads=1)
    with pytest.raises(ModelFileError, match=r"ffn_neuron_scales\.4.*missing"):
        load(tmp_path / "missing.gguf", threads=1)


def test_predictor_labels_follow_the_scaled_rule():
    act = np.array([[0.5, -2.0, 0.1, 1.0]], dtype=np.float32)
    d = LayerData(4)
    d.add(np.zeros((1, 3), np.float32), act, 0.9, np.array([4.0, 0.1, 1.0, 1.0], np.float32))
    d.add(np.zeros((1, 3), np.float32), act, 0.9)
    _, y = d.arrays()
    assert y.tolist() == [[True, False, False, True], [False, True, False, True]]


@pytest.mark.parametrize("flag", [[], ["--plain"]])
def test_cli_calibrate_plain_flag(synthetic_model, tmp_path, flag):
    import json

    from typer.testing import CliRunner

    from powerinfer_cli.main import app

    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "c.gguf"
    res = CliRunner().invoke(app, ["calibrate", "-m", str(synthetic_model("qwen2", "f32")), "--sparsity", "0.3",
                                   "--text", str(text), "-o", str(out), "--tokens", "80", "-c", "32", "--json",
                                   "-t", "1", *flag])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["neuron_scales"] is (not flag)
    with open_gguf(out) as f:
        assert bool([k for k in f.metadata if k.startswith(KEY_FFN_NEURON_SCALES)]) is (not flag)
