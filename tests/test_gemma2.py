"""Gemma 1 (arch "gemma") and Gemma 2 (arch "gemma2"): the attention soft-cap kernels against their numpy
reference, the config read from metadata (llama.cpp's defaults), tiny synthetic files against llama.cpp on the
same file (with caps small enough to change the result, so a missing cap would show), the one-call decode step
against the Python path, threshold mode at sparsity 0 against dense, and clear errors for broken files."""
from __future__ import annotations

import math

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import assert_fused_decode_equals_python, load_model, rel_err

from powerinfer_py import load
from powerinfer_py.tools.calibrate import calibrate
from powerinfer_py.chat.templates import default_builtin
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.writer import write_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import expected_tensors, read_config
from powerinfer_py.tools.perplexity import perplexity
from powerinfer_py.tools.profile import profile_model
from powerinfer_py.gguf.types import GGMLType, Tensor

# <s> then the pieces of "Hello world, th": longer than the synthetic window of 4
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)
# soft-caps small enough to bite on a tiny random model (scores and logits of a few units): measured, a run
# without the attention cap is off from llama.cpp by ~0.9 of the logits' spread, one without the final cap by ~2.7
CAPS = {"attn_softcap": 2.0, "final_softcap": 4.0}
# llama.cpp differs from an exact f32 computation by a few 1e-3 of the logits' spread (its CPU attention rounds
# q to f16, its GELU works in f16); the same 1% as tests/test_models.py, tight enough to catch any wrong op
TOL = 0.01
QUANT_TOL = 0.25  # tests/test_models.py's bound for quantized files


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def kern(request):
    k = CpuKernels(n_threads=request.param)
    yield k
    k.close()


# ---- the soft-capped attention kernel ----------------------------------------------------------------------

@pytest.mark.parametrize("n_head,n_head_kv", [(1, 1), (4, 1), (6, 3), (8, 2)])
@pytest.mark.parametrize("n_tok,pos0,window", [(1, 0, 0), (1, 37, 0), (5, 9, 3), (13, 4, 6)])
@pytest.mark.parametrize("head_dim", [16, 33, 64])
@pytest.mark.parametrize("softcap", [0.0, 0.7, 5.0])
def test_attention_softcap_matches_reference(kern, n_head, n_head_kv, n_tok, pos0, window, head_dim, softcap):
    rng = np.random.default_rng(n_head * 100 + n_tok * 10 + head_dim)
    n_ctx = pos0 + n_tok + 3
    q = (4.0 * rng.standard_normal((n_tok, n_head, head_dim))).astype(np.float32)  # scores of several units
    k = rng.standard_normal((n_head_kv, n_ctx, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_head_kv, n_ctx, head_dim)).astype(np.float16)
    k[:, pos0 + n_tok:] = 1000.0  # the unfilled tail must stay unread
    v[:, pos0 + n_tok:] = np.nan
    scale = head_dim ** -0.5
    got = kern.attention(q, k, v, pos0, window, scale, softcap)
    want = ref.attention(q, k, v, pos0, window, scale, softcap)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=3e-6)
    if softcap and n_tok * (pos0 + 1) > 1:  # more than one visible key somewhere: the cap changes the weights
        assert np.abs(want - ref.attention(q, k, v, pos0, window, scale)).max() > 1e-2


def test_reference_softcap_is_the_formula():
    """ref.attention's cap is cap * tanh(s / cap) of the scaled scores, before the softmax (a direct loop)."""
    rng = np.random.default_rng(0)
    q = (3.0 * rng.standard_normal((2, 2, 8))).astype(np.float32)
    k = rng.standard_normal((1, 5, 8)).astype(np.float16)
    v = rng.standard_normal((1, 5, 8)).astype(np.float16)
    got = ref.attention(q, k, v, 3, 0, 0.5, 1.5)
    for t in range(2):
        for h in range(2):
            s = 0.5 * (k[0, :4 + t].astype(np.float64) @ q[t, h].astype(np.float64))
            s = 1.5 * np.tanh(s / 1.5)
            w = np.exp(s - s.max())
            np.testing.assert_allclose(got[t, h], (w / w.sum()) @ v[0, :4 + t].astype(np.float64), rtol=1e-6)


