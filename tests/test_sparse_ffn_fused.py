"""The fused one-token predictor FFN step (csrc/step_ffn.c): bit-identical to the separate kernels run in
ffn.py's order, close to the numpy reference of docs/FORMATS.md section 2, and what FFN uses for one token."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py.layers import ffn as ffn_module
from powerinfer_py.layers.ffn import FFN, FFNWeights, SparseSettings, transposed_predictor
from powerinfer_py.kernels import ref
from powerinfer_py.gguf.types import GGMLType, Tensor

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

N_EMBD, N_FF, RANK = 96, 230, 64  # n_ff not a multiple of 16 or 64: the tails run
TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0)
TYPES += (GGMLType.Q4_1, GGMLType.Q5_1)  # quantizable 32-blocks with a min (IQ4_NL: not produced by quantize)


@pytest.fixture(scope="module")
def pools():
    ks = {n: cpu.CpuKernels(n) for n in (1, 2)}
    yield ks
    for k in ks.values():
        k.close()


def weight(name, ggml_type, n_rows, n_cols, rng, scale=1.0) -> Tensor:
    w = (rng.standard_normal((n_rows, n_cols)) * scale).astype(np.float32)
    return Tensor(name, ggml_type, (n_rows, n_cols), ref.quantize(w, ggml_type))


def layer(ggml_type, seed=0) -> FFNWeights:
    rng = np.random.default_rng(seed)
    return FFNWeights(up=weight("ffn_up", ggml_type, N_FF, N_EMBD, rng),
                      gate=weight("ffn_gate", ggml_type, N_FF, N_EMBD, rng),
                      down_t=weight("ffn_down_t", ggml_type, N_FF, N_EMBD, rng),
                      fc1=weight("fc1", ggml_type, RANK, N_EMBD, rng, 0.3),
                      fc2=weight("fc2", ggml_type, N_FF, RANK, rng, 0.3))


def predictor_logits(k, w: FFNWeights, p, fc2_t=None):
    """fc2 · relu(fc1 · p) by the kernels: the dense mat-vec, or with fc2_t the AXPY over the non-zero hidden
    units when they are at most PI_FC2_AXPY_MAX_PERCENT of the rank."""
    r = np.maximum(k.matmul(w.fc1, p), 0)
    nz = k.select_nonzero(r)
    if fc2_t is not None and len(nz) * 100 <= RANK * cpu.lib.PI_FC2_AXPY_MAX_PERCENT:
        if isinstance(fc2_t, ref.FC2T):  # a Q4_0 / Q8_0 fc2's copy by hidden unit
            return k.fc2t_logits(fc2_t, r)
        return k.axpy_rows(fc2_t, nz, r[nz]) if len(nz) else np.zeros(N_FF, np.float32)
    return k.matmul(w.fc2, r)


def separate_kernels(k, w: FFNWeights, variant, x, p, threshold, act_param, fc2_t=None):
    """The unfused steps, one kernel call each, as ffn.py runs them for one token."""
    rows = k.select_active(predictor_logits(k, w, p, fc2_t), threshold)
    a = k.matmul_rows(w.gate, rows, x) if len(rows) else np.zeros(0, np.float32)
    a = np.where(a > act_param, a, np.float32(0)) if variant == "fatreglu" else np.maximum(a, 0)
    live = k.select_nonzero(a)
    rows, a = rows[live], a[live]
    u = k.matmul_rows(w.up, rows, x) if len(rows) else np.zeros(0, np.float32)
    h = a * (np.maximum(u, 0) if variant == "dreglu" else u)
    y = k.axpy_rows(w.down_t, rows, h) if len(rows) else np.zeros(N_EMBD, np.float32)
    return y, int(np.count_nonzero(h))


def reference(w: FFNWeights, variant, x, active, act_param):
    """docs/FORMATS.md section 2 in numpy (float64 products of the dequantized weights) for the given active set
    (the predictor's logits are compared with the kernels' separately: a quantized product may move a
    neuron across the threshold)."""
    d = {nm: ref.dequantize(getattr(w, nm)).astype(np.float64) for nm in ("gate", "up", "down_t")}
    g = d["gate"] @ ref.operand(w.gate, x)  # BF16: the inputs rounded to bf16, as every kernel does
    a = np.where(g > act_param, g, 0) if variant == "fatreglu" else np.maximum(g, 0)
    u = d["up"] @ ref.operand(w.up, x)
    h = np.where(active, a * (np.maximum(u, 0) if variant == "dreglu" else u), 0)
    return ref.operand(w.down_t, h.astype(np.float32)) @ d["down_t"]


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["reglu", "fatreglu", "dreglu"])
def test_fused_equals_separate_kernels(pools, ggml_type, variant):
    w = layer(ggml_type)
    rng = np.random.default_rng(1)
    act_param = 0.25 if variant == "fatreglu" else 0.0
    for n_threads, k in pools.items():
        for trial in range(3):
            x = rng.standard_normal(N_EMBD).astype(np.float32)
            p = rng.standard_normal(N_EMBD).astype(np.float32)
            logits = k.matmul(w.fc2, np.maximum(k.matmul(w.fc1, p), 0))
            srt = np.sort(logits)
            threshold = float((srt[int(0.7 * N_FF)] + srt[int(0.7 * N_FF) + 1]) / 2)  # ~30% active, no tie
            plan = k.steps.sparse_ffn_plan(variant, w.fc1, w.fc2, w.gate, w.up, w.down_t, threshold, act_param)
            y, n_active, n_nonzero = k.steps.sparse_ffn_decode(plan, x, p)
            y_sep, nz_sep = separate_kernels(k, w, variant, x, p, threshold, act_param)
            assert np.array_equal(y.view(np.uint32), y_sep.view(np.uint32)), (n_threads, trial)
            assert n_active == int(np.count_nonzero(logits >= threshold)) and n_nonzero == nz_sep
            assert 0 < n_nonzero < n_active  # the gate really zeroes some predicted neurons
            y_ref = reference(w, variant, x.astype(np.float64), logits >= threshold, act_param)
            d = {nm: ref.dequantize(getattr(w, nm)).astype(np.float64) for nm in ("fc1", "fc2")}
            logits_ref = d["fc2"] @ np.maximum(d["fc1"] @ p, 0)
            assert np.abs(logits - logits_ref).max() <= 0.05 * np.abs(logits_ref).max()
            if ggml_type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):  # exact up to f32 rounding
                np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4 * np.abs(y_ref).max())
            else:  # activations quantized to Q8_0 for the dot products, as llama.cpp does
                assert np.abs(y - y_ref).max() <= 0.05 * np.abs(y_ref).max()


def test_transposed_predictor_types(pools):
    """The transposed fc2 copy exists for float types, with the same values, and for Q4_0 / Q8_0 as a copy by
    hidden unit (the same codes and scales) when the kernels can make one; other quantized blocks would need
    re-quantizing along the other axis: other values, other predictions."""
    assert ffn_module.FC2_AXPY_MAX_PERCENT == cpu.lib.PI_FC2_AXPY_MAX_PERCENT  # Python and C choose alike
    for ty in TYPES:
        w = layer(ty)
        t = transposed_predictor(w.fc2, pools[2])
        if ty in (GGMLType.Q4_0, GGMLType.Q8_0):
            assert isinstance(t, ref.FC2T) and (t.type, t.n_ff, t.rank) == (ty, N_FF, RANK)
            assert transposed_predictor(w.fc2) is None  # no kernels to pack it
            codes, d = ref.fc2t_unpack(t)
            dw, qw = ref._blocks(w.fc2)
            assert np.array_equal(d, dw) and np.array_equal(codes, qw.reshape(N_FF, RANK))
            continue
        if ty not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
            assert t is None
            continue
        assert t.type == ty and t.shape == (RANK, N_FF)
        assert np.array_equal(ref.dequantize(t).reshape(RANK, N_FF), ref.dequantize(w.fc2).reshape(N_FF, RANK).T)
    assert transposed_predictor(None) is None


@pytest.mark.parametrize("ggml_type", (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q8_0),
                         ids=lambda t: t.name)
def test_fused_with_transposed_fc2(pools, ggml_type):
    """With fc2_t the step takes the AXPY over the non-zero hidden units (Q4_0 / Q8_0: fc2t_logits on the copy)
    when they are few enough (random weights: about half), else the dense fc2 mat-vec; either way the bits of
    the separate kernels, and logits close to the dense ones."""
    w = layer(ggml_type, seed=11)
    rng = np.random.default_rng(2)
    paths = set()
    for n_threads, k in pools.items():
        fc2_t = transposed_predictor(w.fc2, k)
        assert fc2_t is not None
        for trial in range(4):
            p = rng.standard_normal(N_EMBD).astype(np.float32)
            if trial == 3:  # every hidden unit positive: a large shared component along a vector all rows like
                bias = ref.dequantize(w.fc1).reshape(RANK, N_EMBD).sum(0)
                p = (p * 0.01 + bias / np.linalg.norm(bias) * 50).astype(np.float32)
            x = rng.standard_normal(N_EMBD).astype(np.float32)
            r = np.maximum(k.matmul(w.fc1, p), 0)
            axpy = np.count_nonzero(r) * 100 <= RANK * cpu.lib.PI_FC2_AXPY_MAX_PERCENT
            paths.add(axpy)
            logits = predictor_logits(k, w, p, fc2_t)
            dense = k.matmul(w.fc2, r)
            np.testing.assert_allclose(logits, dense, rtol=1e-5, atol=1e-5 * np.abs(dense).max())
            if not axpy:
                assert np.array_equal(logits.view(np.uint32), dense.view(np.uint32))
            srt = np.sort(logits)
            threshold = float((srt[int(0.7 * N_FF)] + srt[int(0.7 * N_FF) + 1]) / 2)
            plan = k.steps.sparse_ffn_plan("reglu", w.fc1, w.fc2, w.gate, w.up, w.down_t, threshold, fc2_t=fc2_t)
            y, n_active, _ = k.steps.sparse_ffn_decode(plan, x, p)
            y_sep, _ = separate_kernels(k, w, "reglu", x, p, threshold, 0.0, fc2_t)
            assert np.array_equal(y.view(np.uint32), y_sep.view(np.uint32)), (n_threads, trial)
            assert n_active == int(np.count_nonzero(logits >= threshold))
    assert paths == {True, False}, "both the AXPY and the dense fc2 path must have run"


def test_fused_edge_cases(pools):
    w = layer(GGMLType.Q4_0, seed=3)
    k = pools[2]
    x = np.ones(N_EMBD, np.float32)
    none = k.steps.sparse_ffn_plan("reglu", w.fc1, w.fc2, w.gate, w.up, w.down_t, 1e30)  # nothing predicted
    y, n_active, n_nonzero = k.steps.sparse_ffn_decode(none, x, x)
    assert (n_active, n_nonzero) == (0, 0) and not y.any()
    dead = k.steps.sparse_ffn_plan("fatreglu", w.fc1, w.fc2, w.gate, w.up, w.down_t, -1e30, act_param=1e30)
    y, n_active, n_nonzero = k.steps.sparse_ffn_decode(dead, x, x)  # all predicted, every activation cut to 0
    assert (n_active, n_nonzero) == (N_FF, 0) and not y.any()


def test_fused_bad_input(pools):
    w = layer(GGMLType.F16)
    k = pools[1]
    with pytest.raises(ValueError, match="fc2 has"):
        k.steps.sparse_ffn_plan("reglu", w.fc1, w.fc1, w.gate, w.up, w.down_t, 0.0)
    with pytest.raises(ValueError, match="variant 'swiglu'"):
        k.steps.sparse_ffn_plan("swiglu", w.fc1, w.fc2, w.gate, w.up, w.down_t, 0.0)
    plan = k.steps.sparse_ffn_plan("reglu", w.fc1, w.fc2, w.gate, w.up, w.down_t, 0.0)
    with pytest.raises(ValueError, match="x must be"):
        k.steps.sparse_ffn_decode(plan, np.ones(N_EMBD + 1, np.float32), np.ones(N_EMBD, np.float32))
    with pytest.raises(ValueError, match="p must be"):
        k.steps.sparse_ffn_decode(plan, np.ones(N_EMBD, np.float32), np.ones(N_EMBD, np.float64))


@pytest.mark.parametrize("ggml_type", (GGMLType.Q8_0, GGMLType.F16, GGMLType.Q4_0), ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["reglu", "dreglu"])
def test_ffn_one_token_uses_the_fused_step(pools, variant, ggml_type):
    """FFN's one-token predictor path goes through C and gives what its Python path gives (F16: both with the
    transposed fc2 and its AXPY over the non-zero hidden units; Q4_0 / Q8_0: both with its copy by hidden unit)."""
    w = layer(ggml_type, seed=5)
    k = pools[2]
    ffn = FFN(k, w, variant, SparseSettings("predictor", 0.5))
    assert ffn.fused is not None
    assert ffn.fc2_t is not None
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, N_EMBD)).astype(np.float32)
    p = rng.standard_normal((1, N_EMBD)).astype(np.float32)
    y_fused = ffn(x, p)
    ffn.fused = None  # the Python path
    y_python = ffn(x, p)
    assert y_fused.shape == (1, N_EMBD)
    assert np.array_equal(y_fused.view(np.uint32), y_python.view(np.uint32))


# ---- threshold mode (SwiGLU/GeGLU): the one-token step in C against threshold.py's Python path ------------

@pytest.mark.parametrize("ggml_type", (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0), ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["swiglu", "geglu"])
@pytest.mark.parametrize("down", ["dense", "transposed"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled"])
def test_threshold_step_equals_python_path(pools, ggml_type, variant, down, scaled):
    rng = np.random.default_rng(9)
    w = FFNWeights(up=weight("ffn_up", ggml_type, 256, N_EMBD, rng),
                   gate=weight("ffn_gate", ggml_type, 256, N_EMBD, rng),
                   down=weight("ffn_down", ggml_type, N_EMBD, 256, rng))
    scales = (tuple(rng.uniform(0.5, 2.0, 256).astype(np.float32)),) if scaled else ()
    for k in pools.values():
        x = rng.standard_normal((1, N_EMBD)).astype(np.float32)
        pre = k.matmul(w.gate, x)[0]
        act = k.silu(pre) if variant == "swiglu" else k.gelu(pre)
        score = np.abs(act) * (np.asarray(scales[0], np.float32) if scaled else np.float32(1))
        cut = float(np.sort(score)[102] + np.sort(score)[103]) / 2  # ~60% kept, no tie
        ffn = FFN(k, w, variant, SparseSettings("threshold", 0.0, 0.4, (cut,), down, scales=scales))
        path = ffn.threshold_path
        assert path.fused is not None and (path.down_t is not None) == (down == "transposed")
        y_fused = ffn(x)
        path.fused = None
        y_python = ffn(x)
        assert np.array_equal(y_fused.view(np.uint32), y_python.view(np.uint32))
        kept = int(np.count_nonzero(score >= cut))
        assert 0 < kept < 256


@pytest.mark.parametrize("ggml_type", (GGMLType.F32, GGMLType.Q8_0, GGMLType.Q4_0), ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["swiglu", "geglu"])
def test_dense_step_equals_python_path(pools, ggml_type, variant):
    """`off` on an ordinary SwiGLU/GeGLU file: the one-token C call gives the separate kernels' bits."""
    rng = np.random.default_rng(13)
    w = FFNWeights(up=weight("ffn_up", ggml_type, 256, N_EMBD, rng),
                   gate=weight("ffn_gate", ggml_type, 256, N_EMBD, rng),
                   down=weight("ffn_down", ggml_type, N_EMBD, 256, rng))
    for k in pools.values():
        ffn = FFN(k, w, variant, SparseSettings("off", 0.0))
        assert ffn.fused_dense is not None
        x = rng.standard_normal((1, N_EMBD)).astype(np.float32)
        y_fused = ffn(x)
        ffn.fused_dense = None
        y_python = ffn(x)
        assert np.array_equal(y_fused.view(np.uint32), y_python.view(np.uint32)) and np.abs(y_python).max() > 0
    with pytest.raises(ValueError, match="transposed"):
        plan = pools[1].steps.threshold_ffn_plan("silu", w.gate, w.up,
                                                 weight("ffn_down_t", ggml_type, 256, N_EMBD, rng), True, 0.5)
        pools[1].steps.dense_ffn_decode(plan, np.zeros(N_EMBD, np.float32))


