"""InternLM2 / InternLM2.5 (arch "internlm2"): the llama block under its own name (normal RoPE on rows the
converter permuted, an untied head that llama.cpp requires, no RoPE factors tensor). Tiny synthetic files against
llama.cpp (F32, Q8_0, q/k/v biases), the one-call decode step against the Python path, bad files.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits, f32 file; measured on
the files these tests write): the right model 0.0009 (q/k/v biases 0.0007; Q8_0 0.052); NeoX instead of normal
RoPE 1.24; the tied head (token_embd.weight) instead of output.weight 21.3; the FFN norm's weight left out 0.39;
the q/k/v biases ignored 2.53. Tolerances: 0.01 (f32) and 0.25 (Q8_0), as tests/test_exaone4.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_fused_decode_equals_python, assert_matches_llama_cpp, info_text, load_model,
                          rel_err, rewrite_gguf, with_qkv_biases)

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]
TOL, QUANT_TOL = 0.01, 0.25


def all_logits(model) -> np.ndarray:
    return model.forward(np.array(TOKENS, np.int32), model.new_cache(32), all_logits=True)


def test_config(synthetic_model):
    c = read_config(open_gguf(synthetic_model("internlm2", "f32")))
    assert c.arch == "internlm2" and not c.rope_neox and not c.tied_output and c.n_rot == c.head_dim == 16


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_logits_match_llama_cpp(synthetic_model, dtype):
    """Batch and one token at a time against llama.cpp (measured 0.0009 and 0.052 of the spread)."""
    assert_matches_llama_cpp(synthetic_model("internlm2", dtype), TOKENS, TOL if dtype == "f32" else QUANT_TOL,
                             same_top1=dtype == "f32")


def test_qkv_biases_match_llama_cpp(synthetic_model, tmp_path):
    assert_matches_llama_cpp(with_qkv_biases(synthetic_model("internlm2", "f32"), tmp_path / "b.gguf"), TOKENS, TOL,
                             same_top1=True)


def test_fused_decode_equals_python_path(synthetic_model, cpu_kernels):
    assert_fused_decode_equals_python(load_model(synthetic_model("internlm2", "f32"), cpu_kernels),
                                      np.array(TOKENS, np.int32))


def test_mistakes_are_visible(synthetic_model, cpu_kernels, tmp_path):
    path = synthetic_model("internlm2", "f32")
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels)), theirs) < TOL
    neox = rel_err(all_logits(load_model(path, cpu_kernels, rope_neox=True)), theirs)
    tied = load_model(path, cpu_kernels)
    tied.output = tied.token_embd
    tied = rel_err(all_logits(tied), theirs)
    plain_norm = load_model(path, cpu_kernels)
    for L in plain_norm.layers:
        L.ffn_norm = np.ones_like(L.ffn_norm)
    plain_norm = rel_err(all_logits(plain_norm), theirs)
    biased = with_qkv_biases(path, tmp_path / "b.gguf")
    no_bias = load_model(biased, cpu_kernels)
    no_bias.QKV_BIASES, no_bias.fused_attention = False, False
    no_bias = rel_err(all_logits(no_bias), llama_cpp_logits(biased, TOKENS))
    assert min(neox, tied, plain_norm, no_bias) > 10 * TOL, (neox, tied, plain_norm, no_bias)


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    """llama.cpp requires output.weight for this arch (no tying), and so do we; a partial rotation is refused."""
    path = synthetic_model("internlm2", "f32")
    untied = rewrite_gguf(path, tmp_path / "untied.gguf", drop=["output.weight"])
    with pytest.raises(ModelFileError, match="output.weight"):
        load_model(untied, cpu_kernels)
    half = rewrite_gguf(path, tmp_path / "half.gguf", edit={"internlm2.rope.dimension_count": 8})
    with pytest.raises(ModelFileError, match="whole heads"):
        load_model(half, cpu_kernels)
    assert "internlm2" in info_text(path)
