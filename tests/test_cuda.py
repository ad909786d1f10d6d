"""CUDA kernels (csrc/cuda) against their numpy references.

Two kinds of tests:
  * always run (no GPU needed): the planar device layout decodes, in numpy, to ggml's dequantized values; the
    ABI header parses; the built library (if any) exports every declared function; the status message names
    the runtime's error when there is no device.
  * `pytest -m cuda` (skipped unless the library is built and a device answers): every kernel for every
    weight type on odd shapes, and the hybrid CUDA backend against the CPU run.
Tolerances: the kernels accumulate in f32 in another order than numpy's f64 reference, so dot products are
compared relative to sum |w| |x| (the size of the rounding) at 1e-5; the CPU Q8_0/Q4_0 kernels quantize x to
Q8_0 first (llama.cpp's scheme) while the CUDA kernels read f32 x, so those two differ by up to ~1% of the
sum of absolute products: the end-to-end comparison holds quantized models to that, F16 models to tokens.
"""
from __future__ import annotations

import numpy as np
import pytest
from fake_cuda import decode_planar, install

from powerinfer_py.kernels import cuda as C
from powerinfer_py.kernels import ref
from powerinfer_py.gguf.types import GGMLType, Tensor

TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0]


def _tensor(rng, n_rows, n_cols, ty) -> Tensor:
    x = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    return Tensor("w", ty, (n_rows, n_cols), ref.quantize(x, ty))


@pytest.mark.parametrize("ty", TYPES)
def test_planar_layout_decodes_to_ggml_values(ty):
    t = _tensor(np.random.default_rng(0), 7, 96, ty)
    buf = C.planar(t)
    assert buf.nbytes == t.nbytes
    np.testing.assert_array_equal(decode_planar(buf, int(ty), 7, 96), ref.dequantize(t))


def test_planar_rejects_types_and_rows_without_a_kernel():
    rng = np.random.default_rng(0)
    with pytest.raises(Exception, match="no CUDA kernel"):
        C.planar(_tensor(rng, 2, 32, GGMLType.Q5_0))
    with pytest.raises(Exception, match="multiple of 8"):
        C.planar(Tensor("w", GGMLType.F16, (2, 12), np.zeros((2, 12), np.float16)))


def test_header_parses_and_library_exports_every_function():
    from cffi import FFI
    ffi = FFI()
    ffi.cdef(C._cdef())
    names = [line.split("(")[0].split()[-1].lstrip("*") for line in C._cdef().splitlines()
             if line.startswith(("int ", "const char *"))]
    assert "pi_cuda_axpy_rows" in names and len(names) >= 18
    if not C.library_path().is_file():
        pytest.skip("the CUDA library is not built (make cuda)")
    lib = ffi.dlopen(str(C.library_path()))
    for name in names:
        assert getattr(lib, name) is not None  # resolves the symbol; no device needed


