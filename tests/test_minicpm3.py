"""MiniCPM3 (GGUF arch "minicpm3"): multi-head latent attention with MiniCPM's fixed scalars, against llama.cpp
on synthetic files, one token at a time against a batch, LongRoPE, and the files we refuse.

Files (synth/minicpm.py): n_embd 64, 4 heads of 16 unrotated + 8 rotated q/k dims, q rank 32, latent 32, untied.
PLAIN has 3 layers and no value_length key (values n_embd / n_head = 16 wide, as the converter's files);
VLEN writes value_length 24 (llama.cpp reads it); LONGROPE (2 layers) has short/long factors, attn_factor 1.3 and
original context 256 (llama.cpp rounds n_ctx up to 256: 32 is short, 512 long).
Measured (max |ours - llama.cpp| over the spread of llama.cpp's logits; the f32 test passes below 0.01, Q8_0
below 0.12): f32 PLAIN 0.0012, VLEN 0.0017, LONGROPE 0.0014 (short and long); Q8_0 0.067, 0.054, 0.051 / 0.068.
Mutations on PLAIN (same measure, f32): no embedding scale 4.4, no residual scale 0.64 (1.4/sqrt(3) = 0.81
instead of 1), no logit scale 3.2, normal RoPE layout instead of NeoX 0.76, RoPE on the head's first 8 dims
instead of its tail 2.1; LONGROPE: the other factor set 0.71, no attn_factor 0.70 (0.69 at 512).
test_each_part_matters re-checks them with a bar of 0.3.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (
    assert_matches_llama_cpp,
    info_text,
    llama_cpp_quantized,
    load_model,
    rewrite_gguf,
)

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, UnsupportedError

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]
A = "minicpm3"
PLAIN = dict(n_layer=3)
VLEN = dict(value_length=24, seed=1)
_RNG = np.random.default_rng(7)
FACTORS = (1 + 3 * _RNG.random(4), 1 + 20 * _RNG.random(4))  # (short, long): n_rot 8
LONGROPE = dict(rope_factors=FACTORS, orig_ctx=256, attn_factor=1.3)
_LONGROPE_FILES: dict = {}


def _file(synthetic_model, dtype, kw):
    """The session's file for kw (LONGROPE's factor arrays cannot key the fixture's cache: kept here)."""
    if kw is not LONGROPE:
        return synthetic_model(A, dtype, **kw)
    if dtype not in _LONGROPE_FILES:
        from powerinfer_py.synth import write_synthetic_model
        folder = synthetic_model(A, "f32", **PLAIN).parent
        _LONGROPE_FILES[dtype] = write_synthetic_model(folder / f"minicpm3-longrope-{dtype}.gguf", A, dtype=dtype,
                                                       **LONGROPE)
    return _LONGROPE_FILES[dtype]


@pytest.mark.parametrize("kw", [PLAIN, VLEN], ids=["plain", "value-length"])
@pytest.mark.parametrize("dtype,tol", [("f32", 0.01), ("q8_0", 0.12)])
def test_logits_match_llama_cpp(synthetic_model, kw, dtype, tol):
    """Every position within tol of llama.cpp (same top-1 at f32); steps equal the batch (model_checks)."""
    assert_matches_llama_cpp(_file(synthetic_model, dtype, kw), TOKENS, tol, same_top1=dtype == "f32")


def test_config_and_cache(synthetic_model, cpu_kernels):
    """The sizes and fixed scalars as llama.cpp has them, and the latent cache (latent + rope key per token)."""
    m = load_model(_file(synthetic_model, "f32", PLAIN), cpu_kernels)
    c = m.config
    assert (c.head_dim, c.n_rot, c.v_head_dim, c.kv_lora_rank, c.q_lora_rank, c.n_head_kv) == (24, 8, 16, 32, 32, 1)
    assert c.rope_neox and not c.mla_kv_split and c.n_expert == 0 and c.rope_orig_ctx == 512
    assert (c.embd_scale, c.logit_scale) == (12.0, 0.25) and c.residual_scale == pytest.approx(1.4 / math.sqrt(3))
    assert c.attn_scale == pytest.approx(1 / math.sqrt(24)) and c.rope_mscale == 1.0
    cache = m.new_cache(16)
    assert cache.k[0].shape == (1, 16, 32 + 8) and cache.v is cache.k
    assert load_model(_file(synthetic_model, "f32", VLEN), cpu_kernels).config.v_head_dim == 24


