"""Gemma 3n's one-token decode step: each attention block one C call (step_attn.c with the weightless V norm and
the layers sharing K/V; AltUp, LAuReL and the FFN stay in Python), giving the Python path's logits and KV cache
bit for bit on synth/gemma3n.py's file (25 layers, layers 20..24 sharing K/V), F32 and Q8_0, at 1 and 2 threads,
with `--sparse exact` too."""
from __future__ import annotations

import numpy as np
import pytest
from model_checks import assert_fused_decode_equals_python

from powerinfer_py.layers.ffn import SparseSettings
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.synth.gemma3n import write_gemma3n_model

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

# 10 tokens: more than twice the window of 4, so the sliding layers drop keys during the steps
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270], np.int32)


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"{n}threads")
def kernels(request):
    k = cpu.CpuKernels(n_threads=request.param)
    yield k
    k.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma3n-decode")
    return {dtype: write_gemma3n_model(d / f"g3n-{dtype}.gguf", dtype=dtype) for dtype in ("f32", "q8_0")}


def build(path, kernels, sparse=None):
    w = load_weights(open_gguf(path), expected_tensors)
    return build_model(w.config, w.tensors, kernels, sparse)


@pytest.mark.parametrize("dtype,sparse", [("f32", None), ("q8_0", None), ("f32", "exact")])
def test_fused_decode_equals_python_path(files, kernels, dtype, sparse):
    model = build(files[dtype], kernels, SparseSettings(sparse, 0.0) if sparse else None)
    plans = model.attn_plans()
    g = model.config.gemma3n
    assert [p.desc.wk == cpu.ffi.NULL for p in plans] == [not g.has_kv(il) for il in range(model.config.n_layer)]
    assert not g.has_kv(24) and g.has_kv(19)
    assert_fused_decode_equals_python(model, TOKENS)


def test_plan_settings_reach_c(files, kernels):
    """Without the V norm or the window in the plans, the fused step's logits move: the equality is not vacuous."""
    model = build(files["f32"], kernels)
    cache = model.new_cache(32)
    model.forward(TOKENS[:-1], cache)
    saved = [(k.copy(), v.copy()) for k, v in zip(cache.k, cache.v)]

    def step():
        for il, (k, v) in enumerate(saved):
            cache.k[il][...] = k
            cache.v[il][...] = v
        cache.n_past = len(TOKENS) - 1
        return model.forward(TOKENS[-1:], cache)

    want = step()
    plan_kwargs = model.attn_plan_kwargs
    for change in (dict(v_norm=False), dict(window=0)):
        model.attn_plan_kwargs = lambda il, L, ch=change: {**plan_kwargs(il, L), **ch}
        model._attn_plans = None
        assert not np.allclose(step(), want, rtol=0, atol=1e-3 * float(want.std())), change