def test_softcap_zero_is_the_uncapped_kernel(kern):
    """A cap of 0 is off: the same bits as a call without it, on the vector and the scalar path."""
    rng = np.random.default_rng(5)
    for head_dim in (32, 33):
        q = rng.standard_normal((7, 4, head_dim)).astype(np.float32)
        k = rng.standard_normal((2, 20, head_dim)).astype(np.float16)
        v = rng.standard_normal((2, 20, head_dim)).astype(np.float16)
        a = kern.attention(q, k, v, 10, 4, 0.2)
        b = kern.attention(q, k, v, 10, 4, 0.2, 0.0)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_softcap_batch_equals_decode_steps(kern):
    rng = np.random.default_rng(3)
    q = (4.0 * rng.standard_normal((9, 4, 64))).astype(np.float32)
    k = rng.standard_normal((1, 40, 64)).astype(np.float16)
    v = rng.standard_normal((1, 40, 64)).astype(np.float16)
    batch = kern.attention(q, k, v, 20, 4, 0.125, 3.0)
    for t in range(9):
        np.testing.assert_array_equal(kern.attention(q[t:t + 1].copy(), k, v, 20 + t, 4, 0.125, 3.0)[0], batch[t])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_softcap_is_refused(kern, bad):
    q = np.zeros((1, 2, 8), np.float32)
    kc = np.zeros((2, 4, 8), np.float16)
    with pytest.raises(ValueError, match="softcap"):
        kern.attention(q, kc, kc, 0, 0, 1.0, bad)


# ---- config -------------------------------------------------------------------------------------------------

def test_gemma2_config_defaults(synthetic_model):
    """Without the soft-cap and window keys, llama.cpp's defaults: caps 50 and 30, window 4096; the even layers
    slide; query scale 1/sqrt(head_dim); embeddings scaled by sqrt(n_embd); NeoX RoPE; tied head."""
    path = synthetic_model("gemma2", "f32", n_layer=4, attn_softcap=None, final_softcap=None, sliding_window=0)
    c = read_config(open_gguf(path))
    assert (c.attn_softcap, c.final_softcap, c.sliding_window) == (50.0, 30.0, 4096)
    assert c.swa_layers == (True, False, True, False) and c.rope_freq_base_swa == c.rope_freq_base
    assert c.attn_scale == pytest.approx(1 / math.sqrt(c.head_dim)) and c.head_dim != c.n_embd // c.n_head
    assert c.embd_scale == pytest.approx(math.sqrt(c.n_embd)) and c.rope_neox and c.tied_output
    c = read_config(open_gguf(synthetic_model("gemma2", "f32", n_layer=4, **CAPS)))
    assert (c.attn_softcap, c.final_softcap, c.sliding_window) == (2.0, 4.0, 4)


def test_gemma_config(synthetic_model):
    c = read_config(open_gguf(synthetic_model("gemma", "f32")))
    assert c.arch == "gemma" and (c.attn_softcap, c.final_softcap, c.sliding_window) == (0.0, 0.0, 0)
    assert c.swa_layers == (False, False) and c.rope_neox and c.tied_output
    assert c.embd_scale == pytest.approx(math.sqrt(c.n_embd)) and c.attn_scale == pytest.approx(c.head_dim ** -0.5)


@pytest.mark.parametrize("bad", [-1.0, 0.0])
def test_bad_softcap_key(synthetic_model, bad):
    path = synthetic_model("gemma2", "f32", attn_softcap=bad)
    with pytest.raises(ModelFileError, match="'gemma2.attn_logit_softcapping'"):
        read_config(open_gguf(path))


def test_gemma_chat_format():
    for arch in ("gemma", "gemma2"):
        assert default_builtin(arch, lambda tok: False) == "gemma"


# ---- against llama.cpp ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,dtype,kw", [("gemma", "f32", {}), ("gemma2", "f32", CAPS), ("gemma2", "f32", {}),
                                            ("gemma2", "q8_0", CAPS)],
                         ids=["gemma", "gemma2-small-caps", "gemma2-default-caps", "gemma2-q8_0"])