@pytest.mark.parametrize("ggml_type", (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0), ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["reglu", "fatreglu", "dreglu"])
def test_exact_step_equals_python_path_and_off(pools, ggml_type, variant):
    """`exact` on a PWRI layer: the one-token C call gives the Python path's bits, and both give `off`'s (the
    AXPY over every row, zeros skipped)."""
    w = layer(ggml_type, seed=17)
    w.fc1 = w.fc2 = None  # exact mode needs no predictor
    act_param = 0.25 if variant == "fatreglu" else 0.0
    rng = np.random.default_rng(18)
    for k in pools.values():
        x = rng.standard_normal((1, N_EMBD)).astype(np.float32)
        ffn = FFN(k, w, variant, SparseSettings("exact", 0.0), act_param=act_param)
        assert ffn.fused is not None
        y_fused = ffn(x)
        ffn.fused = None
        y_python = ffn(x)
        y_off = FFN(k, w, variant, SparseSettings("off", 0.0), act_param=act_param)(x)
        assert np.array_equal(y_fused.view(np.uint32), y_python.view(np.uint32))
        assert np.array_equal(y_fused.view(np.uint32), y_off.view(np.uint32)) and np.abs(y_off).max() > 0


def test_step_timing_sums(pools):
    """The step's timing sums (pi_sparse_ffn.timing, for benchmarks): one call each, predictor time within the
    step's, the hidden layer's non-zero share as counted here; exact mode runs no predictor."""
    w = layer(GGMLType.Q4_0, seed=9)
    k = pools[2]
    ffn = FFN(k, w, "reglu", SparseSettings("predictor", 0.5))
    assert ffn.step_timing() is ffn.fused.timing and not ffn.step_timing().any()
    rng = np.random.default_rng(4)
    shares = []
    for _ in range(3):
        x = rng.standard_normal((1, N_EMBD)).astype(np.float32)
        p = rng.standard_normal((1, N_EMBD)).astype(np.float32)
        ffn(x, p)
        shares.append(np.count_nonzero(np.maximum(k.matmul(w.fc1, p[0]), 0)) / RANK)
    calls, pred_s, step_s, hidden = ffn.step_timing()
    assert calls == 3 and 0 < pred_s < step_s < 10
    assert hidden == pytest.approx(sum(shares)) and 0 < hidden < 3
    exact = FFN(k, w, "reglu", SparseSettings("exact", 0.0))
    exact(x, p)
    calls, pred_s, step_s, hidden = exact.step_timing()
    assert (calls, pred_s, hidden) == (1, 0, 0) and step_s > 0
    ffn.fused = None  # the Python path keeps no timing
    assert ffn.step_timing() is None


def test_copy_read_up_to_the_bound(pools):
    """The Q4_0 / Q8_0 copies are read while at most FC2_AXPY_MAX_PERCENT of the hidden units are non-zero (50%
    and 80% of RANK = 64 here), not past it (90%): then the caller runs the dense mat-vec."""
    k = pools[2]
    rng = np.random.default_rng(6)
    for share, used in ((0.5, True), (0.8, True), (0.9, False)):
        r = np.abs(rng.standard_normal((1, RANK))).astype(np.float32) + np.float32(0.1)
        r[0, rng.permutation(RANK)[:round(RANK * (1 - share))]] = 0
        for ty in (GGMLType.Q4_0, GGMLType.Q8_0):
            fc2_t = transposed_predictor(layer(ty).fc2, k)
            got = ffn_module.predictor_logits(k, fc2_t, r)
            assert (got is not None) == used, (share, ty.name)
            if used:
                assert np.array_equal(got[0], k.fc2t_logits(fc2_t, r[0]))
