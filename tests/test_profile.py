"""Activation profiling (powerinfer_py.tools.profile, `powerinfer profile`).

The synthetic sparse ReLU LLaMA of powerinfer_py.synth.sparse has designed per-neuron firing probabilities and its
own numpy forward pass (measure_sparsity), independent of our engine: the profile must count exactly what that
forward pass sees on the same tokens, and agree with it on fresh tokens within sampling error.
"""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from typer.testing import CliRunner

from powerinfer_cli.main import app
from powerinfer_py import load
from powerinfer_py.synth import sparse as S
from powerinfer_py.convert.torch_pt import read_pt
from powerinfer_py.tools.observe import observe
from powerinfer_py.tools.plot import read_png_size
from powerinfer_py.tools.profile import (
    BINS_PER_DECADE,
    abs_histogram,
    abs_threshold,
    load_profile,
    profile_model,
    read_activation_counts,
)

TINY = dict(S.SHAPES["tiny"], n_vocab=4096)  # a larger vocabulary: random tokens are nearly all distinct
SEQ = 64


@pytest.fixture(scope="module")
def sparse_model(tmp_path_factory):
    """(path, n_layer) of a 12-layer synthetic ReLU LLaMA (more than 10 layers: file order is checked)."""
    path = tmp_path_factory.mktemp("profile") / "relu12.pwri"
    S.write_sparse_model(path, n_layer=12, dtype="f32", mean_active=0.1, n_sample=256, **TINY)
    return path, 12


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    rng = np.random.default_rng(0)
    from powerinfer_py.synth.common import _WORDS
    path = tmp_path_factory.mktemp("text") / "words.txt"
    path.write_text(" ".join(rng.choice(_WORDS, size=700)), encoding="utf-8")
    return path


