"""Phi-2 (arch "phi2", models/ln_decoder.py): LayerNorm with biases, attention and a GELU MLP in parallel on the
same normed input, partial NeoX RoPE, biases on every projection and on the output head. Tiny synthetic files
(synth/ln_decoder.py) against llama.cpp on the same file, in both forms real files have (separate attn_q/k/v
with biases, and the fused attn_qkv of files converted from the original checkpoint).

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits; test_mistakes_are_visible,
printed with -s): the right model 0.0009; attn_output bias dropped 0.41, output bias dropped 1.01, the FFN
biases dropped 0.53, full instead of partial RoPE (16 of 16 dims instead of 6) 1.10, normal instead of NeoX
RoPE 0.64, a sequential block (FFN on attn_norm of the updated residual) 0.96.
Agreement (test_logits_match_llama_cpp): 0.0009 (F32) / 0.029 (Q8_0), separate and fused qkv alike; one token
at a time gave the batch's logits bit for bit.
"""
from __future__ import annotations

import pytest
from ln_decoder_checks import (
    TOL,
    Sequential,
    check_against_llama_cpp,
    distances,
    without,
)
from model_checks import info_text, load_model, rewrite_gguf

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf

PHI2 = {"n_head_kv": 4}  # no GQA, as Phi-2


def test_config_follows_llama_cpp(synthetic_model):
    c = read_config(open_gguf(synthetic_model("phi2", "f32", **PHI2)))
    assert c.rope_neox and c.n_rot == 6 and c.head_dim == 16 and c.hidden_act == "gelu"
    assert c.norm_eps == pytest.approx(1e-5)


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
def test_logits_match_llama_cpp(synthetic_model, dtype, fused):
    check_against_llama_cpp(synthetic_model("phi2", dtype, fused_qkv=fused, **PHI2), dtype)


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    path = synthetic_model("phi2", "f32", **PHI2)
    right, wrong = distances(path, cpu_kernels, {
        "bo": (without("bo"), {}), "output_b": (without("output_b"), {}), "ffn_b": (without("ffn_biases"), {}),
        "full_rope": (None, {"n_rot": 16}), "normal_rope": (None, {"rope_neox": False}), "seq": (Sequential, {})})
    assert right < TOL and all(v > 10 * TOL for v in wrong.values()), wrong


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    """A layer without any q/k/v weights, or without its output bias, is a ModelFileError naming the tensor;
    `powerinfer info` shows the arch."""
    path = synthetic_model("phi2", "f32", fused_qkv=True, **PHI2)
    with pytest.raises(ModelFileError, match="blk.1.attn_qkv.weight"):
        load_model(rewrite_gguf(path, tmp_path / "noqkv.gguf", drop=["blk.1.attn_qkv.weight"]), cpu_kernels)
    with pytest.raises(ModelFileError, match="output.bias"):
        load_model(rewrite_gguf(path, tmp_path / "nob.gguf", drop=["output.bias"]), cpu_kernels)
    text = info_text(path)
    assert "phi2" in text and "RoPE dims            6" in text
