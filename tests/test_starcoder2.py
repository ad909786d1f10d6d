"""StarCoder2 (arch "starcoder2": StarCoder2 3B / 7B / 15B; models/ln_decoder.py): a sequential pre-LayerNorm
block with biases everywhere (q/k/v, attn_output, ffn_norm, the GELU FFN's up and down), grouped-query
attention, NeoX RoPE over whole heads, and an output head tied to token_embd when the file has no output.weight.
Tiny synthetic files (synth/ln_decoder.py) against llama.cpp on the same file.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits; test_mistakes_are_visible,
printed with -s): the right model 0.0011; attn_output bias dropped 0.52, q/k/v biases dropped 0.55, the FFN
biases dropped 0.45, a parallel block (no ffn_norm, the FFN on attn_norm's output) 1.62, normal instead of NeoX
RoPE 0.86.
Agreement (test_logits_match_llama_cpp): 0.0011 (F32) / 0.052 (Q8_0), tied head 0.0015 / 0.042; one token at a
time gave the batch's logits bit for bit.
"""
from __future__ import annotations

import pytest
from ln_decoder_checks import TOL, Parallel, check_against_llama_cpp, distances, without
from model_checks import info_text, load_model, rewrite_gguf

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf


def test_config_follows_llama_cpp(synthetic_model):
    c = read_config(open_gguf(synthetic_model("starcoder2", "f32")))
    assert c.rope_neox and c.n_rot == c.head_dim == 16 and c.hidden_act == "gelu" and c.n_head_kv == 2


@pytest.mark.parametrize("dtype,shape", [("f32", {}), ("q8_0", {}), ("f32", {"tied": True}),
                                         ("q8_0", {"tied": True})], ids=["f32", "q8_0", "tied-f32", "tied-q8_0"])
def test_logits_match_llama_cpp(synthetic_model, dtype, shape):
    check_against_llama_cpp(synthetic_model("starcoder2", dtype, **shape), dtype)


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    right, wrong = distances(synthetic_model("starcoder2", "f32"), cpu_kernels, {
        "bo": (without("bo"), {}), "qkv_b": (without("bq", "bk", "bv"), {}), "ffn_b": (without("ffn_biases"), {}),
        "par": (Parallel, {}), "normal_rope": (None, {"rope_neox": False})})
    assert right < TOL and all(v > 10 * TOL for v in wrong.values()), wrong


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    """starcoder2's ffn_norm and attn_output bias are required (llama.cpp's loader); `powerinfer info` shows the
    arch."""
    path = synthetic_model("starcoder2", "f32")
    for name in ("blk.1.ffn_norm.bias", "blk.0.attn_output.bias"):
        with pytest.raises(ModelFileError, match=name):
            load_model(rewrite_gguf(path, tmp_path / "bad.gguf", drop=[name]), cpu_kernels)
    assert "starcoder2" in info_text(path)
