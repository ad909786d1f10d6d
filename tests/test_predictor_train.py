"""Predictor training (powerinfer_py.tools.predictor_fit / predictor_train / predictor_out,
`powerinfer train-predictor`).

Data comes from the synthetic sparse ReLU LLaMA of powerinfer_py.synth.sparse: its neurons fire through a
low-dimensional subspace of the residual stream plus noise the predictor cannot see, so a good low-rank
predictor exists but is not perfect. Quality is judged on tokens the training never saw.
"""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from powerinfer_cli.main import app
from powerinfer_py import load
from powerinfer_py.synth import sparse as S
from powerinfer_py.convert.predictor import read_predictor
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels.ref import dequantize
from powerinfer_py.tools.predictor_fit import FitConfig, fit_layer, predictor_logits, score
from powerinfer_py.tools.predictor_train import collect, train

TINY = dict(S.SHAPES["tiny"], n_vocab=4096)
D, F = TINY["n_embd"], TINY["n_ff"]
SEQ = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(pwri, dense twin) of a 2-layer synthetic ReLU LLaMA, F16."""
    folder = tmp_path_factory.mktemp("predtrain")
    return S.write_sparse_model(folder / "relu.pwri", n_layer=2, dtype="f16", mean_active=0.1, n_sample=256,
                                dense_path=folder / "relu.gguf", **TINY)


@pytest.fixture(scope="module")
def data(models):
    """Per-layer (p, labels) of 3072 training tokens and 1024 fresh tokens, from the dense twin."""
    rng = np.random.default_rng(1)
    ids = rng.integers(3, TINY["n_vocab"], size=4096)
    with load(models[1], threads=1, sparse="off") as llm:
        layers = collect(llm, ids, ctx=SEQ, add_bos=False)
    out = []
    for d in layers:
        p, y = d.arrays()
        out.append(((p[:3072], y[:3072]), (p[3072:], y[3072:])))
    return layers, out


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    from powerinfer_py.synth.common import _WORDS
    path = tmp_path_factory.mktemp("text") / "words.txt"
    path.write_text(" ".join(np.random.default_rng(0).choice(_WORDS, size=600)), encoding="utf-8")
    return path


def test_collected_labels_are_the_nonzero_gate_activations(models, data):
    """The labels match the synthetic generator's own numpy forward pass (an independent implementation)."""
    layers, _ = data
    ids = np.random.default_rng(1).integers(3, TINY["n_vocab"], size=4096).reshape(-1, SEQ)
    ref = S.measure_sparsity(models[1], tokens=ids)
    for il, d in enumerate(layers):
        _, y = d.arrays()
        assert y.shape == (4096, F)
        assert np.abs(y.sum(axis=0) - np.round(ref.frequencies[il] * 4096)).max() <= 2


def test_trained_predictor_reaches_95_recall_at_80_sparsity_on_fresh_tokens(data):
    _, per_layer = data
    # positives weighted 1.5x the class balance: recall ~0.97 at ~84% predicted sparsity here (margin both ways)
    cfg = FitConfig(epochs=12, recall_target=0.95, balance=1.5, backend="numpy")
    from powerinfer_py.tools.predictor_train import LayerData
    results = []
    for il, ((p, y), _) in enumerate(per_layer):
        d = LayerData(F)
        d.add(p, y.astype(np.float32))  # act != 0 <=> label
        results += train([d], "auto", cfg)
    for il, res in enumerate(results):
        # rank auto: the smallest candidate reaching the target, every smaller one tried and short of it
        ranks = [r for r, _ in res.tried]
        assert ranks == sorted(ranks) and ranks[-1] == res.predictor.rank
        assert all(not m.meets(0.95) for _, m in res.tried[:-1]) and res.metrics.meets(0.95)
        (_, _), (p_new, y_new) = per_layer[il]
        m = score(predictor_logits(res.predictor.fc1, res.predictor.fc2, p_new), y_new, 0.0)
        assert m.recall >= 0.95, (il, m)
        assert m.predicted_sparsity >= 0.80, (il, m)
        assert m.true_sparsity > m.predicted_sparsity  # it predicts more than fires, not less


def test_numpy_gradient_matches_finite_differences():
    """bce_grads (what the numpy trainer steps along) against central differences of the class-weighted BCE."""
    from powerinfer_py.tools.predictor_fit import bce_grads
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8))
    y = rng.random((16, 12)) < 0.3
    a, b = rng.standard_normal((8, 4)), rng.standard_normal((4, 12))  # fc1^T, fc2^T
    pw = 2.5

    def loss(a, b):
        logit = np.maximum(x @ a, 0) @ b
        return np.mean(np.where(y, pw * np.logaddexp(0, -logit), np.logaddexp(0, logit)))

    g_a, g_b = bce_grads(x, y, a, b, pw)
    eps = 1e-6
    for w, gw, which in ((a, g_a, 0), (b, g_b, 1)):
        for idx in [(0, 0), (1, 3), (3, 2), (2, 1)]:
            dw = np.zeros_like(w)
            dw[idx] = eps
            plus = loss(a + dw, b) if which == 0 else loss(a, b + dw)
            minus = loss(a - dw, b) if which == 0 else loss(a, b - dw)
            assert gw[idx] == pytest.approx((plus - minus) / (2 * eps), rel=1e-5, abs=1e-10)


