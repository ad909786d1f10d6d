"""Swiss AI Apertus (arch "apertus"): the llama block with NeoX RoPE, per-head Q/K norms before RoPE and an
ungated xIELU FFN with learned per-layer parameters. The activation against an independent float64 formula,
tiny synthetic files against llama.cpp, the one-call decode step against the Python path, the sparse modes it
refuses, and bad files.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits, f32 file with
rope_freqs.weight and attn_output.bias; measured by test_mistakes_are_visible): the right model 0.0006 (plain
file 0.0007; Q8_0 0.047); every layer with layer 0's xIELU parameters 0.64; the softplus left out (raw alpha_n,
alpha_p used as the coefficients) 3.6; Q/K norms left out 0.40; rope_freqs.weight ignored 0.21. Tolerances: 0.01
(f32) and 0.25 (Q8_0), as tests/test_exaone4.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_fused_decode_equals_python, assert_matches_llama_cpp, info_text, load_model,
                          rel_err, rewrite_gguf)

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.models import apertus, read_config
from powerinfer_py.models.apertus import ApertusModel, xielu
from powerinfer_py.synth.llama_variants import default_xielu

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]
TOL, QUANT_TOL = 0.01, 0.25
FULL = dict(rope_freqs=tuple(round(float(v), 2) for v in np.linspace(1.0, 3.0, 16)), out_bias=True, qk_norm_bias=True)


def all_logits(model) -> np.ndarray:
    return model.forward(np.array(TOKENS, np.int32), model.new_cache(32), all_logits=True)


def xielu_f64(u, alpha_n, alpha_p, beta, eps):
    """The xIELU of the Apertus paper in float64, written independently of models/apertus.py."""
    u = np.asarray(u, np.float64)
    a_p, a_n = np.logaddexp(0, alpha_p), beta + np.logaddexp(0, alpha_n)
    return np.where(u > 0, a_p * u * u + beta * u, a_n * np.expm1(np.minimum(u, eps)) - a_n * u + beta * u)


@pytest.mark.parametrize("params", [(0.2, -0.3, 0.5, -1e-6), (1.4, -1.1, 0.3, -1e-6), (25.0, 21.0, -0.2, -0.5)])
def test_xielu_matches_formula(params):
    """Both branches, the eps clamp and softplus' large-input branch (z > 20), against float64."""
    u = np.concatenate([np.linspace(-12, 6, 2001), [0.0, -0.25, -1e-7]]).astype(np.float32)
    want = xielu_f64(u, *params)
    np.testing.assert_allclose(xielu(u, *params), want, rtol=2e-6, atol=2e-6 * np.abs(want).max())


def test_config(synthetic_model):
    """NeoX RoPE, untied head, one (alpha_n, alpha_p, beta, eps) per layer from the unprefixed xielu.* keys
    (arrays, or one number for every layer); dense by default."""
    path = synthetic_model("apertus", "f32")
    c = read_config(open_gguf(path))
    assert c.arch == "apertus" and c.rope_neox and not c.tied_output and c.n_rot == c.head_dim == 32
    np.testing.assert_allclose(np.array(c.xielu), np.array(default_xielu(2)), rtol=1e-6)
    c = read_config(open_gguf(synthetic_model("apertus", "f32", xielu=(0.1, 0.2, 0.3, -1e-6))))
    np.testing.assert_allclose(np.array(c.xielu), [[0.1, 0.2, 0.3, -1e-6]] * 2, rtol=1e-6)
    with load(path, threads=1) as llm:
        assert llm.sparse.mode == "off" and llm.model.sparsity is None


@pytest.mark.parametrize("dtype,kw", [("f32", {}), ("q8_0", {}), ("f32", FULL)], ids=["f32", "q8_0", "full"])
def test_logits_match_llama_cpp(synthetic_model, dtype, kw):
    """Batch and one token at a time against llama.cpp (measured 0.0007, 0.047, 0.0006 of the spread); "full" has
    rope_freqs.weight, attn_output.bias and the Q/K norm biases that llama.cpp loads but does not use."""
    assert_matches_llama_cpp(synthetic_model("apertus", dtype, **kw), TOKENS,
                             TOL if dtype == "f32" else QUANT_TOL, same_top1=dtype == "f32")


def test_fused_decode_equals_python_path(synthetic_model, cpu_kernels):
    assert_fused_decode_equals_python(load_model(synthetic_model("apertus", "f32", **FULL), cpu_kernels),
                                      np.array(TOKENS, np.int32))


def test_mistakes_are_visible(synthetic_model, cpu_kernels, monkeypatch):
    path = synthetic_model("apertus", "f32", **FULL)
    theirs = llama_cpp_logits(path, TOKENS)
    right = load_model(path, cpu_kernels)
    assert rel_err(all_logits(right), theirs) < TOL
    c = right.config
    one_set = rel_err(all_logits(load_model(path, cpu_kernels, xielu=(c.xielu[0],) * c.n_layer)), theirs)
    no_norms = load_model(path, cpu_kernels)
    no_norms.QK_NORMS, no_norms.fused_attention = False, False
    no_norms = rel_err(all_logits(no_norms), theirs)
    no_freqs = load_model(path, cpu_kernels)
    no_freqs.rope_freqs, no_freqs.fused_attention = None, False
    no_freqs = rel_err(all_logits(no_freqs), theirs)
    monkeypatch.setattr(apertus, "softplus_f32", lambda z: np.float32(z))
    no_softplus = rel_err(all_logits(load_model(path, cpu_kernels)), theirs)
    assert min(one_set, no_norms, no_freqs, no_softplus) > 10 * TOL


@pytest.mark.parametrize("mode,match", [("exact", "ReLU-family"), ("threshold", "SwiGLU/GeGLU"),
                                        ("predictor", "PWRI")])
def test_sparse_modes_are_refused(synthetic_model, mode, match):
    """xIELU is non-zero for negative inputs and the FFN has no gate: no sparse mode runs it."""
    with pytest.raises(UnsupportedError, match=match):
        load(synthetic_model("apertus", "f32"), threads=1, sparse=mode)


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    """A missing or short xIELU key and a missing output head are named; `info` shows the xIELU parameters."""
    path = synthetic_model("apertus", "f32")
    for edit, match in (({"xielu.beta": None}, "xielu.beta"), ({"xielu.eps": [-1e-6] * 3}, "xielu.eps")):
        bad = rewrite_gguf(path, tmp_path / "bad.gguf", edit=edit)
        with pytest.raises(ModelFileError, match=match):
            read_config(open_gguf(bad))
    bad = rewrite_gguf(path, tmp_path / "nohead.gguf", drop=["output.weight"])
    with pytest.raises(ModelFileError, match="output.weight"):
        load_model(bad, cpu_kernels)
    text = info_text(path)
    assert "apertus" in text and "xIELU FFN" in text and "alpha_n 0.2..0.8" in text