def test_logits_match_llama_cpp(synthetic_model, cpu_kernels, arch, dtype, kw):
    """Same file, same tokens: every position (0 to 11, past the window of 4) against llama.cpp's logits."""
    kern = cpu_kernels
    path = synthetic_model(arch, dtype, n_layer=4, **kw)
    model = load_model(path, kern)
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    theirs = llama_cpp_logits(path, TOKENS)
    if dtype != "f32":
        # quantized weights: llama.cpp's activation rounding, amplified by the f16 GELU, moves the largest logit
        # by up to ~9% of the spread here (measured; gemma3 and llama files in the same test: 6-12%)
        assert rel_err(ours, theirs) < QUANT_TOL
        return
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    assert rel_err(ours[:1], theirs[:1]) < TOL and rel_err(ours, theirs) < TOL
    if kw:
        # each cap on its own matters: without it we would be off by far more than the tolerance
        for off in ("attn_softcap", "final_softcap"):
            m = load_model(path, kern, **{off: 0.0})
            assert rel_err(m.forward(TOKENS, m.new_cache(32), all_logits=True), theirs) > 10 * TOL, off
        # and so does the window of the even layers
        m = load_model(path, kern, sliding_window=0)
        assert rel_err(m.forward(TOKENS, m.new_cache(32), all_logits=True), theirs) > 10 * TOL


def test_numpy_backend_agrees(synthetic_model, cpu_kernels):
    """The numpy specification (kernels/ref.py: f64 attention with the cap) runs the same gemma2 model."""
    path = synthetic_model("gemma2", "f32", n_layer=4, **CAPS)
    ours, spec = load_model(path, cpu_kernels), load_model(path, ref.RefKernels())
    want = ours.forward(TOKENS, ours.new_cache(32), all_logits=True)
    got = spec.forward(TOKENS, spec.new_cache(32), all_logits=True)
    # the GELU rounds to f16 in both, so an f32-vs-f64 difference near a rounding step moves a value by 1/2048
    # of it (tests/test_models.py GELU_TOL)
    assert rel_err(got, want) < 3e-3


# ---- the one-call decode step and the sparse modes --------------------------------------------------------------

@pytest.mark.parametrize("arch,kw", [("gemma", {}), ("gemma2", CAPS)])
def test_fused_decode_equals_python_path(synthetic_model, kern, arch, kw):
    """Prompt of 3 tokens, then one at a time past the window: logits and KV cache bit for bit."""
    model = load_model(synthetic_model(arch, "f32", n_layer=4, **kw), kern)
    assert_fused_decode_equals_python(model, TOKENS)


def test_gemma2_threshold_calibration(synthetic_model, tmp_path):
    """calibrate, perplexity and profile accept gemma2; threshold mode at sparsity 0 is the dense model, bit for bit."""
    src = synthetic_model("gemma2", "f32", n_layer=4, **CAPS)
    res = calibrate(src, tmp_path / "g2.t50.gguf", 0.5, text="the cat sat on the mat " * 20, n_tokens=96, ctx=32,
                    threads=1)
    assert len(res.thresholds) == 4 and all(t > 0 for t in res.thresholds)
    ids = [int(t) for t in TOKENS]
    with load(res.path, threads=1, sparse="off") as dense, load(res.path, threads=1, sparse="threshold",
                                                                   sparsity=0) as sp:
        a = dense.model.forward(ids, dense.model.new_cache(32), all_logits=True)
        b = sp.model.forward(ids, sp.model.new_cache(32), all_logits=True)
        np.testing.assert_array_equal(a, b)
        assert list(dense.generate_tokens(ids[:4], max_tokens=6, temperature=0)) == \
            list(sp.generate_tokens(ids[:4], max_tokens=6, temperature=0))
    with load(res.path, threads=1) as llm:  # the calibrated file runs sparse at 0.5 by default
        assert llm.sparse.mode == "threshold"
        # perplexity scores the soft-capped logits: one window, BOS then the 11 text tokens
        seq = np.array(ids, np.int32)
        logits = llm.model.forward(seq, llm.model.new_cache(32), all_logits=True).astype(np.float64)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        nll = -logp[np.arange(11), seq[1:]]
        res = perplexity(llm, ids[1:], ctx=32)
        assert res.n_tokens == 11 and res.nll == pytest.approx(nll.mean(), rel=1e-5)
    with load(src, threads=1) as llm:  # profile reads gemma2's GeGLU activations (no exact zeros)
        prof = profile_model(llm, None, ids=ids[1:], ctx=32)
        assert prof.summary["arch"] == "gemma2" and prof.summary["ffn_variant"] == "geglu"
        assert prof.summary["tokens"] == 11


