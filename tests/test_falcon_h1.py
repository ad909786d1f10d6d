"""Falcon-H1 (arch "falcon-h1"): every layer runs attention and a Mamba-2 mixer side by side on one normed input,
then a SwiGLU FFN. Tiny synthetic files (synth/falcon_h1.py: 3 layers, 8 mixer heads of 16 in 2 groups, NeoX RoPE)
against llama.cpp on the same file at f32 and q8_0, with and without the optional grouped norm ssm_norm; one token
at a time and a prefill in two parts against one prefill; chat reuse against a fresh prefill; the config and the
cache (K/V and mixer states on every layer); clear errors for broken files; `powerinfer info`.

Agreement with llama.cpp (max |logit difference| / std of llama.cpp's logits over all 16 positions, batch and one
token at a time alike; printed by test_mistakes_are_visible for f32): f32 0.0012, f32 without ssm_norm 0.0012
(tolerance 0.01); q8_0 0.080, q8_0 without ssm_norm 0.072 (tolerance 0.25). How far off the usual mistakes are
(the same measure on the f32 file, test_mistakes_are_visible): mixer branch dropped 4.4; attention branch dropped
2.7; ssm_norm skipped on a file that has it 4.1; a grouped norm (weight 1) on the file without one 3.9; a muP
multiplier applied at run time on top of the weights the converter already folded it into (embedding_multiplier
5.66, the 0.5B config's value) 4.2; normal instead of NeoX RoPE 1.7; the mixer states not carried into the second
call of a prefill split 6 + 10: 3.9 (on the last 10 positions). No multiplier survives as a key in a converted
file (llama.cpp's converter folds them all), so no "multiplier key dropped" mistake exists to measure.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_chat_reuse_matches_fresh_prefill, assert_matches_llama_cpp,
                          assert_steps_and_split_match_prefill, info_text, load_model, rel_err, rewrite_gguf)

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.layers.cache import Mamba2KVCache
from powerinfer_py.models import expected_tensors
from powerinfer_py.models.falcon_h1 import FalconH1Model
from powerinfer_py.layers.mamba2_mixer import mamba2_dims
from powerinfer_py.gguf.types import GGMLType, Tensor

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 301, 302, 303], dtype=np.int32)
TOL = 0.01  # as the other architectures' f32 files
QUANT_TOL = 0.25  # quantized files (tests/test_models.py's bound)
MISTAKE = 0.5  # every mistake below is further off than this (measured: 1.7 and more)
LAYERS = {"n_layer": 3}
NO_NORM = {"n_layer": 3, "ssm_norm": False}
EMBEDDING_MULTIPLIER = 5.656854  # Falcon-H1-0.5B's config value, folded into token_embd by the converter


def all_logits(model, tokens=TOKENS) -> np.ndarray:
    return model.forward(tokens, model.new_cache(32), all_logits=True)


@pytest.fixture(scope="module")
def f32_file(synthetic_model):
    return synthetic_model("falcon-h1", "f32", **LAYERS)


@pytest.fixture(scope="module")
def no_norm_file(synthetic_model):
    return synthetic_model("falcon-h1", "f32", **NO_NORM)


# ---- mutants (test_mistakes_are_visible) -----------------------------------------------------------------------

class NoMixer(FalconH1Model):
    def _mamba2(self, il, L, h, cache, p0):
        return np.zeros_like(h)


class NoAttention(FalconH1Model):
    def _attend(self, il, L, h, pos, cache, p0):
        return np.zeros_like(h)


class MultiplierTwice(FalconH1Model):
    def _embed(self, ids, pos):
        return super()._embed(ids, pos) * np.float32(EMBEDDING_MULTIPLIER)


def _without_ssm_norm(model):
    for L in model.layers:
        L.norm = None
    return model


def _with_unit_ssm_norm(model):
    G, d = model.config.ssm_n_group, model.config.ssm_d_inner
    for L in model.layers:
        L.norm = np.ones(d, np.float32)
    assert G > 1
    return model


# ---- tests ------------------------------------------------------------------------------------------------------

def test_config_and_cache(f32_file, no_norm_file):
    c = load_weights(open_gguf(f32_file), expected_tensors).config
    assert c.mamba_layers == (True,) * 3 and c.ffn_layers == (False,) * 3
    assert (c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_rot, c.rope_neox) == (4, 2, 16, 128, 16, True)
    assert c.attn_scale == pytest.approx(0.25)
    assert mamba2_dims(c) == (8, 16, 2, 16, 128 + 2 * 2 * 16)
    cache = FalconH1Model.new_cache.__get__(type("M", (), {"config": c})())(32)
    assert isinstance(cache, Mamba2KVCache)
    assert all(s is not None and s.shape == (8, 16, 16) for s in cache.ssm)
    assert all(s is not None and s.shape == (3, 192) for s in cache.conv)
    assert [cache.k[il].shape for il in range(3)] == [(2, 32, 16)] * 3  # K/V on every layer too


@pytest.mark.parametrize("dtype,opts,tol", [
    ("f32", LAYERS, TOL), ("f32", NO_NORM, TOL), ("q8_0", LAYERS, QUANT_TOL), ("q8_0", NO_NORM, QUANT_TOL)],
    ids=["f32", "f32-no-ssm-norm", "q8_0", "q8_0-no-ssm-norm"])
def test_logits_match_llama_cpp(synthetic_model, dtype, opts, tol):
    """Every position within tol of llama.cpp's spread (the same top-1 at f32), one token at a time as a batch."""
    assert_matches_llama_cpp(synthetic_model("falcon-h1", dtype, **opts), TOKENS, tol, same_top1=dtype == "f32")


