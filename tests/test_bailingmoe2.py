"""Ling / Ring 2.0 (arch "bailingmoe2"): tiny synthetic files (synth/bailingmoe2.py) against llama.cpp on the same file,
f32 and q8_0; one token at a time against one batch; the one-call decode step against the Python path; `info`;
clear errors for broken files.

The default file is Ling mini 2.0 scaled down: 4 layers that run (layer 0 dense, 1-3 experts) plus one trailing
multi-token-prediction block, 8 experts in 4 groups of 2 (2 groups used), 2 chosen per token by sigmoid score +
selection bias, weights renormalized and scaled by 2.5, a shared expert, NeoX RoPE over half of each head. Seed
12: its router's closest call over the 24 tokens (the gap between the last chosen and the first left-out score,
or between groups) is 0.004; with other seeds some position came within 1e-4 to 1e-3, which the two engines'
rounding can break differently (then that position and the ones attending to it differ by O(1)).
How far off the usual mistakes would be (max |logit difference| / std of llama.cpp's logits, f32 file, 24
tokens; test_mistakes_are_visible, tolerance 0.01): the right model 0.0022; no group limit 4.1; no selection
bias 3.6; weights not scaled by 2.5 2.8; softmax instead of sigmoid 3.5; no shared expert 3.2; no Q/K norms 2.1;
RoPE over whole heads 3.3; RoPE in the normal (2i, 2i+1) layout 3.3. q8_0: 0.086 (the engines' quantized
matmuls differ in rounding; llama.cpp's own q8_0 file, not its f32 one, is the reference).
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import assert_fused_decode_equals_python, assert_matches_llama_cpp, info_text, load_model, rel_err
from model_checks import rewrite_gguf

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.synth.bailingmoe2 import write_ling_trinity

TOKENS = [1] + list(np.random.default_rng(1).integers(3, 512, 23))
TOL, QUANT_TOL = 0.01, 0.25
A = "bailingmoe2"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp(A)
    return {"f32": write_ling_trinity(d / "w.gguf", A, seed=12),
            "q8_0": write_ling_trinity(d / "w8.gguf", A, dtype="q8_0", seed=12),
            # softmax routing without groups, selection bias or MTP block, weights not renormalized
            "plain": write_ling_trinity(d / "p.gguf", A, seed=3, gating="softmax", groups=(), probs_bias=False,
                                        weights_norm=False, nextn=0, n_layer=3)}


def test_config(files):
    with load(files["f32"], threads=1) as llm:
        c = llm.config
        assert (c.arch, c.n_layer, c.n_nextn, c.moe_layers) == (A, 4, 1, (False, True, True, True))
        assert (c.n_expert, c.n_expert_used, c.n_expert_groups, c.n_expert_group_used) == (8, 2, 4, 2)
        assert (c.expert_gating, c.expert_weights_scale, c.expert_weights_norm) == ("sigmoid", 2.5, True)
        assert (c.n_ff_exp, c.n_ff_shexp, c.n_rot, c.head_dim, c.rope_neox) == (32, 32, 8, 16, True)
    with load(files["plain"], threads=1) as llm:
        c = llm.config
        assert (c.expert_gating, c.n_expert_groups, c.expert_weights_norm, c.n_nextn) == ("softmax", 0, False, 0)
        assert all(f.select_bias is None for f in llm.model.ffns[1:])


@pytest.mark.parametrize("name,tol", [("f32", TOL), ("q8_0", QUANT_TOL), ("plain", TOL)])
def test_matches_llama_cpp(files, name, tol):
    assert_matches_llama_cpp(files[name], TOKENS, tol, same_top1=name != "q8_0")


def test_fused_decode_equals_python(files, cpu_kernels):
    assert_fused_decode_equals_python(load_model(files["f32"], cpu_kernels), np.array(TOKENS[:10], np.int32))


def test_mistakes_are_visible(files, cpu_kernels):
    path = files["f32"]
    ref = llama_cpp_logits(path, TOKENS)

    def err(mutate=None, **config_changes):
        m = load_model(path, cpu_kernels, **config_changes)
        m.fused_attention = False
        if mutate:
            mutate(m)
        return rel_err(m.forward(np.array(TOKENS, np.int32), m.new_cache(32), all_logits=True), ref)

    def moe(**attrs):
        def mutate(m):
            for f in m.ffns[1:]:
                for name, value in attrs.items():
                    setattr(f, name, value)
        return mutate

    def no_qk_norms(m):
        m.QK_NORMS = False

    right = err()
    found = {"no groups": err(moe(n_groups=0)), "no selection bias": err(moe(select_bias=None)),
             "no weights scale": err(moe(weights_scale=1.0)), "softmax": err(moe(gating="softmax")),
             "no shared expert": err(moe(shared=None)), "no q/k norms": err(no_qk_norms),
             "whole-head rope": err(n_rot=16), "normal rope": err(rope_neox=False)}
    print(f"right {right:.4f}", {k: round(v, 3) for k, v in found.items()})
    assert right < TOL and min(found.values()) > 10 * TOL


def test_info(files):
    text = info_text(files["f32"])
    assert f"architecture         {A}" in text
    assert "experts              2 of 8 per token" in text and "plus a shared expert" in text
    assert "MTP blocks           1 next-token-prediction block(s) in the file, not run" in text


@pytest.mark.parametrize("edit,drop,error,match", [
    ({f"{A}.expert_gating_func": None}, (), ModelFileError, "expert_gating_func"),
    ({f"{A}.expert_gating_func": 3}, (), UnsupportedError, "expert_gating_func"),
    ({f"{A}.expert_shared_count": 0}, (), ModelFileError, "expert_shared_count"),
    ({f"{A}.expert_group_used_count": 4}, (), ModelFileError, "groups"),
    ({f"{A}.attention.key_length": 8}, (), UnsupportedError, "embedding_length"),
    ({}, ("blk.1.attn_qkv.weight",), ModelFileError, "attn_qkv"),
    ({}, ("blk.2.ffn_up_shexp.weight",), ModelFileError, "ffn_up_shexp"),
])
def test_bad_files(files, tmp_path, edit, drop, error, match):
    bad = rewrite_gguf(files["f32"], tmp_path / "bad.gguf", edit, drop)
    with pytest.raises(error, match=match):
        load(bad, threads=1)