@pytest.mark.parametrize("dtype", ["f16", "q4_0"])
def test_cuda_device_half_glue_on_a_numpy_model_of_the_abi(tmp_path, monkeypatch, dtype):
    """The CUDA hybrid path end to end with fake_cuda's numpy kernels standing in for the library: arena,
    planar uploads, padding rows and the argument order of every call, against the CPU-only run."""
    from test_hybrid import _fixed_and_ffn

    import powerinfer_py
    from powerinfer_py.synth.sparse import SHAPES, write_sparse_model
    path, _ = write_sparse_model(tmp_path / "m.pwri", n_layer=2, dtype=dtype, n_sample=256, **SHAPES["tiny"])
    fixed, ffn = _fixed_and_ffn(path)
    prompt = [1, 17, 230, 45, 99, 3, 310, 77]
    with powerinfer_py.load(path, threads=1, n_ctx=64, backend="cpu") as llm:
        cpu_toks = list(llm.generate_tokens(prompt, max_tokens=8, temperature=0))
        llm.reset()
        cpu_logits = llm.model.forward(prompt, llm.cache)
    lib = install(monkeypatch)
    with powerinfer_py.load(path, threads=1, n_ctx=64, backend="cuda", vram_budget=(fixed + ffn // 2) / 2**30) as llm:
        assert llm.backend.running == "hybrid cuda"
        assert llm.backend.device.used <= llm.backend.plan.device_bytes <= llm.backend.plan.budget
        toks = list(llm.generate_tokens(prompt, max_tokens=8, temperature=0))
        llm.reset()
        logits = llm.model.forward(prompt, llm.cache)
        shares = llm.backend.lines()[-1]
    assert {"matvec_rows", "ffn_act", "axpy_rows"} <= set(lib.calls)
    assert "device" in shares and not shares.endswith(" 0.0%")
    if dtype == "f16":  # same weights, f64 numpy sums vs f32 C sums
        assert toks == cpu_toks
        np.testing.assert_allclose(logits, cpu_logits, rtol=1e-4, atol=1e-4 * np.abs(cpu_logits).max())
    else:  # the CPU quantizes x to Q8_0 for Q4_0 weights; the device (and this model of it) reads f32 x
        assert np.max(np.abs(logits - cpu_logits)) <= 2e-2 * np.abs(cpu_logits).max()


def test_status_names_the_reason():
    st = C.cuda_status()
    assert st.available or st.reason  # e.g. "no usable CUDA device: ... (CUDA error 35)" or "not built"


# ---- on a device ---------------------------------------------------------------------------------------------

@pytest.fixture
def dev():
    """A fresh 256 MiB arena per test (the arena only grows; closing it frees everything)."""
    st = C.cuda_status()
    if not st.available:
        pytest.skip(f"no CUDA device: {st.reason}")
    arena = C.Arena(256 << 20)
    yield arena
    arena.close()


def _put(a, arr):
    return a.upload(np.ascontiguousarray(arr))


def _get(a, ptr, shape, dtype=np.float32):
    out = np.empty(shape, dtype=dtype)
    a.download(ptr, out)
    a.sync()
    return out


def _f(a, p):
    return a.ffi.cast("float *", p)


def _i(a, p):
    return a.ffi.cast("int32_t *", p) if p is not None else a.ffi.NULL


def _close(got, w, x, rows=None):
    wd = ref.dequantize(w).astype(np.float64)
    if rows is not None:
        wd = wd[rows]
    want = wd @ x.astype(np.float64)
    scale = np.abs(wd) @ np.abs(x.astype(np.float64)) + 1e-30
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), np.max(np.abs(got - want) / scale)


@pytest.mark.cuda
@pytest.mark.parametrize("ty", TYPES)
@pytest.mark.parametrize("shape", [(1, 32), (37, 96), (301, 4096), (11008, 256)])
def test_matvec(dev, ty, shape):
    rng = np.random.default_rng(1)
    w = _tensor(rng, *shape, ty)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    pw, px, py = _put(dev, C.planar(w)), _put(dev, x), dev.alloc(4 * shape[0])
    for relu in (0, 1):
        dev.check(dev.lib.pi_cuda_matvec(int(ty), pw, *shape, _f(dev, px), _f(dev, py), relu, dev.stream), "matvec")
        got = _get(dev, py, shape[0])
        if relu:
            assert np.all(got >= 0)
        else:
            _close(got, w, x)


@pytest.mark.cuda
@pytest.mark.parametrize("ty", TYPES)
def test_matvec_rows_with_host_and_device_counts(dev, ty):
    rng = np.random.default_rng(2)
    w = _tensor(rng, 509, 256, ty)
    x = rng.standard_normal(256).astype(np.float32)
    rows = rng.permutation(509)[:77].astype(np.int32)  # any order
    pw, px, pr, py = _put(dev, C.planar(w)), _put(dev, x), _put(dev, rows), dev.alloc(4 * 77)
    dev.check(dev.lib.pi_cuda_matvec_rows(int(ty), pw, 509, 256, _i(dev, pr), 77, dev.ffi.NULL, _f(dev, px),
                                          _f(dev, py), dev.stream), "matvec_rows")
    _close(_get(dev, py, 77), w, x, rows)
    pn = _put(dev, np.array([40], np.int32))  # device count below the grid size: the rest stays untouched
    dev.check(dev.lib.pi_cuda_memset(py, 0, 4 * 77, dev.stream), "memset")
    dev.check(dev.lib.pi_cuda_matvec_rows(int(ty), pw, 509, 256, _i(dev, pr), 77, _i(dev, pn), _f(dev, px),
                                          _f(dev, py), dev.stream), "matvec_rows")
    got = _get(dev, py, 77)
    _close(got[:40], w, x, rows[:40])
    assert np.all(got[40:] == 0)


@pytest.mark.cuda
def test_predictor_and_select_active(dev):
    rng = np.random.default_rng(3)
    fc1, fc2 = _tensor(rng, 64, 128, GGMLType.F16), _tensor(rng, 3000, 64, GGMLType.F16)
    p = rng.standard_normal(128).astype(np.float32)
    bufs = [_put(dev, C.planar(fc1)), _put(dev, C.planar(fc2)), _put(dev, p)]
    hid, logits, act, n = dev.alloc(4 * 64), dev.alloc(4 * 3000), dev.alloc(4 * 3000), dev.alloc(4)
    dev.check(dev.lib.pi_cuda_predictor(1, bufs[0], 1, bufs[1], 64, 3000, 128, _f(dev, bufs[2]), 1.5,
                                        _f(dev, hid), _f(dev, logits), _i(dev, act), _i(dev, n), dev.stream), "pred")
    h = _get(dev, hid, 64)
    want_h = np.maximum(ref.dequantize(fc1).astype(np.float64) @ p, 0)
    np.testing.assert_allclose(h, want_h, rtol=1e-4, atol=1e-4)
    lg = _get(dev, logits, 3000)
    count = int(_get(dev, n, 1, np.int32)[0])
    np.testing.assert_array_equal(_get(dev, act, count, np.int32), ref.select_active(lg, 1.5))


@pytest.mark.cuda
def test_ffn_act_variants(dev):
    rng = np.random.default_rng(4)
    g, u, b = (rng.standard_normal(1000).astype(np.float32) for _ in range(3))
    pg, pu, pb, ph = _put(dev, g), _put(dev, u), _put(dev, b), dev.alloc(4000)
    want = {0: np.maximum(g, 0) * u, 1: np.where(g > 0.25, g, 0) * u, 2: np.maximum(g, 0) * np.maximum(u, 0),
            3: np.maximum(g + b, 0)}
    for variant, w in want.items():
        dev.check(dev.lib.pi_cuda_ffn_act(variant, _f(dev, pg), _f(dev, pu), _f(dev, pb), _f(dev, ph), 1000,
                                          dev.ffi.NULL, 0.25, dev.stream), "ffn_act")
        np.testing.assert_array_equal(_get(dev, ph, 1000), w.astype(np.float32))


@pytest.mark.cuda
@pytest.mark.parametrize("ty", TYPES)
@pytest.mark.parametrize("n_sel,splits", [(1, 64), (257, 64), (1000, 7), (3000, 1)])
def test_axpy_rows_no_lost_updates_no_dropped_tail(dev, ty, n_sel, splits):
    rng = np.random.default_rng(5)
    w = _tensor(rng, 3001, 4096, ty)
    rows = np.sort(rng.permutation(3001)[:n_sel]).astype(np.int32)
    h = rng.standard_normal(n_sel).astype(np.float32)
    h[::5] = 0
    pw, pr, ph = _put(dev, C.planar(w)), _put(dev, rows), _put(dev, h)
    part, py = dev.alloc(4 * 64 * 4096), dev.alloc(4 * 4096)
    runs = []
    for _ in range(2):
        dev.check(dev.lib.pi_cuda_axpy_rows(int(ty), pw, 3001, 4096, _i(dev, pr), n_sel, dev.ffi.NULL, _f(dev, ph),
                                            splits, _f(dev, part), _f(dev, py), dev.stream), "axpy")
        runs.append(_get(dev, py, 4096))
    assert np.array_equal(runs[0], runs[1])  # deterministic: no atomics
    wd = ref.dequantize(w).astype(np.float64)[rows]
    want = h.astype(np.float64) @ wd
    scale = np.abs(h.astype(np.float64)) @ np.abs(wd) + 1e-30
    assert np.all(np.abs(runs[0] - want) <= 1e-5 * scale)


@pytest.mark.cuda
def test_rmsnorm_rope_attention(dev):
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((3, 200)).astype(np.float32), rng.standard_normal(200).astype(np.float32)
    px, pw, py = _put(dev, x), _put(dev, w), dev.alloc(4 * 600)
    dev.check(dev.lib.pi_cuda_rmsnorm(_f(dev, px), _f(dev, pw), _f(dev, py), 3, 200, 1e-5, dev.stream), "rmsnorm")
    np.testing.assert_allclose(_get(dev, py, (3, 200)), ref.rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    ff = rng.uniform(0.5, 8.0, 24).astype(np.float32)  # RoPE frequency factors (rope_freqs.weight)
    for neox, factors, mscale in ((0, None, 1.0), (1, None, 1.0), (0, ff, 1.0), (1, ff, 1.25)):
        q = rng.standard_normal((3, 4, 64)).astype(np.float32)
        pos = np.array([0, 7, 4000], np.int32)
        pq, pp = _put(dev, q), _put(dev, pos)
        pf = dev.ffi.NULL if factors is None else _f(dev, _put(dev, factors))
        dev.check(dev.lib.pi_cuda_rope(_f(dev, pq), _i(dev, pp), 3, 4, 64, 48, 10000.0, 1.0, neox, pf, mscale,
                                       dev.stream), "rope")
        want = ref.rope(q.copy(), pos, 48, 10000.0, 1.0, neox, factors, mscale)
        np.testing.assert_allclose(_get(dev, pq, q.shape), want, atol=2e-5)
    for hd, window in ((32, 0), (128, 0), (256, 5)):
        n_ctx, p0 = 40, 17
        q = rng.standard_normal((3, 8, hd)).astype(np.float32)
        k = rng.standard_normal((2, n_ctx, hd)).astype(np.float16)
        v = rng.standard_normal((2, n_ctx, hd)).astype(np.float16)
        pq, pk, pv, po = _put(dev, q), _put(dev, k), _put(dev, v), dev.alloc(q.nbytes)
        dev.check(dev.lib.pi_cuda_attention(_f(dev, pq), dev.ffi.cast("uint16_t *", pk), dev.ffi.cast("uint16_t *", pv),
                                            _f(dev, po), 3, 8, 2, hd, n_ctx, p0, window, hd ** -0.5, dev.stream), "att")
        np.testing.assert_allclose(_get(dev, po, q.shape), ref.attention(q, k, v, p0, window, hd ** -0.5),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["f16", "q4_0"])
def test_hybrid_cuda_backend_matches_cpu(tmp_path, dtype):
    import powerinfer_py
    from powerinfer_py.synth.sparse import SHAPES, write_sparse_model
    if not C.cuda_status().available:
        pytest.skip(C.cuda_status().reason)
    path, _ = write_sparse_model(tmp_path / "m.pwri", n_layer=2, dtype=dtype, n_sample=256, **SHAPES["tiny"])
    prompt = [1, 17, 230, 45, 99, 3, 310, 77]
    from test_hybrid import _fixed_and_ffn
    fixed, ffn = _fixed_and_ffn(path)
    budget = (fixed + ffn // 2) / 2**30  # about half of the FFN on the device: both halves work
    out = {}
    for backend in ("cpu", "cuda"):
        with powerinfer_py.load(path, threads=1, n_ctx=64, backend=backend, vram_budget=budget) as llm:
            assert llm.backend.running == ("cpu" if backend == "cpu" else "hybrid cuda")
            toks = list(llm.generate_tokens(prompt, max_tokens=12, temperature=0))
            llm.reset()
            out[backend] = toks, llm.model.forward(prompt, llm.cache)
    (ct, cl), (gt, gl) = out["cpu"], out["cuda"]
    if dtype == "f16":
        assert ct == gt
        np.testing.assert_allclose(gl, cl, rtol=1e-4, atol=1e-4 * np.abs(cl).max())
    else:  # the CPU quantizes x to Q8_0 for Q4_0 weights, the GPU does not (see the module docstring)
        assert np.max(np.abs(gl - cl)) <= 2e-2 * np.abs(cl).max()
