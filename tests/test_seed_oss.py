"""ByteDance Seed-OSS (arch "seed_oss"): the llama block with NeoX RoPE, q/k/v biases and the FFN norm stored as
post_attention_norm. Tiny synthetic files against llama.cpp, the one-call decode step against the Python path,
threshold mode after calibration, and bad files.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits, f32 file; measured by
test_mistakes_are_visible): the right model 0.0007 (without biases 0.0009; Q8_0 0.045); the q/k/v biases left
out 2.05; normal instead of NeoX RoPE 1.04; the FFN norm's weight left out (plain RMSNorm) 0.29. Tolerances:
0.01 (f32) and 0.25 (Q8_0), as tests/test_exaone4.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_fused_decode_equals_python, assert_matches_llama_cpp,
                          assert_threshold_after_calibration, info_text, load_model,
                          rel_err, rewrite_gguf)

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]
TOL, QUANT_TOL = 0.01, 0.25


def all_logits(model) -> np.ndarray:
    return model.forward(np.array(TOKENS, np.int32), model.new_cache(32), all_logits=True)


def test_config(synthetic_model):
    c = read_config(open_gguf(synthetic_model("seed_oss", "f32")))
    assert c.arch == "seed_oss" and c.rope_neox and not c.tied_output and c.n_rot == c.head_dim == 32


@pytest.mark.parametrize("dtype,kw", [("f32", {}), ("q8_0", {}), ("f32", dict(qkv_bias=False))],
                         ids=["f32", "q8_0", "no-bias"])
def test_logits_match_llama_cpp(synthetic_model, dtype, kw):
    """Batch and one token at a time against llama.cpp (measured 0.0007, 0.045, 0.0009 of the spread)."""
    assert_matches_llama_cpp(synthetic_model("seed_oss", dtype, **kw), TOKENS,
                             TOL if dtype == "f32" else QUANT_TOL, same_top1=dtype == "f32")


def test_fused_decode_equals_python_path(synthetic_model, cpu_kernels):
    assert_fused_decode_equals_python(load_model(synthetic_model("seed_oss", "f32"), cpu_kernels),
                                      np.array(TOKENS, np.int32))


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    path = synthetic_model("seed_oss", "f32")
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels)), theirs) < TOL
    no_bias = load_model(path, cpu_kernels)
    no_bias.QKV_BIASES, no_bias.fused_attention = False, False
    no_bias = rel_err(all_logits(no_bias), theirs)
    normal = rel_err(all_logits(load_model(path, cpu_kernels, rope_neox=False)), theirs)
    plain_norm = load_model(path, cpu_kernels)
    for L in plain_norm.layers:
        L.ffn_norm = np.ones_like(L.ffn_norm)
    plain_norm = rel_err(all_logits(plain_norm), theirs)
    assert min(no_bias, normal, plain_norm) > 10 * TOL


def test_threshold_mode_runs_after_calibration(synthetic_model, tmp_path):
    """A SwiGLU FFN: `powerinfer calibrate` then threshold mode; sparsity 0 is the dense result."""
    assert_threshold_after_calibration(synthetic_model("seed_oss", "f32"), tmp_path / "cal.gguf", TOKENS)


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    path = synthetic_model("seed_oss", "f32")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", drop=["blk.0.post_attention_norm.weight"])
    with pytest.raises(ModelFileError, match="blk.0.post_attention_norm.weight"):
        load_model(bad, cpu_kernels)
    assert "seed_oss" in info_text(path)
