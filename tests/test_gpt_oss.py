"""gpt-oss (GGUF arch "gpt-oss"): the attention-sink kernels against their numpy reference, swiglu_oai and the
after-top-k routing against direct formulas, the config read from metadata, synthetic files against llama.cpp,
one token at a time against a batch, and the one-call decode step against the Python path, bit for bit.

Every gpt-oss-specific piece shows against llama.cpp. Measured (benchmarks/bench_gptoss_mutations.py) on the
8-layer f32 file of
test_logits_match_llama_cpp (YaRN, window 4, 12 tokens) with one piece switched off, in units of the logits'
spread (the test's bound is 0.01; ours is off by 0.0025):
    no attention sinks                      4.2   (argmax agrees on 4 of 12 tokens)
    softmax over all experts before top-k   2.0   (10 of 12)
    no expert biases (gate, up, down)       3.1   (3 of 12)
    plain SwiGLU instead of swiglu_oai      3.3   (4 of 12)
    no router bias                          3.4   (2 of 12)
    no sliding window (all layers global)   3.4   (6 of 12)
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits

from powerinfer_py import load
from powerinfer_py.models import read_config
from powerinfer_py.errors import UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.layers.moe import MoEFFN, swiglu_oai
from powerinfer_py.synth import write_synthetic_model
from powerinfer_py.gguf.types import GGMLType, Tensor

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]  # 12 tokens: 3 windows of the synthetic 4
YARN = {"type": "yarn", "factor": 4.0, "original_context_length": 64}


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("head_dim", [64, 12], ids=["vector", "scalar"])
@pytest.mark.parametrize("window", [0, 3])
def test_attention_sinks_match_reference(n_threads, head_dim, window):
    """Sinks larger and smaller than the scores, groups of 4 query heads per kv head (the tiled path), a window:
    the C kernel matches the numpy reference, and a sink far below every score changes nothing."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((5, 8, head_dim), dtype=np.float32)
    kc = rng.standard_normal((2, 16, head_dim)).astype(np.float16)
    vc = rng.standard_normal((2, 16, head_dim)).astype(np.float16)
    sinks = (3.0 * rng.standard_normal(8)).astype(np.float32)
    k = CpuKernels(n_threads)
    try:
        got = k.attention(q, kc, vc, 4, window, 0.125, 0.0, sinks)
        np.testing.assert_allclose(got, ref.attention(q, kc, vc, 4, window, 0.125, 0.0, sinks), rtol=0, atol=2e-6)
        plain = k.attention(q, kc, vc, 4, window, 0.125)
        assert np.abs(got - plain).max() > 0.1  # the sinks matter at this size
        low = k.attention(q, kc, vc, 4, window, 0.125, 0.0, np.full(8, -1e4, np.float32))
        np.testing.assert_array_equal(low, plain)
        with pytest.raises(ValueError, match="sinks"):
            k.attention(q, kc, vc, 4, window, 0.125, 0.0, sinks[:4])
    finally:
        k.close()


def test_swiglu_oai_formula():
    """Clamp of the gate from above only, of up on both sides, alpha 1.702, up + 1 (float64 formula)."""
    g = np.array([-20.0, -1.0, 0.0, 0.5, 6.9, 7.0, 30.0], np.float32)
    u = np.array([-9.0, -7.5, -1.0, 0.0, 3.0, 7.0, 8.0], np.float32)
    g64, u64 = np.minimum(g, 7.0).astype(np.float64), np.clip(u, -7.0, 7.0).astype(np.float64)
    want = g64 / (1.0 + np.exp(-1.702 * g64)) * (u64 + 1.0)
    np.testing.assert_allclose(swiglu_oai(g, u), want, rtol=1e-6, atol=1e-7)


