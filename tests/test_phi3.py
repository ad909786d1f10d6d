"""phi3 beyond the shared parametrizations of test_models.py: partial rotary, the long/short RoPE factors and
attn_factor of long-context files (against the numpy reference and llama.cpp), separate attn_q/k/v, the fused
tensors split into zero-copy views, bad fused shapes, and threshold sparsity through the split gate/up."""
from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
from reference_forward import ReferenceModel
from test_models import TOKENS, TOL, load_model, rel_err

from powerinfer_py import load
from powerinfer_py.tools.calibrate import calibrate
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.tools.perplexity import perplexity
from powerinfer_py.synth import write_synthetic_model
from powerinfer_py.gguf.types import Tensor

N_ROT = 12  # of head_dim 16: Phi-4-mini's partial rotary (96 of 128), also the synthetic default
_RNG = np.random.default_rng(7)
FACTORS = (1 + 3 * _RNG.random(N_ROT // 2), 1 + 20 * _RNG.random(N_ROT // 2))  # (short, long)
ORIG_CTX = 256  # llama.cpp rounds n_ctx up to 256: 32 stays short there too, 512 is long
LONGROPE = {"n_rot": N_ROT, "rope_factors": FACTORS, "orig_ctx": ORIG_CTX, "attn_factor": 1.3}


@pytest.fixture(scope="module")
def longrope(tmp_path_factory):
    """dtype -> a synthetic phi3 file with LONGROPE (written once per module)."""
    folder = tmp_path_factory.mktemp("phi3-longrope")
    return {d: write_synthetic_model(folder / f"phi3-longrope-{d}.gguf", "phi3", dtype=d, **LONGROPE)
            for d in ("f32", "q8_0")}


def llama_cpp_logits(path, n_ctx):
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, n_threads=2, verbose=False)
    try:
        llm.eval(TOKENS.tolist())
        return np.array(llm.scores[:len(TOKENS)], dtype=np.float32)
    finally:
        llm.close()


@pytest.mark.parametrize("n_ctx,which", [(32, "short"), (512, "long")])
def test_longrope_matches_reference_and_llama_cpp(longrope, cpu_kernels, n_ctx, which):
    """Partial rotary + short/long factors picked by the context size + attn_factor on the rotated dims."""
    path = longrope["f32"]
    model = load_model(path, cpu_kernels)
    assert model.config.rope_attn_factor == pytest.approx(1.3) and model.config.rope_orig_ctx == ORIG_CTX
    assert model.rope_factors_for(n_ctx) == which
    ours = model.forward(TOKENS, model.new_cache(n_ctx), all_logits=True)
    assert rel_err(ours, ReferenceModel(path, n_ctx=n_ctx).logits(TOKENS)) < TOL
    theirs = llama_cpp_logits(path, n_ctx)
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    assert rel_err(ours, theirs) < 0.01
    # the choice matters: the other factor set (or no attn_factor) gives clearly different logits
    other = ReferenceModel(path, n_ctx=512 if which == "short" else 32).logits(TOKENS)
    assert rel_err(ours, other) > 100 * TOL


def test_longrope_steps_equal_prefill(longrope, cpu_kernels):
    model = load_model(longrope["q8_0"], cpu_kernels)
    batched = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    cache = model.new_cache(32)
    steps = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    np.testing.assert_allclose(steps, batched, rtol=0, atol=TOL * batched.std())
    # the steps ran in the one-call attention block (it applies the attn_factor as its RoPE mscale); the
    # Python path gives the same bits
    assert model.config.rope_attn_factor != 1.0 and model.attn_plans() is not None
    model.fused_attention = False
    cache = model.new_cache(32)
    python_steps = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    np.testing.assert_array_equal(python_steps, steps)


@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_separate_qkv_and_full_rotary(synthetic_model, cpu_kernels, backend):
    """Files with attn_q/k/v instead of attn_qkv; n_rot = head_dim (Phi-3-mini; the default synthetic phi3
    rotates 3/4 of each head, as Phi-4-mini does); one-call decode steps. Seed 1: with seed 0 one Q8_0
    activation block of this model sits on a rounding boundary, which f32 vs f64 sums push either way (0.02
    of the logits' spread at one token, measured; other seeds agree to 1e-6)."""
    path = synthetic_model("phi3", "q8_0", n_rot=16, fused_qkv=False, seed=1)
    assert "blk.0.attn_q.weight" in open_gguf(path).tensors
    model = load_model(path, cpu_kernels if backend == "cpu" else ref.RefKernels())
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    assert rel_err(ours, ReferenceModel(path).logits(TOKENS, act_q8_0=True)) < TOL
    cache = model.new_cache(32)
    steps = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    np.testing.assert_allclose(steps, ours, rtol=0, atol=TOL * ours.std())


def test_fused_tensors_become_zero_copy_views(synthetic_model):
    w = load_weights(open_gguf(synthetic_model("phi3", "q8_0")), expected_tensors)
    model = build_model(w.config, w.tensors, ref.RefKernels())
    c, L, ffn = w.config, model.layers[1], model.ffns[1]
    qkv, up = w.tensors["blk.1.attn_qkv.weight"], w.tensors["blk.1.ffn_up.weight"]
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    for view, fused, r0 in ((L.wq, qkv, 0), (L.wk, qkv, q_dim), (L.wv, qkv, q_dim + kv_dim),
                            (ffn.w.gate, up, 0), (ffn.w.up, up, c.n_ff)):
        assert np.shares_memory(view.data, fused.data) and view.type == fused.type
        np.testing.assert_array_equal(view.data, fused.data[r0:r0 + view.shape[0]])
        assert view.data.flags.c_contiguous
    assert ffn.w.gate.shape == ffn.w.up.shape == (c.n_ff, c.n_embd)


def test_bad_fused_qkv_rows(synthetic_model):
    f = open_gguf(synthetic_model("phi3", "f32"))
    w = load_weights(f, expected_tensors)
    t = w.tensors["blk.0.attn_qkv.weight"]
    tensors = dict(w.tensors)
    tensors[t.name] = Tensor(t.name, t.type, (t.shape[0] - 16, t.shape[1]), t.data[:-16])
    with pytest.raises(ModelFileError, match=r"attn_qkv.*expected 128 rows = 64 \(attn_q\) \+ 32 \(attn_k\)"):
        build_model(w.config, tensors, ref.RefKernels())
    del tensors[t.name]  # neither attn_qkv nor attn_q/k/v
    with pytest.raises(ModelFileError, match="blk.0.attn_qkv.weight"):
        build_model(w.config, tensors, ref.RefKernels())
    f.tensors[t.name] = tensors.get(t.name, Tensor(t.name, t.type, (96, t.shape[1]), t.data[:96]))
    with pytest.raises(ModelFileError, match=r"blk.0.attn_qkv.weight.*expected \(128, 64\)"):
        load_weights(f, expected_tensors)  # the loader's shape check names it too


def test_threshold_sparsity_runs_through_the_split_ffn(synthetic_model, tmp_path):
    text = "the one and the other were in the house of the sun, and the cat ran to the tree. " * 8
    src = synthetic_model("phi3", "f32")
    res = calibrate(src, tmp_path / "phi3.t50.gguf", 0.5, text=text, n_tokens=200, ctx=64, threads=1)
    with load(res.path, threads=1, sparse="off") as dense, load(res.path, threads=1, sparse="threshold",
                                                                 sparsity=0) as zero:
        a = dense.model.forward(TOKENS, dense.model.new_cache(32), all_logits=True)
        np.testing.assert_array_equal(a, zero.model.forward(TOKENS, zero.model.new_cache(32), all_logits=True))
    with load(res.path, threads=1, sparse="threshold") as llm:
        perplexity(llm, text, ctx=64, max_tokens=200)
        assert abs(llm.sparsity_stats.skipped_fraction - 0.5) <= 0.05


def test_info_shows_partial_rotary_and_longrope(longrope, synthetic_model):
    from powerinfer_cli.main import app
    from typer.testing import CliRunner

    from powerinfer_py.tools.info import model_info
    info = model_info(longrope["q8_0"])
    assert info["config"]["n_rot"] == N_ROT
    assert info["rope_scaling"] == {"linear": None, "freq_factors": None, "yarn": None,
                                    "longrope": {"orig_ctx": ORIG_CTX, "attn_factor": pytest.approx(1.3)}}
    assert model_info(synthetic_model("phi3", "f32"))["rope_scaling"] is None  # Phi-3-mini-4k: no factors
    out = CliRunner().invoke(app, ["info", str(longrope["q8_0"])])
    assert out.exit_code == 0, out.output
    assert "RoPE dims" in out.output and f"long when n_ctx > {ORIG_CTX}" in out.output


def test_exact_mode_on_a_relu_phi3(synthetic_model, tmp_path):
    """The split gate/up views feed the exact-mode FFN: on a ReLU phi3 copy it gives bit-for-bit the dense result
    while skipping up rows; the SwiGLU original refuses exact mode with the usual message."""
    from powerinfer_py.errors import UnsupportedError
    from powerinfer_py.gguf.writer import write_gguf
    src = synthetic_model("phi3", "q8_0")
    with pytest.raises(UnsupportedError, match="ReLU"):
        load(src, threads=1, sparse="exact")
    relu = tmp_path / "phi3-relu.gguf"
    with open_gguf(src) as f:
        write_gguf(relu, {**f.metadata, "powerinfer.hidden_act": "relu"}, f.tensors, types=f.metadata_types)
    with load(relu, threads=1, sparse="off") as dense, load(relu, threads=1, sparse="exact") as exact:
        a = dense.model.forward(TOKENS, dense.model.new_cache(32), all_logits=True)
        np.testing.assert_array_equal(a, exact.model.forward(TOKENS, exact.model.new_cache(32), all_logits=True))
        assert list(dense.generate_tokens(TOKENS[:4].tolist(), max_tokens=6, temperature=0)) == \
            list(exact.generate_tokens(TOKENS[:4].tolist(), max_tokens=6, temperature=0))
        assert 0.2 < exact.sparsity_stats.skipped_fraction < 0.8  # ReLU zeros about half the neurons


def test_one_call_decode_switches_factor_sets(cpu_kernels, tmp_path):
    """attn_factor 1 keeps the one-call decode block; its plans carry the factors, so one model decoding in a
    short and then a long context must use each context's own set (checked against that context's prefill)."""
    path = write_synthetic_model(tmp_path / "phi3-af1.gguf", "phi3", **{**LONGROPE, "attn_factor": 1.0})
    model = load_model(path, cpu_kernels)
    assert model.attn_plans() is not None
    for n_ctx in (32, 512, 32):
        batched = model.forward(TOKENS, model.new_cache(n_ctx), all_logits=True)
        assert rel_err(batched, ReferenceModel(path, n_ctx=n_ctx).logits(TOKENS)) < TOL
        cache = model.new_cache(n_ctx)
        steps = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
        np.testing.assert_allclose(steps, batched, rtol=0, atol=TOL * batched.std())
    assert set(model._plans_by_factors) == {"short", "long"}
