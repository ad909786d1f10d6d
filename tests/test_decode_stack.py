"""One token through the whole stack of layers in one C call (csrc/step_stack.c, models/base.py _decode_stack):
the same logits, KV cache and sparsity counts, bit for bit, as the per-layer C calls and as the Python path;
taken only where every layer's FFN has a one-call step (dense SwiGLU/GeGLU, predictor / exact, threshold) after
an attention block; its inputs checked."""
from __future__ import annotations

import numpy as np
import pytest
from test_attn_block import kernels, load  # noqa: F401  (kernels: the 1- and 2-thread fixture)

from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

TOKENS = [1, 332, 292, 263, 270, 270, 273, 455, 301, 299]


def decode_all(model, how: str, n_prompt: int = 3):
    """Logits of every step (a prompt of n_prompt tokens in one batch, then one token at a time) and the cache;
    how: "stack" (the one-call stack), "layers" (one C call per attention block and FFN) or "python"."""
    model.fused_attention = how != "python"
    if how == "layers":
        model._decode_stack = lambda plans: None  # an instance attribute shadows the method
    cache = model.new_cache(32)
    out = [model.forward(TOKENS[:n_prompt], cache)]
    out += [model.forward(TOKENS[i:i + 1], cache) for i in range(n_prompt, len(TOKENS))]
    model.__dict__.pop("_decode_stack", None)
    return out, cache


def assert_three_paths_agree(model, counts=()) -> dict:
    """Runs decode_all three ways and asserts that the stack and the per-layer calls give the Python path's logits
    and caches bit for bit, and its values of model.sparsity's arrays named in counts. Returns the Python path's
    counts by name."""
    runs = {}
    for how in ("stack", "layers", "python"):
        if counts:
            model.sparsity.reset()
        runs[how] = decode_all(model, how), {c: getattr(model.sparsity, c).copy() for c in counts}
    (ref, ref_cache), ref_counts = runs["python"]
    for how in ("stack", "layers"):
        (out, cache), got = runs[how]
        for a, b in zip(out, ref):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), how
        for il in range(model.config.n_layer):
            assert np.array_equal(cache.k[il], ref_cache.k[il]) and np.array_equal(cache.v[il], ref_cache.v[il])
        assert cache.n_past == len(TOKENS)
        for c in counts:
            assert got[c].tolist() == ref_counts[c].tolist(), (how, c)
    return ref_counts


@pytest.mark.parametrize("arch,dtype", [("llama", "f32"), ("llama", "f16"), ("llama", "q4_0"), ("gemma3", "f32"),
                                        ("gemma3", "q8_0"), ("gemma2", "f16"), ("qwen2", "f32"), ("qwen3", "q8_0"),
                                        ("olmo2", "f32"), ("smollm3", "q4_0")])
def test_stack_equals_layer_calls_and_python(synthetic_model, kernels, arch, dtype):
    """gemma2/3 and olmo2 add the post-FFN norm the stack applies in C (gemma: sliding-window layers too, a window
    of 4 against the 10 positions decoded; olmo2 no input norms); qwen2 Q/K/V biases; qwen3 Q/K norms; smollm3
    a layer without RoPE."""
    model = load(synthetic_model(arch, dtype), kernels)
    plans = model.attn_plans()
    assert plans is not None and model._decode_stack(plans) is not None  # the stack is taken here
    assert_three_paths_agree(model)


def test_stack_not_taken_where_a_layer_needs_python(synthetic_model, cpu_kernels):
    """An observer on one FFN (profile, calibrate), a model whose _ffn_out is not a norm (granite) and an FFN
    without the one-call dense step (ReLU family) keep the per-layer path; the observer sees the one-token step."""
    model = load(synthetic_model("llama", "f32"), cpu_kernels)
    plans = model.attn_plans()
    assert model._decode_stack(plans) is not None
    seen = []
    model.ffns[1].observer = lambda il, x, p, act: seen.append(il)
    assert model._decode_stack(plans) is None
    cache = model.new_cache(16)
    model.forward(TOKENS[:2], cache)
    model.forward(TOKENS[2:3], cache)
    assert seen == [1, 1]  # the prompt batch, then the one-token step through the per-layer path
    model.ffns[1].observer = None
    assert model._decode_stack(plans) is not None

    granite = load(synthetic_model("granite", "f32"), cpu_kernels)  # its _ffn_out scales the output
    assert granite.attn_plans() is not None
    assert granite.post_ffn_norms() is None and granite._decode_stack(granite.attn_plans()) is None

    model.ffns[0].fused_dense = None  # as a ReLU-family FFN has (no one-call dense step)
    assert model._decode_stack(plans) is None


