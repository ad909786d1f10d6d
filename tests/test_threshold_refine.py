"""Two-stage threshold sparsity (`calibrate`'s default, or `--up-sparsity`; threshold.py): candidates by
|act| * scale >= u_l (their up rows are read), kept by |act * (up·x)| >= t_l. The FFN equals a numpy reference,
the one-token C step gives the Python path's bits, the calibrated file skips the asked fractions on its
calibration text, at its own sparsity and at others from its tables, sparsity 0 is dense bit for bit, files
without the tables run at their one sparsity, and one-stage files keep their rule."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from powerinfer_cli.main import app
from powerinfer_py import load
from powerinfer_py.tools.calibrate import UP_RATIO, calibrate, two_stage_rows
from powerinfer_py.config import KEY_FFN_QUANTILES, KEY_FFN_UP_QUANTILES, KEY_FFN_UP_THRESHOLDS, KEY_UP_SPARSITY
from powerinfer_py.errors import PowerInferError
from powerinfer_py.layers.ffn import FFN, FFNWeights, SparseSettings, SparsityStats
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.writer import write_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.tools.perplexity import perplexity
from powerinfer_py.gguf.types import GGMLType, Tensor
from powerinfer_py.layers.threshold import QUANTILE_GRID

TEXT = ("The ferry left the harbour at dawn, its horn low over the water, and the gulls followed it out past "
        "the breakwater until the town was only a line of roofs. ") * 6
N_TOKENS, CTX, SPARSITY, UP_SPARSITY = 300, 64, 0.5, 0.3
IDS = [1, 5, 9, 3, 7, 11, 2, 40, 17, 8, 21, 33]


@pytest.fixture(scope="module")
def two_stage(synthetic_model, tmp_path_factory):
    """arch -> (source, CalibrationResult of a two-stage calibration at 0.5 / up 0.3) for gemma3, qwen2, qwen3, llama."""
    folder = tmp_path_factory.mktemp("refine")
    out = {}
    for arch in ("gemma3", "qwen2", "qwen3", "llama"):
        src = synthetic_model(arch, "f32")
        out[arch] = src, calibrate(src, folder / f"{arch}.gguf", SPARSITY, text=TEXT, n_tokens=N_TOKENS, ctx=CTX,
                                   threads=1, up_sparsity=UP_SPARSITY)
    return out


def _midpoint_cut(values: np.ndarray, q: float) -> float:
    """A cut-off between two neighbouring values near quantile q, so that no value lies on it."""
    s = np.sort(values.reshape(-1))
    i = int(q * (len(s) - 1))
    return float((s[i] + s[i + 1]) / 2)


@pytest.mark.parametrize("n_tok", [1, 5])
@pytest.mark.parametrize("down", ["dense", "transposed"])
def test_ffn_matches_numpy_reference(synthetic_model, n_tok, down):
    """y = down · (h over the kept neurons) in f64, kept = candidates (|a| * c >= u) with |h| >= t."""
    with load(synthetic_model("gemma3", "f32"), threads=1) as llm:
        base, n, n_ff = llm.model.ffns[1], llm.config.n_layer, llm.config.n_ff
        rng = np.random.default_rng(3 + n_tok)
        x = rng.standard_normal((n_tok, llm.config.n_embd)).astype(np.float32)
        gate, up, dn = (ref.dequantize(t).astype(np.float64).reshape(t.shape) for t in (base.w.gate, base.w.up,
                                                                                      base.w.down))
        x64 = x.astype(np.float64)
        a, u = ref.gelu(x64 @ gate.T), x64 @ up.T
        scale = rng.uniform(0.3, 3.0, n_ff).astype(np.float32)
        score, h = np.abs(a) * scale, a * u
        up_cut = _midpoint_cut(score, 0.3)
        cand = score >= up_cut
        cut = _midpoint_cut(np.abs(h[cand]), 0.35)
        keep = cand & (np.abs(h) >= cut)
        settings = SparseSettings("threshold", 0.0, 0.5, (cut,) * n, down, (tuple(scale),) * n, (up_cut,) * n)
        stats = SparsityStats(n, n_ff, "threshold", 0.0)
        ffn = FFN(llm.kernels, base.w, base.variant, settings, layer=1, stats=stats)
        assert ffn.threshold_path.up_cut is not None and (ffn.threshold_path.down_t is not None) == (down != "dense")
        y = ffn(x)
    assert (keep != cand).any() and (keep != (score >= _midpoint_cut(score, 0.5))).any()  # a different rule
    want = np.where(keep, h, 0.0) @ dn.T
    np.testing.assert_allclose(y, want, atol=2e-3 * np.abs(want).max())  # f32 kernels against f64
    assert int(stats.active[1]) == int(keep.sum())
    assert int(stats.up_read[1]) == int(cand.sum())  # the candidates' up rows, per token
    assert stats.up_read_fraction == pytest.approx(cand.sum() / (n_tok * n_ff))


@pytest.mark.parametrize("ggml_type", (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0), ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["swiglu", "geglu"])
@pytest.mark.parametrize("down", ["dense", "transposed"])
def test_one_token_step_equals_python_path(ggml_type, variant, down):
    from powerinfer_py.kernels.cpu import CpuKernels

    rng = np.random.default_rng(11)
    n_embd, n_ff = 96, 256  # down rows of n_ff values: a whole number of quantized blocks

    def weight(name, rows, cols):
        w = (0.1 * rng.standard_normal((rows, cols))).astype(np.float32)  # pre-activations ~ N(0, 1)
        return Tensor(name, ggml_type, (rows, cols), ref.quantize(w, ggml_type))

    w = FFNWeights(up=weight("ffn_up", n_ff, n_embd), gate=weight("ffn_gate", n_ff, n_embd),
                   down=weight("ffn_down", n_embd, n_ff))
    scale = rng.uniform(0.5, 2.0, n_ff).astype(np.float32)
    for threads in (1, 2):
        k = CpuKernels(threads)
        try:
            x = rng.standard_normal((1, n_embd)).astype(np.float32)
            pre = k.matmul(w.gate, x)[0]
            a = k.silu(pre) if variant == "swiglu" else k.gelu(pre)
            score = np.abs(a) * scale
            up_cut = _midpoint_cut(score, 0.3)
            h = a * k.matmul(w.up, x)[0]
            cut = _midpoint_cut(np.abs(h[score >= up_cut]), 0.3)
            stats = SparsityStats(1, n_ff, "threshold", 0.0)
            ffn = FFN(k, w, variant, SparseSettings("threshold", 0.0, 0.5, (cut,), down, (tuple(scale),), (up_cut,)),
                      stats=stats)
            path = ffn.threshold_path
            assert path.fused is not None and (path.down_t is not None) == (down == "transposed")
            y_fused = ffn(x)
            path.fused = None
            y_python = ffn(x)
            assert np.array_equal(y_fused.view(np.uint32), y_python.view(np.uint32)) and np.abs(y_python).max() > 0
            kept = int(np.count_nonzero((score >= up_cut) & (np.abs(h) >= cut)))
            assert 0 < kept < int(np.count_nonzero(score >= up_cut))
            assert list(stats.active[:1]) == [2 * kept]  # both calls counted the same kept neurons
            n_cand = int(np.count_nonzero(score >= up_cut))
            assert list(stats.up_read[:1]) == [2 * n_cand]  # and the same up rows read (C: pi_ffn_step.up_read)
        finally:
            k.close()


@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "qwen3", "llama"])
def test_skipped_fraction_on_calibration_text(two_stage, arch):
    _, res = two_stage[arch]
    assert res.up_sparsity == UP_SPARSITY and len(res.up_thresholds) == len(res.thresholds)
    assert all(abs(s - SPARSITY) < 0.01 for s in res.skipped)
    assert all(abs(s - UP_SPARSITY) < 0.01 for s in res.up_skipped)
    with open_gguf(res.path) as f:
        assert f.metadata[KEY_UP_SPARSITY] == pytest.approx(UP_SPARSITY)
        np.testing.assert_allclose(f.metadata[KEY_FFN_UP_THRESHOLDS], res.up_thresholds, rtol=1e-6)
        n = len(res.thresholds)
        for key in (KEY_FFN_QUANTILES, KEY_FFN_UP_QUANTILES):  # the two tables, rising with the sparsity
            q = np.asarray(f.metadata[key]).reshape(n, len(QUANTILE_GRID))
            assert (q[:, 0] == 0).all() and (np.diff(q, axis=1) >= 0).all() and (q[:, 1:] > 0).all()
    with load(res.path, threads=1, sparse="threshold") as llm:
        assert all(f.threshold_path.up_cut is not None for f in llm.model.ffns)
        perplexity(llm, TEXT, ctx=CTX, max_tokens=N_TOKENS)
        assert abs(llm.sparsity_stats.skipped_fraction - SPARSITY) <= 0.03


def _without_tables(res, out):
    """A copy of a two-stage file as calibrate wrote it before its quantile tables existed."""
    with open_gguf(res.path) as f:
        meta = {k: v for k, v in f.metadata.items() if k not in (KEY_FFN_QUANTILES, KEY_FFN_UP_QUANTILES)}
        write_gguf(out, meta, f.tensors, types=f.metadata_types)
    return out


def test_sparsity_zero_is_dense_and_other_sparsities_come_from_the_tables(two_stage, tmp_path):
    _, res = two_stage["gemma3"]
    with load(res.path, threads=1, sparse="off") as dense, \
            load(res.path, threads=1, sparse="threshold", sparsity=0) as sp:
        a = dense.model.forward(IDS, dense.model.new_cache(32), all_logits=True)
        b = sp.model.forward(IDS, sp.model.new_cache(32), all_logits=True)
        np.testing.assert_array_equal(a, b)
        assert list(dense.generate_tokens(IDS[:4], max_tokens=8, temperature=0)) == \
            list(sp.generate_tokens(IDS[:4], max_tokens=8, temperature=0))
    for other in (0.3, 0.65):  # between the file's own sparsity's grid rows; the ratio of up rows is the file's
        with load(res.path, threads=1, sparse="threshold", sparsity=other) as llm:
            q = np.asarray(llm.config.ffn_quantiles)
            uq = np.asarray(llm.config.ffn_up_quantiles)
            for il in range(llm.config.n_layer):
                assert llm.sparse.thresholds[il] == pytest.approx(np.interp(other, QUANTILE_GRID, q[il]))
                assert llm.sparse.up_cuts[il] == pytest.approx(np.interp(other, QUANTILE_GRID, uq[il]))
            perplexity(llm, TEXT, ctx=CTX, max_tokens=N_TOKENS)
            assert abs(llm.sparsity_stats.skipped_fraction - other) <= 0.03, other
    with load(res.path, threads=1, sparse="threshold") as llm:  # its own sparsity: the exact cut-offs
        assert llm.sparse.up_cuts == pytest.approx(tuple(res.up_thresholds), rel=1e-6)
    legacy = _without_tables(res, tmp_path / "legacy.gguf")
    with pytest.raises(PowerInferError, match="calibrate it again"):
        load(legacy, threads=1, sparse="threshold", sparsity=0.3)
    with load(legacy, threads=1, sparse="threshold") as llm:
        assert llm.sparse.up_cuts == pytest.approx(tuple(res.up_thresholds), rel=1e-6)


def test_two_stage_rows_match_their_definition():
    """Each grid row: the candidate cut-off is the (ratio * s) quantile of the score, the cut-off the s quantile of
    |h| among candidates with -1 elsewhere (np.quantile on the masked array); all samples used here."""
    rng = np.random.default_rng(7)
    score = np.abs(rng.standard_normal(5000)).astype(np.float32)
    h = (score * rng.standard_normal(5000)).astype(np.float32)
    h = np.abs(h)
    cut, up = two_stage_rows(score, h, 0.6, max_values=10_000)
    assert cut[0] == 0 and up[0] == 0
    for k in (1, 7, 40, 50, 73, 99, 100):
        s = QUANTILE_GRID[k]
        u = np.float32(np.quantile(score.astype(np.float64), 0.6 * s))
        assert up[k] == pytest.approx(u, rel=1e-6)
        masked = np.where(score >= u, h, np.float32(-1)).astype(np.float64)
        assert cut[k] == pytest.approx(np.quantile(masked, s), rel=1e-5), k
    # from a subsample: on all the samples, its cut-offs skip about the grid's fractions
    sub_cut, sub_up = two_stage_rows(score, h, 0.6, max_values=2000)
    for k in range(5, 100, 5):
        cand = score >= sub_up[k]
        assert abs(np.mean(~cand) - 0.6 * QUANTILE_GRID[k]) < 0.03
        assert abs(np.mean(~cand | (h < sub_cut[k])) - QUANTILE_GRID[k]) < 0.03, k


def test_default_is_two_stages_and_one_stage_is_asked_for(synthetic_model, tmp_path):
    src = synthetic_model("qwen2", "f32")
    default = calibrate(src, tmp_path / "d.gguf", 0.4, text=TEXT, n_tokens=N_TOKENS, ctx=CTX, threads=1)
    assert default.up_sparsity == pytest.approx(UP_RATIO * 0.4) and len(default.up_thresholds) == len(default.thresholds)
    assert all(abs(s - UP_RATIO * 0.4) < 0.01 for s in default.up_skipped)
    one = calibrate(src, tmp_path / "o.gguf", 0.4, text=TEXT, n_tokens=N_TOKENS, ctx=CTX, threads=1, one_stage=True)
    assert one.up_sparsity is None and one.up_thresholds is None
    zero = calibrate(src, tmp_path / "z.gguf", 0.0, text=TEXT, n_tokens=50, ctx=CTX, threads=1)
    assert zero.up_sparsity is None and zero.thresholds == [0.0] * len(zero.thresholds)  # nothing to skip
    with pytest.raises(PowerInferError, match="one-stage"):
        calibrate(src, tmp_path / "x.gguf", 0.4, text=TEXT, n_tokens=50, ctx=CTX, threads=1, one_stage=True,
                  up_sparsity=0.2)
    assert not (tmp_path / "x.gguf").exists()


def test_one_stage_file_keeps_its_rule(two_stage, tmp_path):
    """A file calibrated with --one-stage runs one stage; calibrating a two-stage file again that way drops the
    two-stage keys."""
    _, res = two_stage["qwen2"]
    again = calibrate(res.path, tmp_path / "one.gguf", 0.4, text=TEXT, n_tokens=N_TOKENS, ctx=CTX, threads=1,
                      one_stage=True)
    with open_gguf(again.path) as f:
        assert all(k not in f.metadata for k in (KEY_UP_SPARSITY, KEY_FFN_UP_THRESHOLDS, KEY_FFN_UP_QUANTILES))
        assert KEY_FFN_QUANTILES in f.metadata
    with load(again.path, threads=1, sparse="threshold") as llm:
        assert llm.config.ffn_up_thresholds == () and llm.sparse.up_cuts == ()
        assert all(f.threshold_path.up_cut is None for f in llm.model.ffns)
        perplexity(llm, TEXT, ctx=CTX, max_tokens=N_TOKENS)
        assert abs(llm.sparsity_stats.skipped_fraction - 0.4) <= 0.03
        assert llm.sparsity_stats.up_read_fraction is None  # one stage: the up rows read are the kept neurons'


def test_up_rows_read_are_reported(two_stage, tmp_path):
    """Two-stage files count the up rows their first stage reads: about 1 - up_sparsity on the calibration text
    (decode steps in C and batches in Python alike), printed by perplexity and run -v."""
    _, res = two_stage["gemma3"]
    with load(res.path, threads=1, sparse="threshold") as llm:
        perplexity(llm, TEXT, ctx=CTX, max_tokens=N_TOKENS)
        assert abs(llm.sparsity_stats.up_read_fraction - (1 - UP_SPARSITY)) <= 0.03
        llm.sparsity_stats.reset()
        list(llm.generate_tokens(IDS[:3], max_tokens=12, temperature=0))
        st = llm.sparsity_stats
        assert 0 < st.up_read_fraction < 1 and st.up_read.sum() >= st.active.sum()
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    r = CliRunner().invoke(app, ["perplexity", "-m", str(res.path), "--text", str(text), "--tokens", "120", "-c",
                                 str(CTX), "-t", "1", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0.5 < got["up_read_fraction"] < 0.9 and got["skipped_fraction"] > 1 - got["up_read_fraction"]
    r = CliRunner().invoke(app, ["run", "-m", str(res.path), "the ferry", "-n", "4", "--temp", "0", "-v", "-t", "1"])
    assert r.exit_code == 0 and "two stages: ffn_up rows read" in r.stderr, r.output


def test_up_sparsity_must_be_below_sparsity(synthetic_model, tmp_path):
    for up in (0.5, 0.6, -0.1):
        with pytest.raises(PowerInferError, match="up-sparsity|sparsity"):
            calibrate(synthetic_model("gemma3", "f32"), tmp_path / "x.gguf", 0.5, text=TEXT, n_tokens=50, ctx=CTX,
                      threads=1, up_sparsity=up)
    assert not (tmp_path / "x.gguf").exists()


def test_cli_up_sparsity(synthetic_model, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "c.gguf"
    r = CliRunner().invoke(app, ["calibrate", "-m", str(synthetic_model("llama", "f32")), "--sparsity", "0.4",
                                 "--up-sparsity", "0.2", "--text", str(text), "--tokens", "200", "-c", "64", "-t", "1",
                                 "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["up_sparsity"] == pytest.approx(0.2) and len(got["up_thresholds"]) == len(got["thresholds"])
    assert all(abs(s - 0.2) < 0.01 for s in got["up_skipped"])
    r = CliRunner().invoke(app, ["calibrate", "-m", str(synthetic_model("llama", "f32")), "--sparsity", "0.4",
                                 "--up-sparsity", "0.2", "--text", str(text), "--tokens", "200", "-c", "64", "-t", "1",
                                 "-o", str(out)])
    assert r.exit_code == 0 and "up rows skipped: 20.0%" in r.stdout, r.output
    with load(out, threads=1, sparse="threshold") as llm:
        assert llm.config.ffn_up_thresholds == pytest.approx(tuple(got["up_thresholds"]), rel=1e-6)


@pytest.mark.parametrize("down", ["dense", "transposed"])
def test_no_candidate_or_none_kept_gives_zero(synthetic_model, down):
    """Nothing passes the first (or the second) stage: both one-token paths and the batch path return zeros."""
    with load(synthetic_model("gemma3", "f32"), threads=1) as llm:
        base, n = llm.model.ffns[0], llm.config.n_layer
        x = np.random.default_rng(5).standard_normal((3, llm.config.n_embd)).astype(np.float32)
        for up_cut, cut in ((1e30, 1.0), (0.0, 1e30)):
            ffn = FFN(llm.kernels, base.w, base.variant,
                      SparseSettings("threshold", 0.0, 0.5, (cut,) * n, down, (), (up_cut,) * n))
            assert ffn.threshold_path.fused is not None
            outs = [ffn(x[:1])]
            ffn.threshold_path.fused = None
            outs += [ffn(x[:1]), ffn(x)]
            for y in outs:
                assert not np.any(y)


def test_info_shows_two_stages(two_stage, tmp_path):
    _, res = two_stage["qwen2"]
    facts = json.loads(CliRunner().invoke(app, ["info", str(res.path), "--json"]).stdout)
    assert facts["calibration"]["sparsity"] == pytest.approx(SPARSITY)
    assert facts["calibration"]["up_sparsity"] == pytest.approx(UP_SPARSITY)
    assert facts["calibration"]["other_sparsities"] is True  # its two tables
    legacy = json.loads(CliRunner().invoke(app, ["info", str(_without_tables(res, tmp_path / "l.gguf")),
                                                 "--json"]).stdout)
    assert legacy["calibration"]["other_sparsities"] is False  # without them: its one sparsity
    out = CliRunner().invoke(app, ["info", str(res.path)]).output
    assert "two stages" in out and f"{100 * UP_SPARSITY:.0f}% of ffn_up rows" in out
