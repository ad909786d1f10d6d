"""LG EXAONE 3.0 / 3.5 (arch "exaone"): the llama block with NeoX RoPE and optional rope_freqs.weight. Tiny
synthetic files against llama.cpp (untied as 7.8B / 32B, tied as 2.4B, with LLaMA-3 RoPE factors, with q/k/v
biases, Q8_0), the one-call decode step against the Python path, threshold mode after calibration, bad files.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits, f32 file; measured by
the files these tests write): the right model 0.0017 (tied 0.0017, RoPE
factors 0.0019, q/k/v biases 0.0014; Q8_0 0.08); on the RoPE-factors file: normal instead of NeoX RoPE 2.64,
rope_freqs.weight ignored 0.19, the FFN norm's weight left out 0.50; on the biased file: the q/k/v biases
ignored 4.24. Tolerances: 0.01 (f32) and 0.25 (Q8_0), as tests/test_exaone4.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_fused_decode_equals_python, assert_matches_llama_cpp,
                          assert_threshold_after_calibration, info_text, load_model,
                          rel_err, rewrite_gguf, with_qkv_biases)

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]
TOL, QUANT_TOL = 0.01, 0.25
FREQS = (1.0, 1.0, 2.0, 4.0, 6.0, 8.0, 8.0, 8.0)  # LLaMA-3 style divisors for head_dim 16


def all_logits(model) -> np.ndarray:
    return model.forward(np.array(TOKENS, np.int32), model.new_cache(32), all_logits=True)


def test_config(synthetic_model):
    c = read_config(open_gguf(synthetic_model("exaone", "f32")))
    assert c.arch == "exaone" and c.rope_neox and not c.tied_output and c.n_rot == c.head_dim == 16
    assert read_config(open_gguf(synthetic_model("exaone", "f32", tied=True))).tied_output


@pytest.mark.parametrize("dtype,kw", [("f32", {}), ("f32", dict(tied=True)), ("f32", dict(rope_freqs=FREQS)),
                                      ("q8_0", {})], ids=["f32", "tied", "rope-freqs", "q8_0"])
def test_logits_match_llama_cpp(synthetic_model, dtype, kw):
    """Batch and one token at a time against llama.cpp (measured 0.0017, 0.0017, 0.0019, 0.08 of the spread)."""
    assert_matches_llama_cpp(synthetic_model("exaone", dtype, **kw), TOKENS,
                             TOL if dtype == "f32" else QUANT_TOL, same_top1=dtype == "f32")


def test_qkv_biases_match_llama_cpp(synthetic_model, tmp_path):
    assert_matches_llama_cpp(with_qkv_biases(synthetic_model("exaone", "f32"), tmp_path / "b.gguf"), TOKENS, TOL,
                             same_top1=True)


def test_fused_decode_equals_python_path(synthetic_model, cpu_kernels):
    assert_fused_decode_equals_python(load_model(synthetic_model("exaone", "f32", rope_freqs=FREQS), cpu_kernels),
                                      np.array(TOKENS, np.int32))


def test_mistakes_are_visible(synthetic_model, cpu_kernels, tmp_path):
    path = synthetic_model("exaone", "f32", rope_freqs=FREQS)
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels)), theirs) < TOL
    normal = rel_err(all_logits(load_model(path, cpu_kernels, rope_neox=False)), theirs)
    no_freqs = load_model(path, cpu_kernels)
    no_freqs.rope_freqs = None
    no_freqs = rel_err(all_logits(no_freqs), theirs)
    plain_norm = load_model(path, cpu_kernels)
    for L in plain_norm.layers:
        L.ffn_norm = np.ones_like(L.ffn_norm)
    plain_norm = rel_err(all_logits(plain_norm), theirs)
    biased = with_qkv_biases(synthetic_model("exaone", "f32"), tmp_path / "b.gguf")
    no_bias = load_model(biased, cpu_kernels)
    no_bias.QKV_BIASES, no_bias.fused_attention = False, False
    no_bias = rel_err(all_logits(no_bias), llama_cpp_logits(biased, TOKENS))
    assert min(normal, no_freqs, plain_norm, no_bias) > 10 * TOL, (normal, no_freqs, plain_norm, no_bias)


def test_threshold_mode_runs_after_calibration(synthetic_model, tmp_path):
    """A SwiGLU FFN: `powerinfer calibrate` then threshold mode; sparsity 0 is the dense result."""
    assert_threshold_after_calibration(synthetic_model("exaone", "f32"), tmp_path / "cal.gguf", TOKENS)


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    path = synthetic_model("exaone", "f32")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", drop=["blk.1.ffn_norm.weight"])
    with pytest.raises(ModelFileError, match="blk.1.ffn_norm.weight"):
        load_model(bad, cpu_kernels)
    half = rewrite_gguf(path, tmp_path / "half.gguf", edit={"exaone.rope.dimension_count": 8})
    with pytest.raises(ModelFileError, match="whole heads"):
        load_model(half, cpu_kernels)
    assert "exaone" in info_text(path)
