"""Gemma 4's one-token decode step: each attention block one C call (step_attn.c with the layer's own head dim,
heads, KV heads, RoPE and window, the weightless V norm, a layer without attn_v, layers sharing K/V), giving the
Python path's logits and KV cache bit for bit on the synthetic files of synth/gemma4.py (dense with and without
per-layer embeddings, F32 and Q8_0, and the mixture-of-experts shape), at 1 and 2 threads."""
from __future__ import annotations

import numpy as np
import pytest
from model_checks import assert_fused_decode_equals_python

from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.synth.gemma4 import write_gemma4_model

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

# 10 tokens: more than twice the window of 4, so the sliding layers drop keys during the steps
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270], np.int32)
VARIANTS = {"per-layer-embd": dict(per_layer=8), "no-per-layer-embd": dict(per_layer=0),
            "q8_0": dict(per_layer=8, dtype="q8_0"), "moe": dict(per_layer=0, n_expert=4, expert_scales=True)}


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"{n}threads")
def kernels(request):
    k = cpu.CpuKernels(n_threads=request.param)
    yield k
    k.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4-decode")
    return {name: write_gemma4_model(d / f"{name}.gguf", **kw) for name, kw in VARIANTS.items()}


def build(path, kernels):
    w = load_weights(open_gguf(path), expected_tensors)
    return build_model(w.config, w.tensors, kernels)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_decode_equals_python_path(files, kernels, variant):
    model = build(files[variant], kernels)
    plans = model.attn_plans()
    g = model.config.gemma4
    # the sharing layers (4, 5) compute no K/V; layer 1 has no attn_v (its values are its keys)
    assert [plans[il].desc.wk == cpu.ffi.NULL for il in range(6)] == [not g.has_kv(il) for il in range(6)]
    assert plans[1].desc.wv == cpu.ffi.NULL and plans[0].desc.wv != cpu.ffi.NULL
    assert [plans[il].head_dim for il in range(6)] == list(g.head_dim)
    assert_fused_decode_equals_python(model, TOKENS)


def test_plan_settings_reach_c(files, kernels):
    """The V norm, the window and the proportional RoPE factors change the fused step's logits when left out of
    the plans: the equality above is not vacuous."""
    model = build(files["no-per-layer-embd"], kernels)
    cache = model.new_cache(32)
    model.forward(TOKENS[:-1], cache)
    want = model.forward(TOKENS[-1:], _copy(model, cache, 9))
    plan_kwargs = model.attn_plan_kwargs
    for change in (dict(v_norm=False), dict(window=0), dict(rope_freqs=None)):
        model.attn_plan_kwargs = lambda il, L, ch=change: {**plan_kwargs(il, L), **ch}
        model._attn_plans = None
        got = model.forward(TOKENS[-1:], _copy(model, cache, 9))
        assert not np.allclose(got, want, rtol=0, atol=1e-3 * float(want.std())), change


def _copy(model, cache, n_past):
    """A fresh cache holding the first n_past positions of cache (the sharing layers keep sharing)."""
    out = model.new_cache(cache.n_ctx)
    for il in range(model.config.n_layer):
        if model.config.gemma4.has_kv(il):
            out.k[il][...] = cache.k[il]
            out.v[il][...] = cache.v[il]
    out.n_past = n_past
    return out


def test_plan_refuses_kv_tensors_without_wk(files, kernels):
    model = build(files["no-per-layer-embd"], kernels)
    L, L0, g = model.layers[4], model.layers[0], model.config.gemma4
    kw = dict(n_head=4, n_head_kv=g.n_head_kv[4], head_dim=g.head_dim[4], n_rot=g.n_rot[4], rope_base=1e4,
              rope_scale=1.0, rope_neox=True, eps=1e-6, attn_scale=1.0)
    with pytest.raises(ValueError, match="without wk"):
        kernels.steps.attn_block_plan(L.wq, None, L0.wv, L.wo, L.attn_norm, L.ffn_norm, **kw)
    plan = kernels.steps.attn_block_plan(L.wq, None, None, L.wo, L.attn_norm, L.ffn_norm, **kw)
    assert plan.desc.wk == cpu.ffi.NULL