def _moved(model, ref, n_ctx=32) -> float:
    out = model.forward(np.array(TOKENS, np.int32), model.new_cache(n_ctx), all_logits=True)
    return float(np.abs(out - ref).max() / ref.std())


def test_each_part_matters(synthetic_model, cpu_kernels):
    """Each fixed scalar, the NeoX layout and RoPE on the tail of the head move the logits far off llama.cpp's."""
    path = _file(synthetic_model, "f32", PLAIN)
    ref = llama_cpp_logits(path, TOKENS)
    for change in (dict(embd_scale=1.0), dict(residual_scale=1.0), dict(logit_scale=1.0), dict(rope_neox=False)):
        assert _moved(load_model(path, cpu_kernels, **change), ref) > 0.3, change
    head_start = load_model(path, cpu_kernels)
    head_start.rope_at = 0
    assert _moved(head_start, ref) > 0.3


@pytest.mark.parametrize("n_ctx,which", [(32, "short"), (512, "long")])
def test_longrope_matches_llama_cpp(synthetic_model, cpu_kernels, n_ctx, which):
    path = _file(synthetic_model, "f32", LONGROPE)
    model = load_model(path, cpu_kernels)
    assert model.rope_factors_for(n_ctx) == which and model.config.rope_mscale == pytest.approx(1.3)
    ref = llama_cpp_logits(path, TOKENS, n_ctx=n_ctx)
    assert _moved(model, ref, n_ctx) < 0.01
    assert _moved(model, ref, 512 if n_ctx == 32 else 32) > 0.3  # the other factor set
    assert _moved(load_model(path, cpu_kernels, rope_mscale=1.0), ref, n_ctx) > 0.3
    # one token at a time with these factors (and back after the other set) gives the batch's logits
    batch = model.forward(np.array(TOKENS, np.int32), model.new_cache(n_ctx), all_logits=True)
    cache = model.new_cache(n_ctx)
    steps = np.stack([model.forward(np.array([t], np.int32), cache) for t in TOKENS])
    np.testing.assert_allclose(steps, batch, rtol=0, atol=1e-4 * ref.std())


@pytest.mark.parametrize("edit,err,match", [
    ({"minicpm3.attention.q_lora_rank": None}, ModelFileError, "q_lora_rank"),
    ({"minicpm3.rope.dimension_count": None}, ModelFileError, "rope.dimension_count"),
    ({"minicpm3.rope.dimension_count": 24}, ModelFileError, "must leave 1..23 unrotated"),
    ({"minicpm3.expert_count": 4}, UnsupportedError, "minicpm3 files with experts"),
    ({"minicpm3.rope.scaling.type": "yarn", "minicpm3.rope.scaling.factor": 4.0}, UnsupportedError, "YaRN"),
], ids=["no-q-rank", "no-n-rot", "n-rot-whole-head", "experts", "yarn"])
def test_bad_metadata(synthetic_model, tmp_path, edit, err, match):
    bad = rewrite_gguf(_file(synthetic_model, "f32", PLAIN), tmp_path / "bad.gguf", edit)
    with pytest.raises(err, match=match):
        load(bad, threads=1)


def test_info(synthetic_model):
    text = info_text(_file(synthetic_model, "f32", PLAIN), width=200)
    assert "embeddings x12" in text and "logits / 0.25" in text and "latent attention (MLA): cache 32 + 8" in text


def test_q4_k_m_file_from_llama_cpp_quantizer(synthetic_model, tmp_path):
    """llama.cpp's own Q4_K_M of a minicpm3 file (Q4_K / Q6_K matrices, as downloads are): loaded with no
    conversion, it matches llama.cpp (measured 0.077 of the spread); steps equal the batch."""
    import llama_cpp

    from powerinfer_py.gguf import open_gguf

    src = synthetic_model("minicpm3", "f32", n_embd=256, n_ff=256, q_lora=256, kv_lora=256)
    path = llama_cpp_quantized(src, tmp_path / "q4_k_m.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    assert {t.type.name for t in open_gguf(path).tensors.values()} >= {"Q4_K", "Q6_K"}
    assert_matches_llama_cpp(path, TOKENS, 0.12, same_top1=False)
