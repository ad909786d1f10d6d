"""Llama 4 (arch "llama4"): tiny synthetic files (synth/llama4.py) against llama.cpp on the same file, f32 and q8_0;
one token at a time and a split prefill against one batch; chunked attention against numpy; clear errors.

The default file: 4 layers, dense FFNs on layers 0 and 2 and experts on 1 and 3 (interleave_moe_layer_step 2;
4 experts, 1 used, sigmoid weight on the expert's input, a shared expert), layers 0-2 chunked with RoPE (and
rope_freqs.weight) and the q/k RMS norm, layer 3 NoPE with the attention temperature. llama.cpp fixes the
chunk at 8192 positions and the temperature is 1 below position 8191, so test_long_context_matches_llama_cpp
feeds 8200 tokens to a dense-only file (moe_step 5: no expert layer, so no router near-tie over that many
positions); the chunk logic at small sizes is checked against numpy (test_chunked_attention_*).
How far off the usual mistakes would be (max |logit difference| / std of llama.cpp's logits; measured by
test_mistakes_are_visible, tolerance 0.01), f32 file, 24 tokens: the right model 0.0013; router weight on the
expert's output instead of its input 0.91; softmax instead of sigmoid weights 0.89; no shared expert 2.2; RoPE on
the NoPE layer 3 0.64; no q/k norm 0.95; rope_freqs ignored 1.5; NeoX RoPE layout 1.6. Over 8200 tokens (last 8
positions, dense file; test_long_context_matches_llama_cpp): the right model 0.0018; no chunking 4.7; no
temperature 0.036. q8_0 (seed 1): 0.089 (seed 0 has a router near-tie: 0.28).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from model_checks import (
    assert_matches_llama_cpp,
    assert_steps_and_split_match_prefill,
    info_text,
    rel_err,
    rewrite_gguf,
)

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, PowerInferError, UnsupportedError
from powerinfer_py.kernels import ref
from powerinfer_py.models.llama4 import attn_temperature, chunked_attention
from powerinfer_py.layers.moe import MoEFFN
from powerinfer_py.synth.llama4 import write_llama4_model
from powerinfer_py.gguf.types import GGMLType, Tensor

TOKENS = [1] + list(np.random.default_rng(1).integers(3, 512, 23))
TOL, QUANT_TOL = 0.01, 0.25
A = "llama4"
LONG = 8200  # past llama.cpp's 8192-position chunk and the temperature's first step (position 8191)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp(A)
    return {"f32": write_llama4_model(d / "w.gguf"),
            "q8_0": write_llama4_model(d / "w8.gguf", dtype="q8_0", seed=1),  # seed 0: a router near-tie
            # every layer MoE (Scout's step 1), tied head, no rope_freqs, 2 of 4 experts
            "scout": write_llama4_model(d / "s.gguf", moe_step=1, tied=True, rope_freqs=False, n_expert_used=2,
                                        seed=2)}


def _layout(m, **changes):
    m.config = dataclasses.replace(m.config, llama4=dataclasses.replace(m.config.llama4, **changes))


def test_config(files):
    with load(files["f32"], threads=1) as llm:
        c = llm.config
        assert (c.arch, c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (A, 4, 1, 64, 64)
        assert c.moe_layers == (False, True, False, True) and c.expert_gating == "sigmoid"
        lay = c.llama4
        assert lay.chunked == (True, True, True, False) and lay.rope == (True, True, True, False)
        assert lay.kq_norm and lay.chunk == 8192 and c.sliding_window == 0 and not c.expert_weights_norm


@pytest.mark.parametrize("name,tol", [("f32", TOL), ("q8_0", QUANT_TOL), ("scout", TOL)])
def test_matches_llama_cpp(files, name, tol):
    assert_matches_llama_cpp(files[name], TOKENS, tol, same_top1=name != "q8_0")


def _logits(path, tokens, mutate=None, n_ctx=32):
    with load(path, threads=2, n_ctx=n_ctx) as llm:
        if mutate:
            mutate(llm.model)
        return llm.model.forward(np.array(tokens, np.int32), llm.model.new_cache(n_ctx), all_logits=True)


def test_mistakes_are_visible(files):
    from llama_ref import llama_cpp_logits

    want = llama_cpp_logits(files["f32"], TOKENS)

    def moe(attr, value):
        def mutate(m):
            for f in m.ffns:
                if isinstance(f, MoEFFN):
                    setattr(f, attr, value)
        return mutate

    def rope_on_nope(m):
        m.layer_rope[3] = m.layer_rope[0]

    def no_rope_freqs(m):
        m.layer_rope = [r and (*r[:4], None, *r[5:]) for r in m.layer_rope]

    def neox(m):
        m.layer_rope = [r and (*r[:3], True, *r[4:]) for r in m.layer_rope]

    found = {name: rel_err(_logits(files["f32"], TOKENS, fn), want) for name, fn in {
        "weight on the output": moe("weight_input", False), "softmax": moe("gating", "softmax"),
        "no shared expert": moe("shared", None), "rope on the NoPE layer": rope_on_nope,
        "no q/k norm": lambda m: _layout(m, kq_norm=False), "no rope_freqs": no_rope_freqs, "neox": neox}.items()}
    right = rel_err(_logits(files["f32"], TOKENS), want)
    print(f"right {right:.4f}", {k: round(v, 3) for k, v in found.items()})
    assert right < TOL and min(found.values()) > 10 * TOL


def test_steps_and_split_match_prefill(files):
    with load(files["f32"], threads=2) as llm:
        assert_steps_and_split_match_prefill(llm.model, np.array(TOKENS, np.int32), split=9)


def test_small_chunks_steps_and_split_match_prefill(files):
    """Chunks of 5 positions: the prefill's copy path, a step's window path and a split crossing a chunk agree."""
    with load(files["f32"], threads=2) as llm:
        _layout(llm.model, chunk=5)
        assert_steps_and_split_match_prefill(llm.model, np.array(TOKENS, np.int32), split=7)
        chunked = llm.model.forward(np.array(TOKENS, np.int32), llm.model.new_cache(32), all_logits=True)
    assert rel_err(chunked[5:], _logits(files["f32"], TOKENS)[5:]) > 0.1  # the chunks change the logits


@pytest.mark.parametrize("p0,n", [(0, 13), (3, 9), (7, 1), (10, 1), (5, 5), (9, 11)])
def test_chunked_attention_matches_numpy(p0, n):
    """Against numpy attention over exactly the keys of each query's chunk (chunk 4), from any start p0."""
    from powerinfer_py.kernels.cpu import CpuKernels

    rng = np.random.default_rng(p0 * 31 + n)
    n_ctx, chunk = 24, 4
    k = rng.standard_normal((2, n_ctx, 8)).astype(np.float16)
    v = rng.standard_normal((2, n_ctx, 8)).astype(np.float16)
    q = rng.standard_normal((n, 4, 8)).astype(np.float32)
    kern = CpuKernels(2)
    try:
        got = chunked_attention(kern, q, k, v, p0, chunk, 0.35)
    finally:
        kern.close()
    for t in range(n):
        p = p0 + t
        c = (p // chunk) * chunk
        want = ref.attention(q[t:t + 1], np.ascontiguousarray(k[:, c:p + 1]), np.ascontiguousarray(v[:, c:p + 1]),
                             p - c, 0, 0.35)
        np.testing.assert_allclose(got[t], want[0], rtol=1e-5, atol=1e-5)


def test_attn_temperature_values():
    lay = dataclasses.replace(_layout_of_default(), temp_floor=8192)
    t = attn_temperature(np.array([0, 8190, 8191, 16383, 40000]), lay)
    want = [1.0, 1.0, 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(3), 1 + 0.1 * np.log(5)]
    np.testing.assert_allclose(t, want, rtol=1e-6)


def _layout_of_default():
    from powerinfer_py.models.llama4 import Llama4Layout
    return Llama4Layout(chunked=(True,), rope=(True,), kq_norm=True)


def test_long_context_matches_llama_cpp(tmp_path):
    """8200 tokens: the last 8 queries of layers 0-2 see only their own chunk, layer 3's q is scaled by 1.069."""
    import llama_cpp

    path = write_llama4_model(tmp_path / "long.gguf", n_embd=32, n_head=2, n_head_kv=1, n_ff=64, n_ff_exp=32,
                              n_vocab=340, moe_step=5)
    tokens = [1] + [int(t) for t in np.random.default_rng(3).integers(3, 340, LONG - 1)]
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=LONG + 8, n_batch=LONG + 8, n_ubatch=LONG + 8,
                          n_threads=2, verbose=False)
    try:
        llm.eval(tokens)
        want = np.array(llm.scores[LONG - 8:LONG], dtype=np.float32)
    finally:
        llm.close()
    n_ctx = LONG + 8
    found = {name: rel_err(_logits(path, tokens, fn, n_ctx=n_ctx)[-8:], want) for name, fn in {
        "right": None, "no chunks": lambda m: _layout(m, chunked=(False,) * 4),
        "no temperature": lambda m: _layout(m, temp_scale=0.0)}.items()}
    print({k: round(v, 4) for k, v in found.items()})
    assert found["right"] < TOL and found["no chunks"] > 10 * TOL and found["no temperature"] > 10 * found["right"]


