"""OLMoE (GGUF arch "olmoe"): logits against llama.cpp on synthetic files, one token at a time against a batch, the
one-call decode step against the Python path, and the parts that matter.

File (synth/minicpm.py, seed 2): 2 layers, n_embd 64, 4 heads (4 KV: llama.cpp's k norm is n_embd wide), 4
experts of 128 (2 used), untied. Measured (max |ours - llama.cpp| over the spread of llama.cpp's logits; the f32
test passes below 0.01, Q8_0 below 0.12): f32 0.0008, Q8_0 0.049 (seeds 0 and 1: 0.0009 / 0.0010 and 0.054 /
0.037). Mutations (same measure, f32, seed 2): normal RoPE layout instead of NeoX 1.25, renormalizing the chosen
experts' weights 0.43, no Q/K norms 0.44, Q/K norm weights replaced by ones 0.34. test_each_part_matters
re-checks them with a bar of 0.2.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (
    assert_fused_decode_equals_python,
    assert_matches_llama_cpp,
    info_text,
    llama_cpp_quantized,
    load_model,
)

from powerinfer_py.models.base import Model
from powerinfer_py.layers.moe import MoEFFN

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]
KW = dict(n_head_kv=4, seed=2)


@pytest.mark.parametrize("dtype,tol", [("f32", 0.01), ("q8_0", 0.12)])
def test_logits_match_llama_cpp(synthetic_model, dtype, tol):
    assert_matches_llama_cpp(synthetic_model("olmoe", dtype, **KW), TOKENS, tol, same_top1=dtype == "f32")


def test_config(synthetic_model, cpu_kernels):
    m = load_model(synthetic_model("olmoe", "f32", **KW), cpu_kernels)
    c = m.config
    assert c.rope_neox and not c.tied_output and (c.n_expert, c.n_expert_used, c.n_ff_exp) == (4, 2, 128)
    assert not c.expert_weights_norm and c.expert_weights_scale == 1.0 and c.n_ff_shexp == 0
    assert all(isinstance(f, MoEFFN) for f in m.ffns) and m.layers[0].q_norm.shape == (64,)


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_fused_decode_equals_python(synthetic_model, cpu_kernels, dtype):
    """The one-call attention step (whole-width Q/K norms) gives the Python path's bits."""
    assert_fused_decode_equals_python(load_model(synthetic_model("olmoe", dtype, **KW), cpu_kernels),
                                      np.array(TOKENS, np.int32))


def test_each_part_matters(synthetic_model, cpu_kernels):
    path = synthetic_model("olmoe", "f32", **KW)
    ref = llama_cpp_logits(path, TOKENS)
    models = [load_model(path, cpu_kernels, rope_neox=False), load_model(path, cpu_kernels, expert_weights_norm=True)]
    unit = load_model(path, cpu_kernels)
    for L in unit.layers:
        L.q_norm, L.k_norm = np.ones_like(L.q_norm), np.ones_like(L.k_norm)
    bare = load_model(path, cpu_kernels)
    bare._qkv = lambda L, h, n: Model._qkv(bare, L, h, n)  # the llama projections: no Q/K norms
    for m in models + [unit, bare]:
        m.fused_attention = False
        out = m.forward(np.array(TOKENS, np.int32), m.new_cache(32), all_logits=True)
        assert np.abs(out - ref).max() > 0.2 * ref.std()


def test_info(synthetic_model):
    text = info_text(synthetic_model("olmoe", "f32", **KW), width=200)
    assert "olmoe" in text and "2 of 4 per token, 128 wide" in text and "renormalized" not in text


def test_q4_k_m_file_from_llama_cpp_quantizer(synthetic_model, tmp_path):
    """llama.cpp's own Q4_K_M of a olmoe file (Q4_K / Q6_K matrices, as downloads are): loaded with no
    conversion, it matches llama.cpp (measured 0.066 of the spread); steps equal the batch."""
    import llama_cpp

    from powerinfer_py.gguf import open_gguf

    src = synthetic_model("olmoe", "f32", n_embd=256, n_ff=256, **KW)
    path = llama_cpp_quantized(src, tmp_path / "q4_k_m.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    assert {t.type.name for t in open_gguf(path).tensors.values()} >= {"Q4_K", "Q6_K"}
    assert_matches_llama_cpp(path, TOKENS, 0.12, same_top1=False)
