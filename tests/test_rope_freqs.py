"""RoPE scaling beyond a linear factor: frequency factors (rope_freqs.weight, LLaMA 3.1+ files) and YaRN
(rope.scaling.type "yarn"). The kernels against the numpy reference, models that carry them against the
independent forward pass and against llama.cpp on the same file, bad values, and the conversion of a Hugging
Face `rope_scaling: llama3` config into the tensor.

Every comparison also checks that the factors matter in it (ignoring them moves the logits far beyond the
tolerance), so none of these tests could pass by leaving the factors out."""
from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
from hf_fixtures import hf_llama_forward, llama_config, llama_weights, write_checkpoint
from reference_forward import ReferenceModel

from powerinfer_py.convert import convert
from powerinfer_py.convert.archs import llama3_rope_factors
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.synth import write_synthetic_model

# The synthetic llama has head_dim 16: 8 pairs. Factors below 1 speed the fast pairs up, so they change the
# logits within the 12 test positions (real files slow the slow pairs down, which shows only at long range).
FACTORS = np.geomspace(0.4, 8.0, 8).astype(np.float32)
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)


@pytest.fixture(scope="module")
def llama3_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rope_freqs")
    return {dtype: write_synthetic_model(folder / f"llama-ff-{dtype}.gguf", "llama", dtype=dtype, rope_freqs=FACTORS)
            for dtype in ("f32", "q8_0")}


def _model(path, kernels):
    w = load_weights(open_gguf(path), expected_tensors)
    return build_model(w.config, w.tensors, kernels)


def _rel(ours, want) -> float:
    return float(np.abs(ours - want).max() / want.std())


def _llama_cpp_logits(path, tokens) -> np.ndarray:
    """llama.cpp's logits for every position of `tokens` on the same file."""
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=32, n_threads=2, verbose=False)
    try:
        llm.eval([int(t) for t in tokens])
        return np.array(llm.scores[:len(tokens)], dtype=np.float64)
    finally:
        llm.close()


# ---- kernels -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_cpu_rope_with_factors_matches_reference(neox, n_threads):
    from powerinfer_py.kernels.cpu import CpuKernels
    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, 3, 20)).astype(np.float32)  # 400 tokens: split over threads when n_threads 2
    pos = np.concatenate([np.arange(200), np.arange(5000, 5200)]).astype(np.int32)
    ff = rng.uniform(0.3, 8.0, 8).astype(np.float32)
    k = CpuKernels(n_threads=n_threads)
    try:
        ours = k.rope(x.copy(), pos, 16, 500000.0, 0.5, neox, ff)
        plain = k.rope(x.copy(), pos, 16, 500000.0, 0.5, neox)
    finally:
        k.close()
    want = ref.rope(x.copy(), pos, 16, 500000.0, 0.5, neox, ff)
    np.testing.assert_allclose(ours, want, atol=2e-5)
    np.testing.assert_array_equal(ours[..., 16:], x[..., 16:])  # dims past n_rot stay as they are
    assert np.abs(plain - want).max() > 0.1  # the factors change the result
    np.testing.assert_allclose(ref.rope(x.copy(), pos, 16, 500000.0, 0.5, neox, np.ones(8)),
                               ref.rope(x.copy(), pos, 16, 500000.0, 0.5, neox), atol=0)


def test_cpu_rope_refuses_bad_factors(cpu_kernels):
    x, pos = np.zeros((2, 1, 8), np.float32), np.arange(2, dtype=np.int32)
    for bad, what in ((np.ones(3), "shape"), (np.array([1, 0, 1, 1.0]), "> 0"), (np.array([1, np.nan, 1, 1]), "> 0")):
        with pytest.raises(ValueError, match=what):
            cpu_kernels.rope(x, pos, 8, 10000.0, 1.0, False, bad)


# ---- a llama model with rope_freqs.weight --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_model_with_factors_matches_reference(llama3_file, cpu_kernels, dtype):
    path = llama3_file[dtype]
    model = _model(path, cpu_kernels)
    assert model.rope_freqs is not None and np.array_equal(model.rope_freqs, FACTORS)
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    reference = ReferenceModel(path)
    want = reference.logits(TOKENS, act_q8_0=dtype == "q8_0")
    assert _rel(ours, want) < 1e-3
    del reference.w["rope_freqs.weight"]  # the same file read as if the factors were not there
    assert _rel(ours, reference.logits(TOKENS, act_q8_0=dtype == "q8_0")) > 0.05


def test_one_call_decode_equals_python_path(llama3_file, cpu_kernels):
    """Token by token: the fused attention block (C) and the Python path give the same bits, and both equal
    the batched prefill's logits closely."""
    model = _model(llama3_file["f32"], cpu_kernels)
    runs = {}
    for fused in (True, False):
        model.fused_attention = fused
        cache = model.new_cache(32)
        runs[fused] = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    np.testing.assert_array_equal(runs[True], runs[False])
    batched = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    assert _rel(runs[True], batched) < 1e-4


