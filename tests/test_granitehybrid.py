"""IBM Granite 4.0-H (arch "granitehybrid"): Mamba-2 mixer and attention layers, every layer followed by Granite's
FFN (dense SwiGLU or experts with an ungated shared expert), with Granite's four scalars. Tiny synthetic files
(synth/nemotron_h.py, pattern "M*MM*M": attention after one and after two mixers) against llama.cpp on the same file at
f32 and q8_0, dense and MoE; one token at a time against a prefill; the one-call attention step against the
Python path; the config read from the file; a clear error for a broken file; `powerinfer info`.

The files carry embedding_scale 10, residual_scale 0.5, attention.scale 0.6 (head_dim 16: the default would be
0.25), logit_scale 4 (synth.common.GRANITE_SCALES) and, as the Granite 4.0-H files, rope.scaling.finetuned = false (no
RoPE); ROPE_FILE says true (Bamba-style files). Agreement with llama.cpp (max |logit difference| / std of
llama.cpp's logits, measured by test_logits_match_llama_cpp's files): f32 dense 0.00097, f32 with RoPE 0.00082,
f32 MoE 0.00091 (tolerance 0.01); q8_0 dense 0.062, q8_0 MoE 0.071 (tolerance 0.25). How far off the usual mistakes
are (the same measure, test_mistakes_are_visible, on the f32 dense file unless said): embedding scale dropped 5.6,
residual scale dropped 4.2, attention scale 1/sqrt(head_dim) instead of the key 1.1, logit scale dropped 12.1,
RoPE wrongly on (on the RoPE-less file) 2.2, RoPE wrongly off (on ROPE_FILE) 2.2, mixer states not carried into
the second call of a prefill split 6 + 10: 3.0 (on the last 10 positions); on the MoE file, the chosen experts'
weights not renormalized 0.44 and the shared expert dropped 2.6.

MoE files use seed 1: with seed 0 the q8_0 MoE file misses by 0.37 of the spread on one token while its f32 twin
agrees to 0.001; seed 0's layer 3 has 2nd and 3rd router logits only 0.007 apart, a near-tie quantization can flip.
test_routers_have_no_near_ties checks seed 1's margins (smallest gap measured: 0.027).
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_fused_decode_equals_python, assert_matches_llama_cpp, info_text, load_model,
                          rel_err, rewrite_gguf)

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.layers.cache import Mamba2KVCache
from powerinfer_py.models import expected_tensors
from powerinfer_py.models.granitehybrid import GraniteHybridModel
from powerinfer_py.layers.moe import MoEFFN

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 301, 302, 303], dtype=np.int32)
TOL = 0.01  # as the other architectures' f32 files
QUANT_TOL = 0.25  # quantized files (tests/test_models.py's bound)
MISTAKE = 0.3  # every mistake below is further off than this (measured: 0.44 and more)
MOE = {"n_expert": 4, "n_ff_shexp": 64, "seed": 1}
ROPE_FILE = {"rope_finetuned": True}


def all_logits(model, tokens=TOKENS) -> np.ndarray:
    return model.forward(tokens, model.new_cache(32), all_logits=True)


@pytest.fixture(scope="module")
def f32_file(synthetic_model):
    return synthetic_model("granitehybrid", "f32")


@pytest.fixture(scope="module")
def moe_file(synthetic_model):
    return synthetic_model("granitehybrid", "f32", **MOE)


def test_config_reads_layer_kinds_scales_and_experts(f32_file, moe_file, synthetic_model):
    c = load_weights(open_gguf(f32_file), expected_tensors).config
    assert c.mamba_layers == (True, False, True, True, False, True) and not any(c.ffn_layers)
    assert (c.n_head_kv, c.n_ff, c.n_rot, c.conv_kernel, c.n_expert) == (2, 128, 0, 4, 0)
    assert (c.embd_scale, c.residual_scale, c.logit_scale) == (10.0, 0.5, 4.0)
    assert c.attn_scale == pytest.approx(0.6)
    assert load_weights(open_gguf(synthetic_model("granitehybrid", "f32", **ROPE_FILE)),
                        expected_tensors).config.n_rot == 16
    m = load_weights(open_gguf(moe_file), expected_tensors).config
    assert (m.n_expert, m.n_expert_used, m.n_ff_exp, m.n_ff_shexp, m.expert_weights_norm) == (4, 2, 128, 64, True)
    cache = GraniteHybridModel.new_cache.__get__(type("M", (), {"config": c})())(32)
    assert isinstance(cache, Mamba2KVCache)
    assert [s is not None for s in cache.ssm] == list(c.mamba_layers)
    assert [cache.k[il].shape[1] for il in range(6)] == [0, 32, 0, 0, 32, 0]  # K/V on the attention layers only


@pytest.mark.parametrize("dtype,opts,tol", [
    ("f32", {}, TOL), ("f32", ROPE_FILE, TOL), ("f32", MOE, TOL), ("q8_0", {}, QUANT_TOL), ("q8_0", MOE, QUANT_TOL)],
    ids=["f32", "f32-rope", "f32-moe", "q8_0", "q8_0-moe"])
def test_logits_match_llama_cpp(synthetic_model, dtype, opts, tol):
    """Every position within tol of llama.cpp's spread (the same top-1 at f32), one token at a time as a batch."""
    assert_matches_llama_cpp(synthetic_model("granitehybrid", dtype, **opts), TOKENS, tol, same_top1=dtype == "f32")


