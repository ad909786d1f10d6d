"""Arcee AFM (arch "arcee"): the llama block with an ungated squared-ReLU FFN, y = Wdown · relu(Wup · m)^2.

Checked here: the config and tensor table (no ffn_gate), the "relu2" FFN against a numpy reference in every
mode that runs it, logits against llama.cpp on synthetic arcee files (f32, q8_0, and f32 with YaRN and
rope_freqs.weight), `--sparse exact` bit for bit `off` with the same active-neuron counts, the CLI's report of
the active fraction, and the errors for the sparse modes an arcee file cannot run.

How far off the obvious mistake would be (max |logit difference| / std of llama.cpp's logits, f32 file below):
a plain ReLU instead of the squared one 2.05 (test_plain_relu_is_far_off); the correct model 0.0007 (q8_0:
0.045; YaRN + rope_freqs: 0.0009), against tolerances of 0.01 and 0.12 as in tests/test_moe.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import assert_matches_llama_cpp
from typer.testing import CliRunner

from powerinfer_py import load
from powerinfer_py.errors import UnsupportedError
from powerinfer_py.layers.ffn import FFN, FFNWeights, SparseSettings, SparsityStats, ffn_variant
from powerinfer_py.gguf import open_gguf
from powerinfer_py.models import expected_tensors, read_config
from powerinfer_py.synth import write_synthetic_model
from powerinfer_py.gguf.types import GGMLType, Tensor

# <s> then the pieces of "Hello world, th"
TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]
YARN = dict(n_ctx_train=64, rope_scaling={"type": "yarn", "factor": 4.0, "original_context_length": 16},
            rope_freqs=tuple(np.linspace(1.0, 3.0, 8)))  # head_dim 16: 8 factors


def all_logits(path, sparse=None) -> tuple[np.ndarray, list[np.ndarray], object]:
    """(one batch's logits, the same tokens one at a time, the sparsity counts after both) on the file."""
    with load(path, threads=2, sparse=sparse) as llm:
        net = llm.model
        batch = net.forward(np.array(TOKENS, np.int32), net.new_cache(32), all_logits=True)
        cache = net.new_cache(32)
        steps = [net.forward(np.array([t], np.int32), cache) for t in TOKENS]
        st = net.sparsity
        counts = (st.tokens.copy(), st.active.copy(), st.nonzero.copy())
    return batch, steps, counts


def test_config_and_tensors(synthetic_model):
    """Normal RoPE, untied head, the relu2 FFN, dense by default; the tensor table has up and down, no gate."""
    path = synthetic_model("arcee", "f32")
    c = read_config(open_gguf(path))
    assert c.arch == "arcee" and not c.rope_neox and not c.tied_output and c.n_rot == c.head_dim
    assert ffn_variant(c) == "relu2" and c.n_expert == 0
    e = expected_tensors(c)
    assert "blk.0.ffn_up.weight" in e and "blk.1.ffn_down.weight" in e
    assert not any("ffn_gate" in name for name in e)
    assert e["rope_freqs.weight"] == ((c.n_rot // 2,), False)
    with load(path, threads=1) as llm:
        assert llm.sparse.mode == "off" and llm.model.sparsity is not None


@pytest.mark.parametrize("mode", ["off", "exact"])
@pytest.mark.parametrize("n_tok", [1, 5])
def test_relu2_ffn_matches_numpy(cpu_kernels, mode, n_tok):
    """One relu2 FFN against float64 numpy: y = Wdown · relu(Wup · x)^2; counts of active neurons as numpy's."""
    rng = np.random.default_rng(7)
    n_embd, n_ff = 32, 48
    up = rng.standard_normal((n_ff, n_embd), dtype=np.float32) / np.float32(np.sqrt(n_embd))
    down = rng.standard_normal((n_embd, n_ff), dtype=np.float32) / np.float32(np.sqrt(n_ff))
    x = rng.standard_normal((n_tok, n_embd), dtype=np.float32)
    w = FFNWeights(up=Tensor("up", GGMLType.F32, up.shape, up), down=Tensor("down", GGMLType.F32, down.shape, down))
    stats = SparsityStats(1, n_ff, mode, 0.0)
    y = FFN(cpu_kernels, w, "relu2", SparseSettings(mode, 0.0), stats=stats)(x)
    u = x.astype(np.float64) @ up.T.astype(np.float64)
    want = (np.maximum(u, 0) ** 2) @ down.T.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert stats.active[0] == np.count_nonzero(u > 0) == stats.nonzero[0] and stats.tokens[0] == n_tok
    with pytest.raises(ValueError, match="has no ffn_gate"):
        FFN(cpu_kernels, FFNWeights(up=w.up, gate=w.up, down=w.down), "relu2", SparseSettings(mode, 0.0))


@pytest.mark.parametrize("dtype,tol,yarn", [("f32", 0.01, False), ("q8_0", 0.12, False), ("f32", 0.01, True)],
                         ids=["f32", "q8_0", "f32-yarn"])
def test_logits_match_llama_cpp(synthetic_model, tmp_path, dtype, tol, yarn):
    """llama.cpp's arcee graph on the same file; measured 0.0007 (f32), 0.045 (q8_0), 0.0009 (YaRN)."""
    path = (write_synthetic_model(tmp_path / "arcee-yarn.gguf", "arcee", **YARN) if yarn
            else synthetic_model("arcee", dtype))
    if yarn:
        c = read_config(open_gguf(path))
        assert c.rope_factors and c.rope_mscale != 1.0  # YaRN is on (and rope_freqs.weight multiplies in)
    assert_matches_llama_cpp(path, TOKENS, tol, same_top1=dtype == "f32")


def test_plain_relu_is_far_off(synthetic_model, monkeypatch):
    """The mutant FFN relu(u) (the square left out) misses llama.cpp by far more than the tolerance."""
    path = synthetic_model("arcee", "f32")
    ref = llama_cpp_logits(path, TOKENS)
    combine = FFN._combine
    monkeypatch.setattr(FFN, "_combine", lambda self, a, u: a if self.variant == "relu2" else combine(self, a, u))
    batch, _, _ = all_logits(path)
    assert np.abs(batch - ref).max() > 1.0 * ref.std()  # measured 2.05 (right: 0.0007)


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_exact_equals_off_bit_for_bit(synthetic_model, dtype):
    """`exact` computes the FFN only for neurons with relu(u) != 0, and gives `off`'s logits bit for bit (batch
    and one token at a time), with the same per-layer counts; the active share is strictly between 0 and 1."""
    path = synthetic_model("arcee", dtype)
    off, off_steps, off_counts = all_logits(path, "off")
    exact, exact_steps, exact_counts = all_logits(path, "exact")
    assert np.array_equal(off.view(np.uint32), exact.view(np.uint32))
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(off_steps, exact_steps))
    for a, b in zip(off_counts, exact_counts):
        np.testing.assert_array_equal(a, b)
    tokens, active, nonzero = exact_counts
    assert (tokens == 2 * len(TOKENS)).all() and np.array_equal(active, nonzero)
    frac = active.sum() / (tokens.sum() * 128)
    assert 0.2 < frac < 0.8


def test_cli_reports_active_fraction(synthetic_model):
    """`powerinfer run -v --sparse exact` prints the mode and the active share per token; --json carries it."""
    from powerinfer_cli.main import app

    path = str(synthetic_model("arcee", "f32"))
    runner = CliRunner()
    r = runner.invoke(app, ["run", "-m", path, "once upon a time", "-n", "4", "-v", "--sparse", "exact"])
    assert r.exit_code == 0, r.output
    text = r.output + (r.stderr if r.stderr_bytes is not None else "")
    assert "sparse mode: exact" in text and "non-zero neurons per token:" in text
    r = runner.invoke(app, ["run", "-m", path, "once upon a time", "-n", "4", "--sparse", "exact", "--json"])
    assert r.exit_code == 0, r.output
    sparse = json.loads(r.stdout)["sparse"]
    assert sparse["mode"] == "exact" and 0.2 < sparse["active_fraction"] < 0.8


@pytest.mark.parametrize("mode,match", [("predictor", "PWRI"), ("threshold", "SwiGLU/GeGLU")])
def test_unsupported_sparse_modes(synthetic_model, mode, match):
    """No predictors in a dense arcee file; threshold mode is for SwiGLU/GeGLU FFNs."""
    with pytest.raises(UnsupportedError, match=match):
        load(synthetic_model("arcee", "f32"), threads=1, sparse=mode)