def test_info(files):
    text = info_text(files["f32"])
    assert "llama4" in text and "chunk" in text and "dense FFN layers" in text


@pytest.mark.parametrize("edit,drop,error,match", [
    ({f"{A}.interleave_moe_layer_step": None}, (), ModelFileError, "interleave_moe_layer_step"),
    ({f"{A}.attention.sliding_window": 0}, (), UnsupportedError, "sliding_window = 0"),
    ({f"{A}.expert_count": 0}, (), ModelFileError, "expert_count"),
    ({}, ("blk.1.ffn_up_shexp.weight",), ModelFileError, "ffn_up_shexp"),
    ({}, ("blk.0.ffn_gate.weight",), ModelFileError, "ffn_gate"),
])
def test_bad_files(files, tmp_path, edit, drop, error, match):
    bad = rewrite_gguf(files["f32"], tmp_path / "bad.gguf", edit, drop)
    with pytest.raises(error, match=match):
        load(bad, threads=1)


def test_attention_bias_refused(files, tmp_path):
    bias = Tensor("blk.0.attn_q.bias", GGMLType.F32, (64,), np.zeros(64, np.float32))
    bad = rewrite_gguf(files["f32"], tmp_path / "bias.gguf", extra=[bias])
    with pytest.raises(PowerInferError, match="attention biases"):
        load(bad, threads=1)
