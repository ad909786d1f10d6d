"""Nemotron-H (arch "nemotron_h"): Mamba-2 mixers, attention layers and squared-ReLU FFN layers, one kind per layer.
The config read from the per-layer head_count_kv / feed_forward_length arrays and the ssm.* keys, tiny synthetic
files (synth/nemotron_h) against llama.cpp on the same file (f32 and q8_0), the recurrent state carried across forward
calls (one token at a time, a prefill in two parts), the cache's all-or-nothing truncation and a chat whose
conversation diverges, a clear error for a broken file, `powerinfer info`, and `--sparse exact` on the FFNs.

The 6-layer file is "M-M*M-": mixers 0, 2, 4, FFNs 1, 5, attention 3, so every kind feeds every kind; 8 mixer heads
of 16 share 2 groups of B and C; 16 tokens let the 4-tap conv and the decaying state matter at every position.
How far off the usual mistakes would be (max |logit difference| / std of llama.cpp's logits on the f32 file,
measured by test_mistakes_are_visible): the right model 0.00036 against a tolerance of 0.01 (the q8_0 file: 0.035
against 0.25); no D skip: 3.8; the norm before the gate instead of after it: 2.4; the conv without its bias: 3.7;
the states not carried into the second call of a prefill split 6 + 10: 4.5 (on the last 10 positions); n_group
ignored (every head reads group 0, one norm over all of d_inner): 3.9.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_chat_reuse_matches_fresh_prefill, assert_matches_llama_cpp, info_text, load_model,
                          rel_err, rewrite_gguf)

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.layers.ffn import resolve_sparse
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.layers.cache import Mamba2KVCache
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.layers.mamba2_mixer import mamba2_dims
from powerinfer_py.models.nemotron_h import NemotronHModel

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 301, 302, 303], dtype=np.int32)
TOL = 0.01  # as the other architectures' f32 files
QUANT_TOL = 0.25  # quantized files (tests/test_models.py's bound)
MISTAKE = 0.5  # every mistake below is further off than this (measured: 2.4 and more)


def all_logits(model, tokens=TOKENS) -> np.ndarray:
    return model.forward(tokens, model.new_cache(32), all_logits=True)


@pytest.fixture(scope="module")
def f32_file(synthetic_model):
    return synthetic_model("nemotron_h", "f32")


@pytest.fixture(scope="module")
def reference(f32_file):
    return llama_cpp_logits(f32_file, TOKENS)


# ---- mutants (test_mistakes_are_visible) -----------------------------------------------------------------------

class NormThenGate(NemotronHModel):
    """The grouped RMS norm first, then the silu(z) gate."""

    def _gate_norm(self, y, z, w):
        n, G = y.shape[0], self.config.ssm_n_group
        g = y.reshape(n, G, -1)
        g = g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + np.float32(self.config.norm_eps))
        return g.reshape(n, -1) * w * self.kernels.silu(np.ascontiguousarray(z))


class OneGroup(NemotronHModel):
    """n_group ignored: every head reads B and C of group 0, and the norm runs over all of d_inner."""

    def _head_groups(self):
        return np.zeros(self.config.ssm_n_v_heads, dtype=np.int64)

    def _gate_norm(self, y, z, w):
        g = y * self.kernels.silu(np.ascontiguousarray(z))
        return g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + np.float32(self.config.norm_eps)) * w


def _mixers(model):
    return [L for il, L in enumerate(model.layers) if model.config.mamba_layers[il]]


# ---- tests ------------------------------------------------------------------------------------------------------

def test_config_reads_the_layer_kinds_and_mixer_sizes(f32_file):
    c = load_weights(open_gguf(f32_file), expected_tensors).config
    assert c.mamba_layers == (True, False, True, False, True, False)
    assert c.ffn_layers == (False, True, False, False, False, True)
    assert (c.n_head_kv, c.n_ff, c.n_rot, c.conv_kernel) == (2, 128, 0, 4)
    assert mamba2_dims(c) == (8, 16, 2, 16, 128 + 2 * 2 * 16)
    cache = NemotronHModel.new_cache.__get__(type("M", (), {"config": c})())(32)
    assert isinstance(cache, Mamba2KVCache)
    assert [s is not None for s in cache.ssm] == list(c.mamba_layers)
    assert [x is not None for x in cache.conv] == list(c.mamba_layers)
    assert [cache.k[il].shape[1] for il in range(6)] == [0, 0, 0, 32, 0, 0]  # K/V on the attention layer only


def test_logits_match_llama_cpp_f32(f32_file):
    assert_matches_llama_cpp(f32_file, TOKENS, TOL, same_top1=True)


def test_logits_match_llama_cpp_q8_0(synthetic_model):
    assert_matches_llama_cpp(synthetic_model("nemotron_h", "q8_0"), TOKENS, QUANT_TOL, same_top1=False)


def test_rms_eps_is_the_one_llama_cpp_uses(synthetic_model):
    """llama.cpp insists on attention.layer_norm_epsilon too but normalizes with the RMS eps: a file whose
    layer_norm_epsilon is absurd still matches."""
    path = synthetic_model("nemotron_h", "f32", ln_eps=0.5)
    assert_matches_llama_cpp(path, TOKENS[:8], TOL, same_top1=True)


def test_prefill_in_two_parts_and_truncation(f32_file, cpu_kernels):
    model = load_model(f32_file, cpu_kernels)
    whole = all_logits(model)
    cache = model.new_cache(32)
    a = model.forward(TOKENS[:6], cache, all_logits=True)
    b = model.forward(TOKENS[6:], cache, all_logits=True)
    np.testing.assert_allclose(np.concatenate([a, b]), whole, rtol=0, atol=1e-5 * whole.std())
    cache.truncate(16)  # keeps everything
    assert cache.n_past == 16
    cache.truncate(10)  # cannot rewind a recurrent state: restarts at 0
    assert cache.n_past == 0
    np.testing.assert_allclose(model.forward(TOKENS, cache, all_logits=True), whole, rtol=0, atol=1e-5 * whole.std())


def test_chat_reuse_after_divergence_equals_fresh_prefill(synthetic_model):
    # seed 1: the default file's greedy reply ends inside a multi-byte character, whose text re-encodes to other
    # tokens, so even an unedited turn 2 could not reuse the cache (a property of the random vocabulary)
    assert_chat_reuse_matches_fresh_prefill(synthetic_model("nemotron_h", "f32", seed=1))


def test_mistakes_are_visible(f32_file, cpu_kernels, reference):
    right = rel_err(all_logits(load_model(f32_file, cpu_kernels)), reference)
    assert right < TOL
    far = {"norm then gate": rel_err(all_logits(load_model(f32_file, cpu_kernels, NormThenGate)), reference),
           "one group": rel_err(all_logits(load_model(f32_file, cpu_kernels, OneGroup)), reference)}
    model = load_model(f32_file, cpu_kernels)
    for L in _mixers(model):
        L.D = np.zeros_like(L.D)
    far["no D skip"] = rel_err(all_logits(model), reference)
    model = load_model(f32_file, cpu_kernels)
    for L in _mixers(model):
        L.conv_b = None
    far["conv without bias"] = rel_err(all_logits(model), reference)
    model = load_model(f32_file, cpu_kernels)
    cache = model.new_cache(32)
    model.forward(TOKENS[:6], cache)
    for il in range(model.config.n_layer):  # the state forgotten between the calls
        if cache.ssm[il] is not None:
            cache.ssm[il][...] = 0
            cache.conv[il][...] = 0
    far["state not carried"] = rel_err(model.forward(TOKENS[6:], cache, all_logits=True), reference[6:])
    print({k: round(v, 3) for k, v in far.items()}, "right", right)
    assert all(v > MISTAKE for v in far.values()), far


def test_missing_ssm_tensor_is_a_clear_error(f32_file, tmp_path):
    bad = rewrite_gguf(f32_file, tmp_path / "bad.gguf", drop=("blk.2.ssm_a",))
    with pytest.raises(ModelFileError, match="blk.2.ssm_a"):
        load(bad, threads=1)


def test_experts_are_refused(f32_file, tmp_path):
    bad = rewrite_gguf(f32_file, tmp_path / "moe.gguf", edit={"nemotron_h.expert_count": 8})
    with pytest.raises(UnsupportedError, match="experts"):
        load(bad, threads=1)


def test_info_lists_the_arch(f32_file):
    text = info_text(f32_file)
    assert "nemotron_h" in text and "layer kinds          Mamba-2 mixers 0, 2, 4; attention 3; FFN 1, 5" in text


def test_sparse_exact_is_bit_for_bit_off(f32_file, cpu_kernels):
    w = load_weights(open_gguf(f32_file), expected_tensors)
    off = build_model(w.config, w.tensors, cpu_kernels, resolve_sparse(w.config, "off"))
    exact = build_model(w.config, w.tensors, cpu_kernels, resolve_sparse(w.config, "exact"))
    a, b = all_logits(off), all_logits(exact)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    cache_a, cache_b = off.new_cache(32), exact.new_cache(32)
    for t in TOKENS[:5]:  # decode steps too
        x, y = off.forward([t], cache_a), exact.forward([t], cache_b)
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
    stats = exact.sparsity
    active = stats.active[1] / stats.tokens[1]
    assert 0 < active < w.config.n_ff  # relu(up x) skips a real share of the neurons


# ---- plain mamba2 (every layer a mixer: the same model class) ---------------------------------------------------

@pytest.mark.parametrize("dtype,tol", [("f32", TOL), ("q8_0", QUANT_TOL)])
def test_plain_mamba2_matches_llama_cpp(synthetic_model, dtype, tol):
    assert_matches_llama_cpp(synthetic_model("mamba2", dtype), TOKENS, tol, same_top1=dtype == "f32")


def test_plain_mamba2_needs_its_state(synthetic_model, cpu_kernels):
    path = synthetic_model("mamba2", "f32")
    c = load_weights(open_gguf(path), expected_tensors).config
    assert c.mamba_layers == (True,) * 4 and not any(c.ffn_layers)
    model = load_model(path, cpu_kernels)
    ref = llama_cpp_logits(path, TOKENS)
    cache = model.new_cache(32)
    model.forward(TOKENS[:6], cache)
    for s in cache.ssm:
        s[...] = 0
    assert rel_err(model.forward(TOKENS[6:], cache, all_logits=True), ref[6:]) > MISTAKE


def test_sparse_modes_on_a_model_without_ffns_say_so(synthetic_model):
    """mamba2: every layer is a mixer, so no sparse mode has an FFN to work on; the error says that (not that the
    FFN it lacks is SwiGLU)."""
    path = synthetic_model("mamba2", "f32")
    with pytest.raises(UnsupportedError, match="this mamba2 model has none .* use 'off'"):
        load(path, threads=1, sparse="exact")
