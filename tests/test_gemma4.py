"""Gemma 4 (arch "gemma4", dense): tiny synthetic files (synth/gemma4.py: sliding and full layers of different
head dims and KV heads, two KV-sharing layers, a full layer without attn_v, proportional RoPE factors, per-layer
FFN widths and output scales, with and without per-layer embeddings) against llama.cpp on the same file,
prefill against one token at a time, the config read from the per-layer metadata, clear errors for broken
files, and threshold calibration on the GeGLU FFN.

Each feature matters on these files: with one of them left out, the logits move away from llama.cpp's by (max
|diff| / spread of llama.cpp's logits, 16 tokens, window 4; measured by test_each_feature_matters):
    no V norm 2.9 / 1.7 (per-layer embeddings / none), no layer_output_scale 3.1 / 2.0, no per-layer
    embeddings 3.8 (-), K/V not shared (the shared layers read layers 0 and 1) 2.9 / 2.8, rope_freqs ignored
    0.13 / 0.024
against 0.009 / 0.003 for the model as it is (llama.cpp rounds q, K and V to f16 in its attention).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import info_text, rel_err, rewrite_gguf

from powerinfer_py import load
from powerinfer_py.tools.calibrate import calibrate
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.synth.gemma4 import write_gemma4_model

# <s> and 15 word pieces: four times the window of 4, so that the sliding layers drop keys
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 280, 290, 301], np.int32)
TOL = 0.015  # measured 0.009 (per-layer embeddings) and 0.003 of the spread
# Q8_0: position 0 agrees to 1e-3, later ones drift (measured 0.40 with per-layer embeddings, 0.14 without); the
# gemma3 synthetic Q8_0 file drifts the same way (0.15 on these tokens), so it is llama.cpp's quantized path,
# not the gemma4 layers; the F32 comparison above is the tight one
QUANT_TOL = 0.5


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4")
    return {(P, dtype): write_gemma4_model(d / f"g4-{P}-{dtype}.gguf", per_layer=P, dtype=dtype)
            for P in (8, 0) for dtype in ("f32", "q8_0")}


@pytest.fixture(scope="module")
def refs(files):
    return {key: llama_cpp_logits(path, TOKENS) for key, path in files.items()}


def build(path, kernels, **layout_changes):
    w = load_weights(open_gguf(path), expected_tensors)
    c = w.config
    if layout_changes:
        c = dataclasses.replace(c, gemma4=dataclasses.replace(c.gemma4, **layout_changes))
    return build_model(c, w.tensors, kernels)


def logits(model) -> np.ndarray:
    return model.forward(TOKENS, model.new_cache(32), all_logits=True)


def test_config_reads_the_per_layer_layout(files):
    c = load_weights(open_gguf(files[8, "f32"]), expected_tensors).config
    g = c.gemma4
    assert c.swa_layers == (True, False, True, False, True, False) and c.sliding_window == 4
    assert g.head_dim == (16, 32) * 3 and g.n_rot == (16, 32) * 3 and g.n_head_kv == (2, 1) * 3
    assert g.rope_base == (1e4, 1e6) * 3 and g.n_ff == (96,) * 4 + (192,) * 2
    assert g.kv_source == (0, 1, 2, 3, 2, 3) and g.n_embd_per_layer == 8
    assert c.attn_scale == 1.0 and c.final_softcap == 4.0 and c.embd_scale == pytest.approx(8.0)
    assert c.rope_neox and c.head_dim == 32 and c.n_ff == 192


@pytest.mark.parametrize("P", [8, 0], ids=["per-layer-embd", "no-per-layer-embd"])
@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_matches_llama_cpp(files, refs, cpu_kernels, P, dtype):
    """Logits at every position against llama.cpp's (same top-1 at F32); one token at a time = the batch."""
    ref = refs[P, dtype]
    model = build(files[P, dtype], cpu_kernels)
    batch = logits(model)
    assert rel_err(batch, ref) < (TOL if dtype == "f32" else QUANT_TOL)
    if dtype == "f32":
        assert (batch.argmax(1) == ref.argmax(1)).all()
    cache = model.new_cache(32)
    steps = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    np.testing.assert_allclose(steps, batch, rtol=0, atol=1e-4 * ref.std())
    # the shared layers hold their source layers' arrays: nothing stored twice
    assert cache.k[4] is cache.k[2] and cache.v[5] is cache.v[3]
    assert cache.nbytes == sum(cache.k[il].nbytes * 2 for il in range(4))