@pytest.mark.parametrize("arch,kw", [("gemma", {}), ("gemma2", CAPS)])
def test_pwri_predictor_mode(synthetic_model, tmp_path, arch, kw):
    """A PWRI file of the model (predictors as `powerinfer train-predictor` writes them): with every neuron
    predicted active it is the dense model; the emulated hybrid backend (hot neurons on the "device", attention
    and its soft-cap on the CPU kernels) gives the CPU backend's tokens and logits."""
    from powerinfer_py.tools.predictor_fit import LayerPredictor, Metrics
    from powerinfer_py.tools.predictor_out import write_pwri
    src = synthetic_model(arch, "f32", n_layer=4, **kw)
    c = read_config(open_gguf(src))
    rng = np.random.default_rng(1)
    preds = [LayerPredictor(rng.standard_normal((8, c.n_embd)).astype(np.float32),
                            rng.standard_normal((c.n_ff, 8)).astype(np.float32), Metrics(1, 1, 0.5, 0.5), 1, "numpy")
             for _ in range(c.n_layer)]
    out = write_pwri(src, preds, tmp_path / f"{arch}.pwri")
    ids = [int(t) for t in TOKENS]
    with load(src, threads=1) as llm:
        dense = llm.model.forward(ids, llm.model.new_cache(32), all_logits=True)
    with load(out, threads=1, sparse="predictor", sparse_threshold=-1e30) as llm:
        assert llm.config.is_sparse and llm.config.attn_softcap == kw.get("attn_softcap", 0.0)
        got = llm.model.forward(ids, llm.model.new_cache(32), all_logits=True)
    # the GELU rounds to f16 (as llama.cpp's), and the transposed down projection sums in another order
    np.testing.assert_allclose(got, dense, rtol=0, atol=2e-3 * dense.std())
    runs = {}
    for backend in ("cpu", "cpu-emulated"):
        # 0.75 MiB: the fixed 0.6 MiB plus about half the FFN neurons (measured: 256 of 512 on the "device")
        budget = 0.75 / 1024 if backend != "cpu" else None
        with load(out, threads=1, n_ctx=32, backend=backend, vram_budget=budget) as llm:
            toks = list(llm.generate_tokens(ids[:4], max_tokens=6, temperature=0))
            llm.reset()
            runs[backend] = (toks, llm.model.forward(ids, llm.cache, all_logits=True))
            if backend != "cpu":
                hot = sum(len(h) for h in llm.backend.plan.hot)
                assert 0 < hot < c.n_layer * c.n_ff, hot
    assert runs["cpu"][0] == runs["cpu-emulated"][0]
    # the two halves' sums add in another order; the f16-rounding GELU turns that into steps like the above
    np.testing.assert_allclose(runs["cpu-emulated"][1], runs["cpu"][1], rtol=0, atol=2e-3 * dense.std())


# ---- broken files ------------------------------------------------------------------------------------------------

def _rewrite(src, dst, replace: dict):
    """A copy of GGUF src with tensors replaced (name -> Tensor) or dropped (name -> None)."""
    f = open_gguf(src)
    tensors = [replace.get(n, t) if n in replace else t for n, t in f.tensors.items()]
    return write_gguf(dst, f.metadata, [t for t in tensors if t is not None])


def test_broken_gemma2_files_name_the_tensor(synthetic_model, tmp_path):
    src = synthetic_model("gemma2", "f32", n_layer=4, **CAPS)
    name = "blk.1.post_ffw_norm.weight"
    bad = Tensor(name, GGMLType.F32, (65,), np.ones(65, np.float32))  # n_embd is 64
    with pytest.raises(ModelFileError, match=f"'{name}' has shape"):
        load_weights(open_gguf(_rewrite(src, tmp_path / "shape.gguf", {name: bad})), expected_tensors)
    name = "blk.2.post_attention_norm.weight"
    with pytest.raises(ModelFileError, match=f"missing required tensor '{name}'"):
        load_weights(open_gguf(_rewrite(src, tmp_path / "missing.gguf", {name: None})), expected_tensors)
    data = src.read_bytes()
    cut = tmp_path / "short.gguf"
    cut.write_bytes(data[:len(data) - 1000])
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.3\.[a-z_]+\.weight' data ends at byte \d+, past the end"):
        load_weights(open_gguf(cut), expected_tensors)