def test_steps_split_and_truncation(f32_file, cpu_kernels):
    model = load_model(f32_file, cpu_kernels)
    assert_steps_and_split_match_prefill(model, TOKENS, split=6)
    cache = model.new_cache(32)
    whole = model.forward(TOKENS, cache, all_logits=True)
    cache.truncate(16)  # keeps everything
    assert cache.n_past == 16
    cache.truncate(10)  # a recurrent state cannot be rewound: restarts at 0
    assert cache.n_past == 0
    np.testing.assert_allclose(model.forward(TOKENS, cache, all_logits=True), whole, rtol=0, atol=1e-5 * whole.std())


def test_chat_reuse_equals_fresh_prefill(f32_file):
    assert_chat_reuse_matches_fresh_prefill(f32_file)


def test_mistakes_are_visible(f32_file, no_norm_file, cpu_kernels):
    ref, ref_no_norm = llama_cpp_logits(f32_file, TOKENS), llama_cpp_logits(no_norm_file, TOKENS)
    right = {"norm": rel_err(all_logits(load_model(f32_file, cpu_kernels)), ref),
             "no norm": rel_err(all_logits(load_model(no_norm_file, cpu_kernels)), ref_no_norm)}
    assert all(v < TOL for v in right.values()), right
    far = {name: rel_err(all_logits(load_model(f32_file, cpu_kernels, cls)), ref) for name, cls in {
        "mixer dropped": NoMixer, "attention dropped": NoAttention, "multiplier applied twice": MultiplierTwice}.items()}
    far["ssm_norm skipped"] = rel_err(all_logits(_without_ssm_norm(load_model(f32_file, cpu_kernels))), ref)
    far["norm without ssm_norm"] = rel_err(all_logits(_with_unit_ssm_norm(load_model(no_norm_file, cpu_kernels))),
                                           ref_no_norm)
    far["normal RoPE"] = rel_err(all_logits(load_model(f32_file, cpu_kernels, rope_neox=False)), ref)
    model = load_model(f32_file, cpu_kernels)
    cache = model.new_cache(32)
    model.forward(TOKENS[:6], cache)
    for il in range(model.config.n_layer):  # the mixer states forgotten between the calls (K/V kept)
        cache.ssm[il][...] = 0
        cache.conv[il][...] = 0
    far["state not carried"] = rel_err(model.forward(TOKENS[6:], cache, all_logits=True), ref[6:])
    print({k: round(v, 5) for k, v in right.items()}, {k: round(v, 3) for k, v in far.items()})
    assert all(v > MISTAKE for v in far.values()), far


def test_broken_files_are_clear_errors(f32_file, tmp_path):
    bad = rewrite_gguf(f32_file, tmp_path / "no_a.gguf", drop=("blk.1.ssm_a",))
    with pytest.raises(ModelFileError, match="blk.1.ssm_a"):
        load(bad, threads=1)
    bad = rewrite_gguf(f32_file, tmp_path / "no_ffn_norm.gguf", drop=("blk.2.ffn_norm",))
    with pytest.raises(ModelFileError, match="blk.2.ffn_norm"):
        load(bad, threads=1)
    bad = rewrite_gguf(f32_file, tmp_path / "no_rank.gguf", edit={"falcon-h1.ssm.time_step_rank": None})
    with pytest.raises(ModelFileError, match="falcon-h1.ssm.time_step_rank"):
        load(bad, threads=1)
    bias = Tensor("blk.0.attn_output.bias", GGMLType.F32, (64,), np.ones(64, np.float32))
    with pytest.raises(UnsupportedError, match="biases.*blk.0.attn_output.bias"):
        load(rewrite_gguf(f32_file, tmp_path / "bias.gguf", extra=[bias]), threads=1)


def test_info_shows_the_layer_kinds(f32_file):
    text = info_text(f32_file, width=240)
    assert "falcon-h1" in text and "every layer: attention + Mamba-2 mixer in parallel, then SwiGLU FFN" in text