def test_routers_have_no_near_ties(moe_file, cpu_kernels):
    """At every MoE layer and token the 2nd and 3rd router logits of the MoE file differ by more than 0.02 (so the
    q8_0 twin picks the same experts as llama.cpp)."""
    m = load_model(moe_file, cpu_kernels)
    gaps = []
    for ffn in m.ffns:
        assert isinstance(ffn, MoEFFN)

        def recording(x, logits=None, ffn=ffn, route=ffn.route):
            top = np.sort(cpu_kernels.matmul(ffn.router, x), axis=1)
            gaps.append(float((top[:, -2] - top[:, -3]).min()))
            return route(x, logits)
        ffn.route = recording
    all_logits(m)
    assert len(gaps) == 6 and min(gaps) > 0.02, gaps


def test_prefill_in_two_parts_and_fused_steps(f32_file, moe_file, cpu_kernels):
    model = load_model(f32_file, cpu_kernels)
    whole = all_logits(model)
    cache = model.new_cache(32)
    a = model.forward(TOKENS[:6], cache, all_logits=True)
    b = model.forward(TOKENS[6:], cache, all_logits=True)
    np.testing.assert_allclose(np.concatenate([a, b]), whole, rtol=0, atol=1e-5 * whole.std())
    assert_fused_decode_equals_python(model, TOKENS[:8])
    assert_fused_decode_equals_python(load_model(moe_file, cpu_kernels), TOKENS[:8])


def _mutant(path, kernels, tokens=TOKENS, **changes) -> np.ndarray:
    return all_logits(load_model(path, kernels, **changes), tokens)


def test_mistakes_are_visible(synthetic_model, f32_file, moe_file, cpu_kernels):
    ref = llama_cpp_logits(f32_file, TOKENS)
    assert rel_err(_mutant(f32_file, cpu_kernels), ref) < TOL
    far = {name: rel_err(_mutant(f32_file, cpu_kernels, **change), ref) for name, change in {
        "no embedding scale": {"embd_scale": 1.0}, "no residual scale": {"residual_scale": 1.0},
        "default attention scale": {"attn_scale": 0.25}, "no logit scale": {"logit_scale": 1.0},
        "RoPE wrongly on": {"n_rot": 16}}.items()}
    rope_file = synthetic_model("granitehybrid", "f32", **ROPE_FILE)
    far["RoPE wrongly off"] = rel_err(_mutant(rope_file, cpu_kernels, n_rot=0), llama_cpp_logits(rope_file, TOKENS))
    model = load_model(f32_file, cpu_kernels)
    cache = model.new_cache(32)
    model.forward(TOKENS[:6], cache)
    for il in range(model.config.n_layer):  # the mixer states forgotten between the calls
        if cache.ssm[il] is not None:
            cache.ssm[il][...] = 0
            cache.conv[il][...] = 0
    far["state not carried"] = rel_err(model.forward(TOKENS[6:], cache, all_logits=True), ref[6:])
    moe_ref = llama_cpp_logits(moe_file, TOKENS)
    far["experts not renormalized"] = rel_err(_mutant(moe_file, cpu_kernels, expert_weights_norm=False), moe_ref)
    model = load_model(moe_file, cpu_kernels)
    for ffn in model.ffns:
        ffn.shared = None
    far["no shared expert"] = rel_err(all_logits(model), moe_ref)
    print({k: round(v, 3) for k, v in far.items()})
    assert all(v > MISTAKE for v in far.values()), far


def test_missing_tensor_is_a_clear_error(f32_file, tmp_path):
    bad = rewrite_gguf(f32_file, tmp_path / "bad.gguf", drop=("blk.2.ssm_a",))
    with pytest.raises(ModelFileError, match="blk.2.ssm_a"):
        load(bad, threads=1)
    bad = rewrite_gguf(f32_file, tmp_path / "bad2.gguf", edit={"granitehybrid.attention.head_count_kv": [2] * 5})
    with pytest.raises(ModelFileError, match="head_count_kv must be an array of 6"):
        load(bad, threads=1)


def test_info_lists_the_arch(f32_file):
    text = info_text(f32_file, width=200)
    assert "granitehybrid" in text and "logits / 4" in text
