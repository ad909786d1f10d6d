"""StableLM (arch "stablelm": StableLM 2 1.6B / Zephyr, StableLM 3B, StableLM 2 12B; models/ln_decoder.py):
LayerNorm with biases, a SwiGLU FFN without biases, partial NeoX RoPE (a quarter of each head), optional q/k/v
biases (StableLM 2 1.6B); StableLM 2 12B has no ffn_norm (parallel residual: the FFN reads the attention's
normed input) and per-head Q/K LayerNorms with a weight row per head. Tiny synthetic files (synth/ln_decoder.py)
against llama.cpp on the same file.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits; test_mistakes_are_visible,
printed with -s), on the 12B-shaped file (parallel, Q/K norms, biases): the right model 0.0006; q/k/v biases
dropped 0.35, Q/K norms dropped 0.84, full instead of partial RoPE (16 dims instead of 4) 0.87, a sequential
block 1.73; on the sequential file (right 0.0009), a parallel block 1.99.
Agreement (test_logits_match_llama_cpp): sequential 0.0009 (F32) / 0.042 (Q8_0), parallel with Q/K norms
0.0007 / 0.042, without q/k/v biases (3B) checked at F32; one token at a time gave the batch's logits bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest
from ln_decoder_checks import (
    TOL,
    Parallel,
    Sequential,
    check_against_llama_cpp,
    distances,
    without,
)
from model_checks import info_text, load_model, rewrite_gguf

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.types import GGMLType, Tensor

TWELVE_B = {"parallel": True, "qk_norm": True}


def test_config_follows_llama_cpp(synthetic_model):
    c = read_config(open_gguf(synthetic_model("stablelm", "f32")))
    assert c.rope_neox and c.n_rot == 4 and c.head_dim == 16 and c.hidden_act == "silu" and c.n_head_kv == 2


@pytest.mark.parametrize("dtype,shape", [("f32", {}), ("q8_0", {}), ("f32", TWELVE_B), ("q8_0", TWELVE_B),
                                         ("f32", {"qkv_bias": False})],
                         ids=["f32", "q8_0", "12b-f32", "12b-q8_0", "3b-f32"])
def test_logits_match_llama_cpp(synthetic_model, dtype, shape):
    check_against_llama_cpp(synthetic_model("stablelm", dtype, **shape), dtype)


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    right, wrong = distances(synthetic_model("stablelm", "f32", **TWELVE_B), cpu_kernels, {
        "qkv_b": (without("bq", "bk", "bv"), {}), "qk_norm": (without("q_norm", "k_norm"), {}),
        "full_rope": (None, {"n_rot": 16}), "seq": (Sequential, {})})
    right2, wrong2 = distances(synthetic_model("stablelm", "f32"), cpu_kernels, {"par": (Parallel, {})})
    wrong.update(wrong2)
    assert max(right, right2) < TOL and all(v > 10 * TOL for v in wrong.values()), wrong


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    """A Q norm of the wrong shape or a missing ffn_gate is a ModelFileError naming the tensor; `powerinfer info`
    shows the arch."""
    path = synthetic_model("stablelm", "f32", **TWELVE_B)
    with pytest.raises(ModelFileError, match="blk.0.ffn_gate.weight"):
        load_model(rewrite_gguf(path, tmp_path / "nogate.gguf", drop=["blk.0.ffn_gate.weight"]), cpu_kernels)
    f = open_gguf(path)
    qn = f.tensors["blk.1.attn_q_norm.weight"]
    flat = Tensor(qn.name, GGMLType.F32, (qn.shape[0] * qn.shape[1],), np.asarray(qn.data).reshape(-1))
    bad = rewrite_gguf(path, tmp_path / "flat.gguf", drop=[qn.name], extra=[flat])
    with pytest.raises(ModelFileError, match="blk.1.attn_q_norm.weight"):
        load_model(bad, cpu_kernels)
    assert "stablelm" in info_text(path)