def test_torch_backend_trains_as_well(data):
    pytest.importorskip("torch")
    _, per_layer = data
    (p, y), (p_new, y_new) = per_layer[1]
    lp = fit_layer(p, y, 32, FitConfig(epochs=12, balance=1.5, backend="torch", threads=1))
    assert lp.backend == "torch"
    m = score(predictor_logits(lp.fc1, lp.fc2, p_new), y_new)
    assert m.recall >= 0.95 and m.predicted_sparsity >= 0.80, m


def test_cli_writes_a_pwri_that_runs_in_predictor_mode(models, words, tmp_path):
    _, dense = models
    out = tmp_path / "trained.pwri"
    r = CliRunner().invoke(app, ["train-predictor", "-m", str(dense), "--text", str(words), "--rank", "32",
                                 "--epochs", "6", "--backend", "numpy", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "recall" in r.output and "pred.sparsity" in r.output and "mean" in r.output
    f, src = open_gguf(out), open_gguf(dense)
    try:
        assert f.magic == "PWRI" and f.metadata["powerinfer.sparse_threshold"] == 0.0
        for il in range(2):
            p = f"blk.{il}."
            assert f.tensors[p + "fc1.weight"].shape == (32, D) and f.tensors[p + "fc2.weight"].shape == (F, 32)
            assert p + "ffn_down.weight" not in f.tensors
            np.testing.assert_array_equal(dequantize(f.tensors[p + "ffn_down_t.weight"]),
                                          dequantize(src.tensors[p + "ffn_down.weight"]).T)  # F16: exact
            np.testing.assert_array_equal(np.asarray(f.tensors[p + "ffn_gate.weight"].data),
                                          np.asarray(src.tensors[p + "ffn_gate.weight"].data))
        fc1 = dequantize(f.tensors["blk.0.fc1.weight"])
        fc2 = dequantize(f.tensors["blk.0.fc2.weight"])
    finally:
        f.close()
        src.close()
    ids = np.random.default_rng(9).integers(3, TINY["n_vocab"], size=48).tolist()
    # layer 0's predictor input is the same in every mode (it comes before any FFN): capture it densely
    with load(dense, threads=1, sparse="off") as llm:
        seen = {}
        llm.model.ffns[0].observer = lambda il, x, p, act: seen.setdefault(il, p.copy())
        llm.model.forward(ids, llm.model.new_cache(64))
    want = predictor_logits(fc1, fc2, seen[0]) >= 0.0
    with load(out, threads=1) as llm:
        assert llm.sparse.mode == "predictor" and llm.sparse.threshold == 0.0
        for tok in ids:  # decode steps: one token at a time, as generation runs
            llm.model.forward([tok], llm.cache)
        st = llm.sparsity_stats
        assert st.tokens[0] == len(ids)
        assert abs(int(st.active[0]) - int(want.sum())) <= 2  # summation order may flip a logit at 0
        text = "".join(llm.generate("the cat", max_tokens=8, temperature=0))
    assert isinstance(text, str)


def test_cli_pt_format_reads_back_with_the_predictor_reader(models, words, tmp_path):
    pwri, _ = models
    out = tmp_path / "pred"
    r = CliRunner().invoke(app, ["train-predictor", "-m", str(pwri), "--text", str(words), "--rank", "16",
                                 "--epochs", "2", "--format", "pt", "--backend", "numpy", "-o", str(out)])
    assert r.exit_code == 0, r.output
    pred = read_predictor(out, 2, D, F)
    assert pred.ranks == [16, 16] and pred.threshold == 0.0
    assert pred.fc1[0].read().dtype == np.float16 and pred.fc2[1].shape == (F, 16)
    # the same training into a PWRI file gives the same predictor tensors
    again = tmp_path / "again.pwri"
    r = CliRunner().invoke(app, ["train-predictor", "-m", str(pwri), "--text", str(words), "--rank", "16",
                                 "--epochs", "2", "--backend", "numpy", "-o", str(again)])
    assert r.exit_code == 0, r.output
    with open_gguf(again) as f:
        np.testing.assert_array_equal(np.asarray(f.tensors["blk.1.fc2.weight"].data), pred.fc2[1].read())
        # the source PWRI's own ffn_down_t is copied, its predictors replaced
        with open_gguf(pwri) as src:
            np.testing.assert_array_equal(np.asarray(f.tensors["blk.1.ffn_down_t.weight"].data),
                                          np.asarray(src.tensors["blk.1.ffn_down_t.weight"].data))
            assert src.tensors["blk.1.fc1.weight"].shape != f.tensors["blk.1.fc1.weight"].shape


def test_uncalibrated_non_relu_model_is_refused_with_a_clear_error(synthetic_model, words, tmp_path):
    r = CliRunner().invoke(app, ["train-predictor", "-m", str(synthetic_model("qwen2")), "--text", str(words),
                                 "-o", str(tmp_path / "x.pwri")])
    assert r.exit_code == 1
    assert "no threshold calibration" in r.output and "powerinfer calibrate" in r.output
    assert not (tmp_path / "x.pwri").exists()


def test_two_stage_calibration_is_refused_for_labels(synthetic_model, words, tmp_path):
    """A two-stage file's cut-offs apply to |act * up| among candidates, not to |act|: labels from them would be
    wrong, so train-predictor names the one-stage calibration to make instead (calibrate's default is two stages)."""
    from powerinfer_py.tools.calibrate import calibrate

    cal = tmp_path / "two.gguf"
    res = calibrate(synthetic_model("qwen2"), cal, 0.5, text=words.read_text(), n_tokens=200, ctx=64, threads=1)
    assert res.up_sparsity is not None
    out = tmp_path / "x.pwri"
    r = CliRunner().invoke(app, ["train-predictor", "-m", str(cal), "--text", str(words), "--tokens", "100",
                                 "--rank", "16", "--epochs", "1", "--backend", "numpy", "-o", str(out)])
    assert r.exit_code == 1 and "two stages" in r.output and "--one-stage" in r.output, r.output
    assert not out.exists()


@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "qwen3", "lfm2"])  # lfm2: the FFN after conv/attention
def test_glu_model_gets_predictors_that_skip_the_gate(synthetic_model, words, tmp_path, arch):
    """SwiGLU/GeGLU: labels are |act| >= the calibrated cut-offs; the PWRI runs in predictor mode, computing the
    gate only for predicted neurons, and with every neuron predicted it is the dense model."""
    from powerinfer_py.tools.calibrate import calibrate
    from powerinfer_py.models import read_config
    from powerinfer_py.tools.predictor_train import label_cuts
    cal = tmp_path / "cal.gguf"
    calibrate(synthetic_model(arch), cal, 0.5, text=words.read_text(), n_tokens=200, ctx=64, threads=1,
              one_stage=True)
    out = tmp_path / "glu.pwri"
    r = CliRunner().invoke(app, ["train-predictor", "-m", str(cal), "--text", str(words), "--tokens", "300",
                                 "--rank", "16", "--epochs", "3", "--backend", "numpy", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "no exact zeros" in r.output
    text = "the cat and the dog"
    with load(cal, threads=1, sparse="off") as llm:
        cuts = label_cuts(llm.config)
        ids = llm.tokenize(text)
        dense = llm.model.forward(ids, llm.model.new_cache(32), all_logits=True)
        seen = {}
        llm.model.ffns[0].observer = lambda il, x, p, act: seen.setdefault(il, (p.copy(), act.copy()))
        llm.model.forward(ids[1:2], llm.model.new_cache(32))
    with open_gguf(out) as f:
        cfg = read_config(f)
        assert f.magic == "PWRI" and cfg.predictor_ranks == (16,) * cfg.n_layer
        fc1, fc2 = dequantize(f.tensors["blk.0.fc1.weight"]), dequantize(f.tensors["blk.0.fc2.weight"])
    # every neuron predicted active: the dense function
    with load(out, threads=1, sparse="predictor", sparse_threshold=-1e30) as llm:
        got = llm.model.forward(ids, llm.model.new_cache(32), all_logits=True)
    # (gemma3's GELU rounds to f16, as llama.cpp's does: the transposed down projection's other summation order
    # moves some values across an f16 rounding step, ~2e-4 of a logit here)
    # (lfm2's conv layers multiply three projections of the residual, b * u * c, which triples such relative
    # differences before the f16 K/V of the attention layers round them: 4e-4 of a logit here)
    tol = 2e-3 if arch == "gemma3" else 1e-3 if arch == "lfm2" else 1e-4
    np.testing.assert_allclose(got, dense, rtol=tol, atol=tol)
    # threshold 0: layer 0 computes exactly the predicted neurons (its input precedes every FFN)
    with load(out, threads=1) as llm:
        assert llm.sparse.mode == "predictor"
        llm.model.forward(ids[1:2], llm.model.new_cache(32))
        st = llm.sparsity_stats
        p0, act0 = seen[0]
        want = predictor_logits(fc1, fc2, p0) >= 0
        assert abs(int(st.active[0]) - int(want.sum())) <= 1
        assert 0 < st.active[0] < cfg.n_ff
    assert len(cuts) == cfg.n_layer and all(c > 0 for c in cuts)