def test_decode_stack_bad_input(synthetic_model, cpu_kernels):
    model = load(synthetic_model("llama", "f32"), cpu_kernels)
    plans = model.attn_plans()
    stack = model._decode_stack(plans)
    n_embd = model.config.n_embd
    cache = model.new_cache(8)
    x = np.zeros(n_embd, np.float32)
    with pytest.raises(ValueError, match="x must be a writable C-contiguous float32 array"):
        cpu_kernels.steps.decode_stack(stack, np.zeros(n_embd + 1, np.float32), 0, cache.k, cache.v)
    with pytest.raises(ValueError, match="position 8 is outside the cache"):
        cpu_kernels.steps.decode_stack(stack, x, 8, cache.k, cache.v)
    with pytest.raises(ValueError, match="cache planes for"):
        cpu_kernels.steps.decode_stack(stack, x, 0, cache.k[:-1], cache.v[:-1])
    bad_v = list(cache.v)
    bad_v[1] = bad_v[1].astype(np.float32)
    with pytest.raises(ValueError, match="layer 1's v cache plane"):
        cpu_kernels.steps.decode_stack(stack, x, 0, cache.k, bad_v)
    ffns = [f.fused_dense for f in model.ffns]
    with pytest.raises(ValueError, match="one attention plan, FFN plan, kind and post-norm entry per layer"):
        cpu_kernels.steps.decode_stack_plan(plans, ffns[:-1], [None] * len(plans), 1e-5)
    with pytest.raises(ValueError, match="layer 0's FFN plan is not a sparse step"):
        cpu_kernels.steps.decode_stack_plan(plans, ffns, [None] * len(plans), 1e-5, ["sparse"] * len(plans))
    with pytest.raises(ValueError, match="kind 'relu' is not one of dense, sparse, threshold"):
        cpu_kernels.steps.decode_stack_plan(plans, ffns, [None] * len(plans), 1e-5, ["relu"] * len(plans))
    with pytest.raises(ValueError, match="post-FFN norm must be float32"):
        cpu_kernels.steps.decode_stack_plan(plans, ffns, [np.ones(3, np.float32)] * len(plans), 1e-5)


def test_stack_keeps_no_cache_alive_and_follows_new_caches(synthetic_model, cpu_kernels):
    """The plan remembers the last cache's planes by weak reference only: a dropped cache is freed, and a new
    cache (other planes, another length) gets its own pointers and bounds."""
    import gc
    import weakref

    model = load(synthetic_model("llama", "f32"), cpu_kernels)
    cache = model.new_cache(8)
    model.forward(TOKENS[:2], cache)
    model.forward(TOKENS[2:3], cache)
    stack = model._decode_stack(model.attn_plans())
    assert stack is not None and stack._planes is not None  # the one-token step went through the stack
    plane = weakref.ref(cache.k[0])
    del cache
    gc.collect()
    assert plane() is None
    small = model.new_cache(4)
    model.forward(TOKENS[:3], small)
    model.forward(TOKENS[3:4], small)
    with pytest.raises(ValueError, match="position 4 is outside the cache"):
        cpu_kernels.steps.decode_stack(stack, np.zeros(model.config.n_embd, np.float32), 4, small.k, small.v)


@pytest.fixture(scope="module")
def tiny_sparse(tmp_path_factory):
    from reference_sparse import write_tiny_sparse

    folder = tmp_path_factory.mktemp("stack-sparse")
    return lambda arch, **kw: write_tiny_sparse(folder / f"{arch}-{len(list(folder.iterdir()))}.gguf", arch, **kw)


@pytest.mark.parametrize("arch,dtype,act,param", [("llama", "f32", None, None), ("llama", "q4_0", None, None),
                                                   ("llama", "f16", "fatrelu", 0.1), ("bamboo", "f32", None, None)])
@pytest.mark.parametrize("mode", ["predictor", "exact"])
def test_stack_with_sparse_ffns(tiny_sparse, kernels, arch, dtype, act, param, mode):
    """PWRI files in predictor and exact mode: the one-call stack gives the logits, caches and per-layer active /
    non-zero counts of the per-layer calls and of the Python path (the predictor reads the residual after the
    attention block in all three)."""
    from powerinfer_py.layers.ffn import resolve_sparse

    path = tiny_sparse(arch, dtype=dtype, hidden_act=act, hidden_act_param=param)
    w = load_weights(open_gguf(path), expected_tensors)
    model = build_model(w.config, w.tensors, kernels, resolve_sparse(w.config, mode, None))
    plans = model.attn_plans()
    stack = model._decode_stack(plans)
    assert stack is not None and stack.counted_layers == list(range(model.config.n_layer))
    ref = assert_three_paths_agree(model, ("active", "nonzero", "tokens"))
    assert (ref["tokens"] == len(TOKENS)).all() and (ref["active"] > 0).all()


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
@pytest.mark.parametrize("stages,down", [("one", "dense"), ("two", "dense"), ("two", "transposed")])
def test_stack_with_threshold_ffns(synthetic_model, kernels, tmp_path, arch, stages, down):
    """Calibrated files (threshold mode, one or two stages, the down projection dense or by a transposed copy):
    the stack gives the logits, caches and per-layer kept / non-zero / up-row counts of the per-layer calls and
    the Python path."""
    import dataclasses

    from powerinfer_py.tools.calibrate import calibrate
    from powerinfer_py.layers.ffn import resolve_sparse

    text = "The ferry left the harbour at dawn, its horn low over the water, and the gulls followed it. " * 6
    calibrate(synthetic_model(arch, "f32"), tmp_path / "cal.gguf", 0.5, text=text, n_tokens=200, ctx=64, threads=1,
              one_stage=stages == "one")
    w = load_weights(open_gguf(tmp_path / "cal.gguf"), expected_tensors)
    settings = dataclasses.replace(resolve_sparse(w.config, None, None), down=down)
    assert settings.mode == "threshold" and (len(settings.up_cuts) > 0) == (stages == "two")
    model = build_model(w.config, w.tensors, kernels, settings)
    stack = model._decode_stack(model.attn_plans())
    assert stack is not None and stack.kinds == ["threshold"] * model.config.n_layer
    ref = assert_three_paths_agree(model, ("active", "nonzero", "up_read", "tokens"))
    assert (ref["active"] > 0).all() and (ref["active"] < ref["tokens"] * model.ffns[0].n_ff).all()
    assert (ref["up_read"] > 0).all() == (stages == "two")
