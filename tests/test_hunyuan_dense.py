"""Tencent Hunyuan dense (arch "hunyuan-dense"): the llama block with NeoX RoPE and per-head Q/K RMSNorms applied
AFTER RoPE, and the NTK alpha RoPE base. Tiny synthetic files against llama.cpp on the same file, one batch against
one token at a time, the one-call C decode step against the Python path, config and bad files.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits, f32 files; measured by
test_mistakes_are_visible, on the file with the alpha key): the right model 0.0015 (without the key 0.0019; Q8_0
0.068); Q/K norms before RoPE (qwen3's order) 0.18; the rope.scaling.alpha key ignored 1.02; normal instead of NeoX
RoPE 2.13. Tolerances: 0.01 (f32) and 0.25 (Q8_0), as tests/test_exaone4.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_fused_decode_equals_python, assert_matches_llama_cpp, info_text, load_model,
                          rel_err, rewrite_gguf)

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.models.base import Model
from powerinfer_py.models.hunyuan_dense import HunyuanDenseModel

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322]
TOL, QUANT_TOL = 0.01, 0.25
ALPHA = 50.0  # rope.scaling.alpha (the converter usually bakes it into freq_base; llama.cpp applies the key too)


def all_logits(model) -> np.ndarray:
    return model.forward(np.array(TOKENS, np.int32), model.new_cache(32), all_logits=True)




class NormsBeforeRope(HunyuanDenseModel):
    """Wrong: q and k normed before RoPE (qwen3's order: base.Model's forward with its QK_NORMS path)."""

    QK_NORMS = True
    forward = Model.forward


def test_config(synthetic_model):
    """NeoX RoPE over the whole 32-dim head (wider than n_embd / n_head), tied head, dense SwiGLU; the alpha key
    scales the base by alpha^(d / (d - 2)) as llama.cpp's loader does."""
    c = read_config(open_gguf(synthetic_model("hunyuan-dense", "f32")))
    assert c.arch == "hunyuan-dense" and c.rope_neox and c.head_dim == c.n_rot == 32 and c.tied_output
    assert c.rope_freq_base == 10000.0 and c.n_expert == 0
    c = read_config(open_gguf(synthetic_model("hunyuan-dense", "f32", rope_alpha=ALPHA)))
    assert c.rope_freq_base == pytest.approx(10000.0 * ALPHA ** (32 / 30), rel=1e-6)


@pytest.mark.parametrize("dtype,kw", [("f32", {}), ("q8_0", {}), ("f32", dict(rope_alpha=ALPHA)),
                                     ("f32", dict(rope_alpha=ALPHA, qkv_bias=True))],
                         ids=["f32", "q8_0", "alpha", "alpha-biases"])
def test_logits_match_llama_cpp(synthetic_model, dtype, kw):
    """Batch and one token at a time against llama.cpp (measured 0.0019, 0.068, 0.0015, 0.0007 of the spread); the
    optional q/k/v biases are added as llama.cpp's loader takes them."""
    assert_matches_llama_cpp(synthetic_model("hunyuan-dense", dtype, **kw), TOKENS,
                             TOL if dtype == "f32" else QUANT_TOL, same_top1=dtype == "f32")


@pytest.mark.parametrize("kw", [{}, dict(rope_alpha=ALPHA, qkv_bias=True)], ids=["plain", "alpha-biases"])
def test_fused_decode_equals_python_path(synthetic_model, cpu_kernels, kw):
    """The one-call C step with its norms after RoPE (qk_norm_post_rope) gives the Python path's bits."""
    assert_fused_decode_equals_python(load_model(synthetic_model("hunyuan-dense", "f32", **kw), cpu_kernels),
                                      np.array(TOKENS, np.int32))


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    path = synthetic_model("hunyuan-dense", "f32", rope_alpha=ALPHA)
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels)), theirs) < TOL
    before = rel_err(all_logits(load_model(path, cpu_kernels, NormsBeforeRope)), theirs)
    base = read_config(open_gguf(synthetic_model("hunyuan-dense", "f32"))).rope_freq_base
    no_alpha = rel_err(all_logits(load_model(path, cpu_kernels, rope_freq_base=base)), theirs)
    normal = rel_err(all_logits(load_model(path, cpu_kernels, rope_neox=False)), theirs)
    assert min(before, no_alpha, normal) > 10 * TOL


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    """A missing Q/K norm, M-RoPE sections (the VL variant) and a one-expert count (dense, as llama.cpp reads it)."""
    path = synthetic_model("hunyuan-dense", "f32")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", drop=["blk.1.attn_q_norm.weight"])
    with pytest.raises(ModelFileError, match="blk.1.attn_q_norm.weight"):
        load_model(bad, cpu_kernels)
    mrope = rewrite_gguf(path, tmp_path / "mrope.gguf", edit={"hunyuan-dense.rope.dimension_sections": [4, 4, 4, 4]})
    with pytest.raises(UnsupportedError, match="M-RoPE"):
        read_config(open_gguf(mrope))
    one = rewrite_gguf(path, tmp_path / "one.gguf", edit={"hunyuan-dense.expert_count": 1})
    assert read_config(open_gguf(one)).n_expert == 0
    assert "hunyuan-dense" in info_text(path)