def test_routing_softmaxes_the_chosen_logits_after_top_k():
    """router · x + bias, the n_used largest, their weights a softmax over those n_used logits only."""
    rng = np.random.default_rng(2)
    E, n_embd, F = 6, 8, 4
    router = Tensor("r", GGMLType.F32, (E, n_embd), rng.standard_normal((E, n_embd), dtype=np.float32))
    exps = Tensor("e", GGMLType.F32, (E, F, n_embd), np.zeros((E, F, n_embd), np.float32))
    down = Tensor("d", GGMLType.F32, (E, n_embd, F), np.zeros((E, n_embd, F), np.float32))
    bias = rng.standard_normal(E, dtype=np.float32)
    f = MoEFFN(ref.RefKernels(), router, exps, exps, down, 3, False, router_bias=bias, weights_after_topk=True)
    x = rng.standard_normal((5, n_embd), dtype=np.float32)
    chosen, w = f.route(x)
    logits = x.astype(np.float64) @ router.data.T.astype(np.float64) + bias
    for t in range(5):
        top = np.argsort(-logits[t])[:3]
        np.testing.assert_array_equal(chosen[t], top)
        e = np.exp(logits[t, top] - logits[t, top].max())
        np.testing.assert_allclose(w[t], e / e.sum(), rtol=1e-5)


def test_config(tmp_path):
    """Even layers slide (llama.cpp's fixed period 2), NeoX RoPE, YaRN factors, experts' width from
    expert_feed_forward_length; a separate RoPE base for the window layers is refused."""
    path = write_synthetic_model(tmp_path / "g.gguf", "gpt-oss", n_layer=4, n_ff_exp=48, rope_scaling=YARN)
    with open_gguf(path) as f:
        c = read_config(f)
    assert c.swa_layers == (True, False, True, False) and c.sliding_window == 4
    assert c.rope_neox and c.n_expert == 4 and c.n_expert_used == 2 and c.n_ff_exp == 48
    assert c.rope_factors and max(c.rope_factors) == pytest.approx(4.0) and not c.expert_weights_norm
    from powerinfer_py.gguf.writer import write_gguf
    with open_gguf(path) as f:
        meta = dict(f.metadata)
        meta["gpt-oss.rope.freq_base_swa"] = 10_000.0
        tensors = list(f.tensors.values())
        bad = write_gguf(tmp_path / "bad.gguf", meta, tensors)
    with open_gguf(bad) as f, pytest.raises(UnsupportedError, match="freq_base_swa|own RoPE base"):
        read_config(f)


def _ours(path, tokens=TOKENS) -> tuple[np.ndarray, np.ndarray]:
    with load(path, threads=2) as llm:
        net = llm.model
        batch = net.forward(np.array(tokens, np.int32), net.new_cache(64), all_logits=True)
        cache = net.new_cache(64)
        step = np.stack([net.forward(np.array([t], np.int32), cache) for t in tokens])
    return batch, step


@pytest.mark.parametrize("dtype,n_layer,tol", [("f32", 8, 0.01), ("q8_0", 4, 0.12)])
def test_logits_match_llama_cpp(tmp_path, dtype, n_layer, tol):
    """The whole block (sinks, window layers, biases, YaRN, routing, swiglu_oai) against llama.cpp on the same
    file; one token at a time (the fused C step) against the batch. Tolerances as tests/test_moe.py's; q8_0 at
    4 layers: llama.cpp rounds each matmul's input to 8 bits, which adds up to 0.11 of the spread at 8 layers."""
    path = write_synthetic_model(tmp_path / f"g-{dtype}.gguf", "gpt-oss", dtype=dtype, n_layer=n_layer,
                                 rope_scaling=YARN)
    want = llama_cpp_logits(path, TOKENS)
    batch, step = _ours(path)
    spread = float(want.std())
    assert np.abs(batch - want).max() < tol * spread
    if dtype == "f32":
        assert (batch.argmax(1) == want.argmax(1)).all()
    np.testing.assert_allclose(step, batch, rtol=0, atol=1e-4 * spread)


def test_fused_decode_is_the_python_path(tmp_path):
    """step_attn.c with the output bias and the sinks gives the Python path's bits, token after token."""
    path = write_synthetic_model(tmp_path / "g.gguf", "gpt-oss", n_layer=4)
    out = {}
    for fused in (True, False):
        with load(path, threads=2) as llm:
            net = llm.model
            net.fused_attention = fused
            cache = net.new_cache(32)
            out[fused] = np.stack([net.forward(np.array([t], np.int32), cache) for t in TOKENS])
            assert (net.attn_plans() is not None) == fused
    np.testing.assert_array_equal(out[True], out[False])