class _NoVNorm:
    """Kernels whose weightless RMSNorm (only the V norm uses one) returns its input."""

    def __init__(self, k):
        self.k = k

    def __getattr__(self, name):
        return getattr(self.k, name)

    def rmsnorm(self, x, w, eps):
        return x.copy() if w is None else self.k.rmsnorm(x, w, eps)


def test_each_feature_matters(files, refs, cpu_kernels):
    """The module docstring's mutation distances: each is far above TOL."""
    for P in (8, 0):
        path, ref = files[P, "f32"], refs[P, "f32"]
        dist = {}
        m = build(path, cpu_kernels)
        m.kernels = _NoVNorm(cpu_kernels)
        dist["v_norm"] = rel_err(logits(m), ref)
        m = build(path, cpu_kernels)
        for L in m.layers:
            L.out_scale = None
        dist["out_scale"] = rel_err(logits(m), ref)
        if P:
            m = build(path, cpu_kernels)
            m.per_layer_inputs = lambda ids, e: np.zeros((6, len(ids), P), np.float32)
            dist["per_layer"] = rel_err(logits(m), ref)
        dist["kv_shared"] = rel_err(logits(build(path, cpu_kernels, kv_source=(0, 1, 2, 3, 0, 1))), ref)
        m = build(path, cpu_kernels)
        m.layer_attn = [(w, rope[:4] + (None,)) for w, rope in m.layer_attn]
        dist["rope_freqs"] = rel_err(logits(m), ref)
        print(P, {k: round(v, 3) for k, v in dist.items()})
        assert min(dist.values()) > TOL


def test_info(files):
    text = info_text(files[8, "f32"])
    assert "gemma4" in text and "runnable             yes" in text


def test_broken_files_are_refused(files, tmp_path):
    src = files[0, "f32"]
    bad = rewrite_gguf(src, tmp_path / "no-qnorm.gguf", drop=("blk.1.attn_q_norm.weight",))
    with pytest.raises(ModelFileError, match="blk.1.attn_q_norm.weight"):
        load(bad, threads=1)
    bad = rewrite_gguf(src, tmp_path / "no-k.gguf", drop=("blk.0.attn_k.weight",))
    with pytest.raises(ModelFileError, match="blk.0.attn_k.weight"):
        load(bad, threads=1)
    bad = rewrite_gguf(src, tmp_path / "ff.gguf", edit={"gemma4.feed_forward_length": [96] * 5})
    with pytest.raises(ModelFileError, match="feed_forward_length"):
        load(bad, threads=1)
    bad = rewrite_gguf(src, tmp_path / "pattern.gguf",
                       edit={"gemma4.attention.sliding_window_pattern": [True] * 3 + [False] * 3})
    with pytest.raises(ModelFileError, match="shares the K/V of layer"):
        load(bad, threads=1)
    # experts run (test_gemma4_moe.py), but need their metadata
    bad = rewrite_gguf(src, tmp_path / "moe.gguf", edit={"gemma4.expert_count": 4})
    with pytest.raises(ModelFileError, match="expert_used_count"):
        load(bad, threads=1)


def test_threshold_calibration(files, tmp_path):
    """calibrate writes per-layer neuron scales of each layer's own width; threshold mode at sparsity 0 is the
    dense model bit for bit, and at 0.5 about half of each layer's neurons run."""
    res = calibrate(files[8, "f32"], tmp_path / "g4.t50.gguf", 0.5, text="the cat sat on the mat " * 20,
                    n_tokens=96, ctx=32, threads=1)
    assert len(res.thresholds) == 6 and all(t > 0 for t in res.thresholds)
    ids = [int(t) for t in TOKENS]
    with load(res.path, threads=1, sparse="off") as dense, load(res.path, threads=1, sparse="threshold",
                                                                   sparsity=0) as sp:
        np.testing.assert_array_equal(logits(dense.model), logits(sp.model))
    with load(res.path, threads=1) as llm:
        assert llm.sparse.mode == "threshold"
        llm.model.forward(ids, llm.model.new_cache(32))
        assert all(0.3 < f < 0.7 for f in llm.model.sparsity.fractions)