def test_llama_cpp_agrees_on_a_file_with_factors(llama3_file, cpu_kernels):
    path = llama3_file["f32"]
    model = _model(path, cpu_kernels)
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    theirs = _llama_cpp_logits(path, TOKENS)
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    assert _rel(ours, theirs) < 0.01
    model.rope_freqs = None  # what we computed before the factors were read: far from llama.cpp
    model.__dict__.pop("_attn_plans", None)
    assert _rel(model.forward(TOKENS, model.new_cache(32), all_logits=True), theirs) > 0.05


def test_info_shows_the_factors(llama3_file):
    from powerinfer_py.tools.info import model_info
    info = model_info(llama3_file["q8_0"])
    assert info["rope_scaling"] == {"linear": None, "freq_factors": [pytest.approx(0.4), pytest.approx(8.0)],
                                    "yarn": None}


def test_expected_shape_and_bad_values(tmp_path, cpu_kernels):
    path = write_synthetic_model(tmp_path / "ok.gguf", "llama", rope_freqs=FACTORS)
    w = load_weights(open_gguf(path), expected_tensors)
    assert expected_tensors(w.config)["rope_freqs.weight"] == ((w.config.n_rot // 2,), False)
    for i, bad in enumerate((0.0, -2.0, np.inf)):
        f = FACTORS.copy()
        f[3] = bad
        path = write_synthetic_model(tmp_path / f"bad{i}.gguf", "llama", rope_freqs=f)
        with pytest.raises(ModelFileError, match="rope_freqs.weight"):
            _model(path, cpu_kernels)


# ---- conversion of a Hugging Face llama3 rope_scaling ---------------------------------------------------------

DIMS = dict(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=512)
HF_TOKENS = [1, 50, 300, 7, 99, 400, 12, 8, 260, 31]
# original context 16 tokens: every pair but the fastest is slowed down within the test positions
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


def _hf_inv_freq(cfg: dict, head_dim: int) -> np.ndarray:
    """The LLaMA 3.1 frequency scaling written pair by pair from its definition (independent of archs.py)."""
    s = cfg["rope_scaling"]
    old_ctx, factor = s["original_max_position_embeddings"], s["factor"]
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / cfg["rope_theta"] ** (i / head_dim)
        wavelen = 2 * np.pi / freq
        if wavelen < old_ctx / s["high_freq_factor"]:
            out.append(freq)
        elif wavelen > old_ctx / s["low_freq_factor"]:
            out.append(freq / factor)
        else:
            smooth = (old_ctx / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


def test_convert_llama3_rope_scaling(tmp_path, cpu_kernels):
    rng = np.random.default_rng(0)
    cfg = llama_config(**DIMS, rope_scaling=LLAMA3)
    w = llama_weights(rng, **DIMS)
    write_checkpoint(tmp_path / "hf", cfg, w)
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    head_dim = DIMS["n_embd"] // DIMS["n_head"]
    plain = 1.0 / cfg["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    with open_gguf(out) as f:
        factors = np.array(f.tensors["rope_freqs.weight"].data, dtype=np.float64)
        assert not any(k.startswith("llama.rope.scaling") for k in f.metadata)
    np.testing.assert_allclose(factors, plain / _hf_inv_freq(cfg, head_dim), rtol=1e-6)
    assert factors[0] < 8.0 and (factors[1:] == 8.0).all()

    expected = hf_llama_forward(w, cfg, HF_TOKENS, inv_freq=_hf_inv_freq(cfg, head_dim))
    unscaled = hf_llama_forward(w, cfg, HF_TOKENS)
    model = _model(out, cpu_kernels)
    ours = model.forward(np.array(HF_TOKENS, np.int32), model.new_cache(32), all_logits=True)
    assert _rel(ours, expected) < 2e-3 < 0.05 < _rel(ours, unscaled)
    theirs = _llama_cpp_logits(out, HF_TOKENS)
    assert _rel(theirs, expected) < 2e-3


def test_llama3_factors_match_a_real_configuration():
    """LLaMA 3.1 8B's settings (head_dim 128, theta 500000, factor 8, 1 / 4, 8192): the fast pairs keep their
    frequency, the slow ones are divided by 8, and the band between blends them; same as the pair-by-pair
    definition."""
    cfg = {"rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192}}
    f = llama3_rope_factors(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    plain = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    np.testing.assert_allclose(f, plain / _hf_inv_freq(cfg, 128), rtol=1e-6)
    assert f.shape == (64,) and f[0] == 1.0 and f[-1] == 8.0 and np.all(np.diff(f) >= 0)
    assert 0 < ((f > 1) & (f < 8)).sum() < 10


@pytest.mark.parametrize("arch,scaling,error", [
    ("LlamaForCausalLM", {"rope_type": "yarn", "factor": 4.0}, "yarn"),
    ("Qwen2ForCausalLM", LLAMA3, "llama3"),
    ("LlamaForCausalLM", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                          "original_max_position_embeddings": 16}, "high_freq_factor"),
])
def test_convert_refuses_other_scalings(tmp_path, arch, scaling, error):
    rng = np.random.default_rng(1)
    cfg = llama_config(**DIMS, arch=arch, rope_scaling=scaling)
    write_checkpoint(tmp_path / "hf", cfg, llama_weights(rng, **DIMS, qkv_bias=arch.startswith("Qwen2")))
    with pytest.raises((UnsupportedError, ModelFileError), match=error):
        convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    assert not (tmp_path / "model.gguf").exists()


# ---- YaRN (rope.scaling.type "yarn" in the metadata) -----------------------------------------------------------

YARN = {"type": "yarn", "factor": 4.0, "original_context_length": 32}  # short original context: visible at 12 tokens


def _yarn_angles_ggml_style(pos, n_rot, base, factor, n_ctx_orig, beta_fast=32.0, beta_slow=1.0):
    """The angles written the way the YaRN paper and ggml state them: per pair, a blend of the original angle
    (extrapolation) and the angle / factor (interpolation), weighted by a ramp over the pair index."""
    def corr(n_turns):
        return n_rot * np.log(n_ctx_orig / (n_turns * 2 * np.pi)) / (2 * np.log(base))
    lo, hi = max(0.0, np.floor(corr(beta_fast))), min(n_rot - 1.0, np.ceil(corr(beta_slow)))
    out = np.empty((len(pos), n_rot // 2))
    for i in range(n_rot // 2):
        extrap = pos * base ** (-2.0 * i / n_rot)
        ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
        out[:, i] = extrap / factor * (1.0 - ramp) + extrap * ramp
    return out


@pytest.mark.parametrize("n_rot,base,factor,n_ctx_orig", [(16, 10000.0, 4.0, 32), (128, 1e6, 4.0, 32768),
                                                          (64, 500000.0, 8.0, 8192)])
def test_yarn_factors_give_the_blended_angles(n_rot, base, factor, n_ctx_orig):
    from powerinfer_py.config import yarn_rope
    factors, mscale = yarn_rope(n_rot, base, factor, n_ctx_orig)
    pos = np.array([0, 1, 7, 1000, 100000], dtype=np.float64)
    ours = pos[:, None] * base ** (-2.0 * np.arange(n_rot // 2) / n_rot) / np.array(factors)
    np.testing.assert_allclose(ours, _yarn_angles_ggml_style(pos, n_rot, base, factor, n_ctx_orig), rtol=1e-12)
    assert mscale == pytest.approx(1 + 0.1 * np.log(factor))
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(factor)


@pytest.mark.parametrize("arch,scaling", [("llama", YARN), ("qwen2", dict(YARN, attn_factor=0.8)), ("qwen3", YARN)])
def test_yarn_matches_llama_cpp(tmp_path, cpu_kernels, arch, scaling):
    path = write_synthetic_model(tmp_path / f"{arch}-yarn.gguf", arch, rope_scaling=scaling, rope_freq_base=10000.0)
    model = _model(path, cpu_kernels)
    assert model.rope_mscale == pytest.approx(scaling.get("attn_factor", 1.0) * (1 + 0.1 * np.log(4.0)))
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    cache = model.new_cache(32)  # one token at a time: the one-call attention block takes the same RoPE
    steps = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    theirs = _llama_cpp_logits(path, TOKENS)
    assert _rel(ours, theirs) < 0.01 and _rel(steps, theirs) < 0.01
    model.rope_freqs, model.rope_mscale = None, 1.0  # without YaRN: far from llama.cpp
    model.__dict__.pop("_attn_plans", None)
    assert _rel(model.forward(TOKENS, model.new_cache(32), all_logits=True), theirs) > 0.1


def test_cpu_rope_mscale(cpu_kernels):
    rng = np.random.default_rng(4)
    x, pos = rng.standard_normal((5, 2, 12)).astype(np.float32), np.arange(5, dtype=np.int32)
    ours = cpu_kernels.rope(x.copy(), pos, 8, 10000.0, 1.0, True, None, 1.25)
    np.testing.assert_allclose(ours, ref.rope(x.copy(), pos, 8, 10000.0, 1.0, True, None, 1.25), atol=1e-5)
    np.testing.assert_array_equal(ours[..., 8:], x[..., 8:])  # only the rotated dims are scaled
    np.testing.assert_allclose(ours[..., :8], 1.25 * cpu_kernels.rope(x.copy(), pos, 8, 10000.0, 1.0, True)[..., :8],
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="mscale"):
        cpu_kernels.rope(x, pos, 8, 10000.0, 1.0, True, None, 0.0)


def test_yarn_refusals(tmp_path):
    gemma = write_synthetic_model(tmp_path / "g.gguf", "gemma3", rope_scaling=YARN)
    with pytest.raises(UnsupportedError, match="YaRN"):
        load_weights(open_gguf(gemma), expected_tensors)
    other = write_synthetic_model(tmp_path / "l.gguf", "llama", rope_scaling={"type": "longrope", "factor": 2.0})
    with pytest.raises(UnsupportedError, match="longrope"):
        load_weights(open_gguf(other), expected_tensors)
    bad = write_synthetic_model(tmp_path / "b.gguf", "qwen2", rope_scaling=dict(YARN, factor=-1.0))
    with pytest.raises(ModelFileError, match="factor"):
        load_weights(open_gguf(bad), expected_tensors)