def _random_ids(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, TINY["n_vocab"], size=(n // SEQ, SEQ))


def test_profile_counts_what_an_independent_forward_pass_sees(sparse_model):
    path, n_layer = sparse_model
    ids = _random_ids(5, 1024)
    with load(path, threads=1, sparse="off") as llm:
        res = profile_model(llm, None, ids=ids.reshape(-1), ctx=SEQ, add_bos=False)
    ref = S.measure_sparsity(path, tokens=ids)  # numpy forward of the stored weights, same sequences
    assert res.summary["tokens"] == ids.size
    for il in range(n_layer):
        want = np.round(ref.frequencies[il].astype(np.float64) * ids.size)
        # the engine and numpy sum in different orders: a neuron right at 0 may flip on a token or two
        assert np.abs(res.profile.counts[il] - want).max() <= 2, il
        assert res.summary["layers"][il]["active_fraction"] == pytest.approx(res.profile.counts[il].sum()
                                                                              / (ids.size * TINY["n_ff"]))


def test_profile_recovers_firing_probabilities_within_sampling_error(sparse_model):
    path, _ = sparse_model
    n, n_ref = 2048, 8192
    with load(path, threads=1, sparse="off") as llm:
        res = profile_model(llm, None, ids=_random_ids(11, n).reshape(-1), ctx=SEQ, add_bos=False)
    truth = S.measure_sparsity(path, n_tokens=n_ref, seq_len=SEQ, seed=77).frequencies  # other tokens
    for il in (0, 1, 11):
        f, p = res.profile.fractions(il), truth[il].astype(np.float64)
        z = (f - p) / np.sqrt(np.maximum(p * (1 - p), 1e-4) * (1 / n + 1 / n_ref))
        assert np.mean(np.abs(z) < 3) >= 0.97, il  # ~99.7% for Gaussian sampling error
        assert np.abs(z).max() < 6, il
        intended = S.intended_probabilities(0, il, TINY["n_ff"], 0.1, 1.0)  # the generator's design
        assert np.corrcoef(f, intended)[0, 1] > 0.98
        assert abs(f.mean() - 0.1) < 0.02


def test_cli_writes_activation_files_in_numeric_order_json_and_png(sparse_model, words, tmp_path):
    path, n_layer = sparse_model
    out, png = tmp_path / "prof", tmp_path / "freq.png"
    r = CliRunner().invoke(app, ["profile", "-m", str(path), "--text", str(words), "--tokens", "600",
                                 "--ctx", "128", "-o", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert "profiled 600 tokens of the given text" in r.output
    s = load_profile(out)
    assert s["tokens"] == 600 and s["relu_family"] and s["source"] == "text" and len(s["layers"]) == n_layer
    names = sorted(p.name for p in (out / "activation").iterdir())
    assert names == sorted(f"activation_{i}.pt" for i in range(n_layer))
    counts = read_activation_counts(out)
    assert len(counts) == n_layer
    for il in range(n_layer):
        direct = read_pt(out / "activation" / f"activation_{il}.pt").read()
        assert direct.dtype == np.int64 and direct.shape == (TINY["n_ff"],)
        np.testing.assert_array_equal(counts[il], direct)  # layer 10 is read as layer 10, not 2
        frac = s["layers"][il]["active_fraction"]
        assert direct.sum() == pytest.approx(frac * 600 * TINY["n_ff"])
        assert direct.max() <= 600
    assert not np.array_equal(counts[2], counts[10])
    # the picture: a PNG of the documented size whose pixels are not all background
    assert read_png_size(png) == (900, 560)
    raw = png.read_bytes()
    at = raw.index(b"IDAT")
    size = int.from_bytes(raw[at - 4:at], "big")
    rows = np.frombuffer(zlib.decompress(raw[at + 4:at + 4 + size]), dtype=np.uint8).reshape(560, -1)
    assert (rows[:, 0] == 0).all() and (rows[:, 1:] != 255).mean() > 0.01


def test_activation_files_load_in_torch(sparse_model, words, tmp_path):
    torch = pytest.importorskip("torch")
    path, n_layer = sparse_model
    with load(path, threads=1, sparse="off") as llm:
        res = profile_model(llm, words.read_text(), 300)
    from powerinfer_py.tools.profile import write_profile
    write_profile(tmp_path, res)
    for il in (0, 2, 10, 11):
        t = torch.load(tmp_path / "activation" / f"activation_{il}.pt", weights_only=True)
        assert t.dtype == torch.int64 and tuple(t.shape) == (TINY["n_ff"],)
        np.testing.assert_array_equal(t.numpy(), res.profile.counts[il])


def test_sampled_calibration_text_is_said_and_saved(sparse_model, tmp_path):
    path, _ = sparse_model
    r = CliRunner().invoke(app, ["profile", "-m", str(path), "--tokens", "40", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "sampling 40 calibration tokens from the model itself" in r.output
    assert "text sampled from the model" in r.output
    s = json.loads((tmp_path / "profile.json").read_text())
    assert s["source"] == "sampled" and s["tokens"] == 40
    assert (tmp_path / "calibration.txt").read_text(encoding="utf-8").strip()


def test_non_relu_profile_gives_the_abs_distribution(synthetic_model, tmp_path):
    path = synthetic_model("gemma3")
    text = "the cat and the dog went to the house in the sun " * 12
    with load(path, threads=1) as llm:
        res = profile_model(llm, text, ctx=64, batch=32, count_sparsity=0.6)
        seen: dict[int, list] = {}
        observe(llm, llm.tokenize(text, add_bos=False), lambda il, p, a: seen.setdefault(il, []).append(a.copy()),
                ctx=64, batch=32)
    s = res.summary
    assert not s["relu_family"] and s["ffn_variant"] == "geglu" and s["active_definition"].startswith("|act|")
    for il, entry in enumerate(s["layers"]):
        acts = np.abs(np.concatenate(seen[il]))
        h = entry["abs_hist"]
        assert h["zeros"] + h["below"] + sum(h["counts"]) + h["above"] == acts.size == s["tokens"] * s["n_ff"]
        q = [entry["abs_quantiles"][k] for k in ("0.1", "0.5", "0.9")]
        assert q[0] < q[1] < q[2]
        for frac in (0.3, 0.5, 0.8):
            t = abs_threshold(entry, frac)
            assert abs(np.mean(acts < t) - frac) < 0.01  # bins are 1/32 decade wide
        # counts: |act| above the 0.6 quantile of the first batch (32 tokens, BOS left out)
        thr = np.quantile(acts[:31], 0.6)
        assert entry["count_threshold"] == pytest.approx(thr, rel=1e-6)
        np.testing.assert_array_equal(res.profile.counts[il], (acts > np.float32(thr)).sum(axis=0))


def test_abs_threshold_on_a_known_distribution():
    rng = np.random.default_rng(3)
    v = np.concatenate([np.zeros(40_000), 10.0 ** rng.uniform(-3, 1, size=60_000)]).astype(np.float32)
    h = abs_histogram(v)
    entry = {"abs_hist": {"log10_min": -8, "bins_per_decade": BINS_PER_DECADE, "zeros": int(h[0]),
                          "below": int(h[1]), "above": int(h[-1]), "counts": h[2:-1].tolist()}}
    assert h[0] == 40_000 and h.sum() == v.size
    assert abs_threshold(entry, 0.3) == 0.0  # inside the zeros
    # the rest is log-uniform on [1e-3, 10]: a fraction 0.4 + 0.6 * (log10 t + 3) / 4 lies below t
    for t_want in (1e-2, 0.1, 3.0):
        frac = 0.4 + 0.6 * (np.log10(t_want) + 3) / 4
        assert abs_threshold(entry, frac) == pytest.approx(t_want, rel=0.05)
