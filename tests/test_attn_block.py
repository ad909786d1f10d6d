"""The one-call attention block for one-token decode steps (csrc/step_attn.c): bit-identical to the Python
paths of models/llama.py, gemma3.py, qwen2.py and qwen3.py (logits and KV cache), and its inputs checked."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455]


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"{n}threads")
def kernels(request):
    k = cpu.CpuKernels(n_threads=request.param)
    yield k
    k.close()


def load(path, kernels):
    w = load_weights(open_gguf(path), expected_tensors)
    return build_model(w.config, w.tensors, kernels)


def decode_all(model, fused: bool, n_prompt: int = 3):
    """Logits of every step: a prompt of n_prompt tokens in one batch, then the rest one token at a time."""
    model.fused_attention = fused
    cache = model.new_cache(32)
    out = [model.forward(TOKENS[:n_prompt], cache)]
    out += [model.forward(TOKENS[i:i + 1], cache) for i in range(n_prompt, len(TOKENS))]
    return out, cache


@pytest.mark.parametrize("arch,dtype", [("llama", "f32"), ("llama", "f16"), ("llama", "q8_0"), ("llama", "q4_0"),
                                        ("gemma3", "f32"), ("gemma3", "q8_0"), ("qwen2", "f32"), ("qwen2", "q4_0"),
                                        ("qwen3", "f32"), ("qwen3", "q8_0")])
def test_fused_attention_equals_python_path(synthetic_model, kernels, arch, dtype):
    """gemma3 adds per-head Q/K norms, the post-attention norm and sliding-window layers (a window of 4,
    shorter than the 8 positions decoded); qwen2 adds Q/K/V biases; qwen3 has the Q/K norms without the rest,
    and head_dim != n_embd / n_head."""
    model = load(synthetic_model(arch, dtype, n_layer=3) if arch == "llama" else synthetic_model(arch, dtype), kernels)
    n_layer = model.config.n_layer
    assert model.attn_plans() is not None
    fused, cache_f = decode_all(model, True)
    python, cache_p = decode_all(model, False)
    assert model.attn_plans() is None  # switched off: the Python path ran
    for a, b in zip(fused, python):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    for il in range(n_layer):
        assert np.array_equal(cache_f.k[il], cache_p.k[il]) and np.array_equal(cache_f.v[il], cache_p.v[il])
    assert cache_f.n_past == cache_p.n_past == len(TOKENS)


def test_fused_attention_without_rope_and_mha(synthetic_model, kernels):
    """n_head_kv == n_head (no grouping) and the NeoX RoPE flag reach C unchanged: still the same bits."""
    model = load(synthetic_model("llama", "f32", n_head_kv=4, seed=3), kernels)
    model.config = dataclasses.replace(model.config, rope_neox=True)
    model._attn_plans = None
    fused, _ = decode_all(model, True)
    python, _ = decode_all(model, False)
    assert all(np.array_equal(a, b) for a, b in zip(fused, python))


def test_attn_block_bad_input(synthetic_model):
    k = cpu.CpuKernels(1)
    model = load(synthetic_model("llama", "f32"), k)
    plan = model.attn_plans()[0]
    cache = model.new_cache(8)
    n_embd = model.config.n_embd
    with pytest.raises(ValueError, match="x must be"):
        k.steps.attn_block_decode(plan, np.zeros(n_embd + 1, np.float32), 0, cache.k[0], cache.v[0])
    with pytest.raises(ValueError, match="outside the cache"):
        k.steps.attn_block_decode(plan, np.zeros(n_embd, np.float32), 8, cache.k[0], cache.v[0])
    with pytest.raises(ValueError, match="k_cache must be"):
        k.steps.attn_block_decode(plan, np.zeros(n_embd, np.float32), 0, cache.k[0].astype(np.float32), cache.v[0])
    L = model.layers[0]
    c = model.config
    with pytest.raises(ValueError, match="wk has"):
        k.steps.attn_block_plan(L.wq, L.wq, L.wv, L.wo, L.attn_norm, L.ffn_norm, n_head=c.n_head, n_head_kv=c.n_head_kv,
                                head_dim=c.head_dim, n_rot=c.n_rot, rope_base=10000.0, rope_scale=1.0, rope_neox=False,
                                eps=1e-5, attn_scale=0.125)
    k.close()
