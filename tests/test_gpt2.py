"""GPT-2 (arch "gpt2", models/ln_decoder.py): learned absolute positions (no RoPE), a sequential pre-LayerNorm
block, a fused attn_qkv with its bias, biases on every projection, a GELU FFN, a head tied to token_embd. Tiny
synthetic files (synth/ln_decoder.py) against llama.cpp on the same file.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits; test_mistakes_are_visible,
printed with -s): the right model 0.0016; positions left out 5.83, the qkv bias dropped 0.81,
the FFN biases dropped 0.68, a parallel block 2.77, NeoX RoPE over whole heads added 2.47.
Agreement (test_logits_match_llama_cpp): tied 0.0016 (F32) / 0.043 (Q8_0), untied 0.0010 / 0.041; one token at a
time gave the batch's logits bit for bit.
"""
from __future__ import annotations

import pytest
from ln_decoder_checks import TOL, Parallel, check_against_llama_cpp, distances, without
from model_checks import info_text, load_model, rewrite_gguf

from powerinfer_py.models import read_config
from powerinfer_py.errors import ContextFullError, ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.models.ln_decoder import LnDecoderModel


class NoPositions(LnDecoderModel):
    """Wrong: the learned positions left out."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.position_embd = None


def test_config_follows_llama_cpp(synthetic_model):
    """No RoPE and no GQA although the file has neither key; the GELU FFN."""
    c = read_config(open_gguf(synthetic_model("gpt2", "f32")))
    assert c.n_rot == 0 and c.n_head_kv == c.n_head == 4 and c.hidden_act == "gelu"


@pytest.mark.parametrize("dtype,shape", [("f32", {}), ("q8_0", {}), ("f32", {"tied": False})],
                         ids=["f32", "q8_0", "untied-f32"])
def test_logits_match_llama_cpp(synthetic_model, dtype, shape):
    check_against_llama_cpp(synthetic_model("gpt2", dtype, **shape), dtype)


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    right, wrong = distances(synthetic_model("gpt2", "f32"), cpu_kernels, {
        "pos": (NoPositions, {}), "qkv_b": (without("bq", "bk", "bv"), {}), "ffn_b": (without("ffn_biases"), {}),
        "par": (Parallel, {}), "rope": (None, {"n_rot": 16, "rope_neox": True})})
    assert right < TOL and all(v > 10 * TOL for v in wrong.values()), wrong


def test_bad_files_and_context(synthetic_model, cpu_kernels, tmp_path):
    """position_embd and the fused qkv bias are required (llama.cpp's loader); a context beyond the learned
    positions is refused by name; `powerinfer info` shows the arch."""
    path = synthetic_model("gpt2", "f32")
    for name in ("position_embd.weight", "blk.1.attn_qkv.bias"):
        with pytest.raises(ModelFileError, match=name):
            load_model(rewrite_gguf(path, tmp_path / "bad.gguf", drop=[name]), cpu_kernels)
    model = load_model(path, cpu_kernels)
    assert model.new_cache().n_ctx == 512
    with pytest.raises(ContextFullError, match="512"):
        model.new_cache(513)
    assert "gpt2" in info_text(path)
