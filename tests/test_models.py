"""The llama, qwen2, qwen3, gemma3 and phi3 models on tiny synthetic files: against an independent numpy
forward pass (reference_forward.py), against llama.cpp on the same file, and against themselves (prefill vs steps)."""
from __future__ import annotations

import dataclasses

import llama_cpp
import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from reference_forward import ReferenceModel

from powerinfer_py.errors import ContextFullError, ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")  # phi3: fused attn_qkv and gate+up, synthetic window ignored
# 12 ids of the synthetic vocabulary (<s> then the pieces of "Hello world, th"); longer than gemma3's
# default synthetic window of 4, so sliding-window layers really drop positions.
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)


def load_model(path, kernels):
    f = open_gguf(path)
    w = load_weights(f, expected_tensors)
    return build_model(w.config, w.tensors, kernels)


def rel_err(ours: np.ndarray, want: np.ndarray) -> float:
    """Largest absolute difference relative to the spread of the expected logits."""
    return float(np.abs(ours - want).max() / want.std())


# Tolerances, as a fraction of the logits' standard deviation (~2 for these models).
# TOL: our model against a reference that rounds exactly what our kernels round (K/V to f16; for Q8_0/Q4_0
#   weights also the matmul inputs to Q8_0 blocks, as llama.cpp does). What is left is f32 vs f64 summation
#   order and an occasional f16 rounding flip of a cached K/V element: measured <= 3e-4.
# QUANT_TOL: quantized models against the plain f32-activation reference on the same dequantized weights. The
#   8-bit activation rounding (step 1/127 of each 32-block's max) moves the largest of the 12 x 512 logits by
#   5-13% of their spread after 2-6 layers (measured 0.05-0.13); 0.25 still catches a wrong op (tens of %).
# GELU_TOL (gemma3): the GELU rounds its input and output to f16, as llama.cpp's does, so an f32-vs-f64 difference
#   in a gate pre-activation near an f16 rounding boundary becomes a step of 1/2048 of that activation; over six
#   layers those steps reach ~1.5e-3 (measured). A wrong op is still off by tens of %. With Q8_0 weights the
#   step can also move a 32-block's 8-bit activation scale in the next matmul, which re-rounds the whole block:
#   GELU_Q_TOL, measured 0.033.
# BF16_TOL (gemma3 bf16): the input of every BF16 matmul is rounded to bf16 (as llama.cpp does, and the reference
#   too), so an f32-vs-f64 difference in an activation near a rounding boundary becomes a step of 2^-8 of it, 8x
#   the GELU's f16 step: measured 0.013 against the reference (0.009 between our C and numpy kernels); the same
#   reference without the bf16 rounding is 0.030 away, so the bound also pins the rounding.
TOL = 1e-3
GELU_TOL = 3e-3
BF16_TOL = 0.025
GELU_Q_TOL = 0.06
QUANT_TOL = 0.25
QUANTIZED = ("q8_0", "q4_0")
CASES = [(a, d) for a in ARCHS for d in ("f32", "q8_0")] + [("llama", "q4_0"), ("qwen2", "f16"), ("gemma3", "bf16"),
                                                          ("qwen3", "q4_0")]


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("arch,dtype", CASES)
def test_logits_match_reference(synthetic_model, cpu_kernels, arch, dtype, backend):
    path = synthetic_model(arch, dtype)
    model = load_model(path, cpu_kernels if backend == "cpu" else ref.RefKernels())
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    reference = ReferenceModel(path)
    assert ours.shape == (len(TOKENS), model.n_vocab) and ours.dtype == np.float32
    tol = TOL if arch != "gemma3" else GELU_Q_TOL if dtype in QUANTIZED else BF16_TOL if dtype == "bf16" else GELU_TOL
    assert rel_err(ours, reference.logits(TOKENS, act_q8_0=dtype in QUANTIZED)) < tol
    plain = reference.logits(TOKENS)
    if dtype in QUANTIZED:
        assert rel_err(ours, plain) < QUANT_TOL
    else:
        assert (ours.argmax(1) == plain.argmax(1)).all()


@pytest.mark.parametrize("arch,dtype", [(a, "f32") for a in ARCHS] + [("gemma3", "q8_0"), ("qwen3", "q8_0")])
def test_prefill_equals_single_steps(synthetic_model, cpu_kernels, arch, dtype):
    model = load_model(synthetic_model(arch, dtype), cpu_kernels)
    batched = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    cache = model.new_cache(32)
    steps = np.stack([model.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    assert cache.n_past == len(TOKENS)
    # same arithmetic per row; only the summation order of batched vs single-row kernels may differ, which
    # can flip the f16 rounding of a cached K/V element: the f32 tolerance above covers that
    np.testing.assert_allclose(steps, batched, rtol=0, atol=TOL * batched.std())


@pytest.mark.parametrize("arch,dtype", [(a, "f32") for a in ARCHS + ("gemma2", "smollm3", "olmo2")] + [
    ("llama", "q4_0"), ("qwen2", "f16"), ("gemma3", "bf16"), ("qwen3", "q8_0")])
def test_last_layer_runs_the_last_row_alone(synthetic_model, cpu_kernels, arch, dtype):
    """forward() without all_logits runs the last layer past its K/V for the last token only (as llama.cpp's graph
    does), and its logits are bit for bit the last row of the whole batch's; with an observer on the FFNs (as
    calibration sets) every layer sees every row again."""
    model = load_model(synthetic_model(arch, dtype), cpu_kernels)
    seen = []

    class Spy:  # stands in for each FFN: notes how many rows reach it
        observer = None

        def __init__(self, il, ffn):
            self.il, self.ffn = il, ffn

        def __call__(self, x, p=None):
            seen.append((self.il, x.shape[0]))
            return self.ffn(x, p)

    model.ffns = [Spy(il, f) for il, f in enumerate(model.ffns)]
    full = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    assert seen == [(il, len(TOKENS)) for il in range(len(model.ffns))]
    seen.clear()
    last = model.forward(TOKENS, model.new_cache(32))
    assert seen == [(il, len(TOKENS)) for il in range(len(model.ffns) - 1)] + [(len(model.ffns) - 1, 1)]
    np.testing.assert_array_equal(last, full[-1])
    seen.clear()
    model.ffns[0].observer = lambda *a: None
    watched = model.forward(TOKENS, model.new_cache(32))
    assert seen == [(il, len(TOKENS)) for il in range(len(model.ffns))]
    np.testing.assert_array_equal(watched, full[-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_in_two_chunks(synthetic_model, cpu_kernels, arch):
    model = load_model(synthetic_model(arch, "f32"), cpu_kernels)
    one = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    cache = model.new_cache(32)
    first = model.forward(TOKENS[:5], cache, all_logits=True)
    last = model.forward(TOKENS[5:], cache)  # last token only
    np.testing.assert_allclose(first, one[:5], rtol=0, atol=TOL * one.std())
    np.testing.assert_allclose(last, one[-1], rtol=0, atol=TOL * one.std())


def test_truncate_then_recompute(synthetic_model, cpu_kernels):
    model = load_model(synthetic_model("gemma3", "f32"), cpu_kernels)
    cache = model.new_cache(32)
    full = model.forward(TOKENS, cache, all_logits=True)
    cache.truncate(7)
    again = model.forward(TOKENS[7:], cache, all_logits=True)
    np.testing.assert_allclose(again, full[7:], rtol=0, atol=TOL * full.std())


def test_gemma3_sliding_window_matters(synthetic_model, cpu_kernels):
    """The synthetic gemma3 has window 4 on layers 0-4 (layer 5 is global). Without the window its logits
    would match a reference that attends to everything: show that they do not, from position 4 on."""
    path = synthetic_model("gemma3", "f32")
    model = load_model(path, cpu_kernels)
    assert model.config.sliding_window == 4 and model.config.swa_layers == (True,) * 5 + (False,)
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    windowed = ReferenceModel(path).logits(TOKENS)
    unwindowed = ReferenceModel(path, sliding_window=0).logits(TOKENS)
    np.testing.assert_allclose(ours, windowed, rtol=0, atol=GELU_TOL * windowed.std())
    # positions 0-3 see at most 4 keys, so the window changes nothing there...
    np.testing.assert_allclose(ours[:4], unwindowed[:4], rtol=0, atol=GELU_TOL * windowed.std())
    # ...and every later position must differ by far more than the tolerance
    later = np.abs(ours[4:] - unwindowed[4:]).max(axis=1) / windowed.std()
    assert (later > 100 * TOL).all(), later


def test_context_full(synthetic_model, cpu_kernels):
    model = load_model(synthetic_model("llama", "f32"), cpu_kernels)
    cache = model.new_cache(8)
    model.forward(TOKENS[:6], cache)
    with pytest.raises(ContextFullError, match=r"6 .*3 .*8"):
        model.forward(TOKENS[:3], cache)
    assert cache.n_past == 6  # a refused call changes nothing
    model.forward(TOKENS[:2], cache)
    assert cache.n_past == 8
    with pytest.raises(ContextFullError):
        model.forward(TOKENS[:1], cache)


def test_bad_token_id(synthetic_model, cpu_kernels):
    model = load_model(synthetic_model("qwen2", "f32"), cpu_kernels)
    cache = model.new_cache(8)
    with pytest.raises(ValueError, match="512"):
        model.forward([1, 512], cache)
    with pytest.raises(ValueError):
        model.forward([], cache)
    assert cache.n_past == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_expected_tensors_describe_the_file(synthetic_model, arch):
    f = open_gguf(synthetic_model(arch, "q8_0"))
    w = load_weights(f, expected_tensors)
    expected = expected_tensors(w.config)
    for name, t in f.tensors.items():  # every tensor of the file is known, with its shape
        assert expected[name][0] == t.shape, name
    missing = {n for n, (_, required) in expected.items() if required} - set(f.tensors)
    assert not missing
    tensors = dict(w.tensors)
    del tensors["blk.1.ffn_up.weight"]
    with pytest.raises(ModelFileError, match="blk.1.ffn_up.weight"):
        build_model(w.config, tensors, ref.RefKernels())


def test_qwen3_head_dim_and_qk_norms(synthetic_model, tmp_path):
    """qwen3's head_dim is key_length (here 2 * n_embd / n_head, as on Qwen3-0.6B): Q has n_head * head_dim
    rows, not n_embd; and a file without a layer's attn_q_norm is refused, naming the tensor."""
    from powerinfer_py.gguf import write_gguf

    path = synthetic_model("qwen3", "f32")
    f = open_gguf(path)
    c = load_weights(f, expected_tensors).config
    assert (c.head_dim, c.n_embd, c.n_head) == (32, 64, 4) and c.rope_neox and c.tied_output
    assert f.tensors["blk.0.attn_q.weight"].shape == (c.n_head * c.head_dim, c.n_embd)
    # the norms matter: unit norm weights give other logits
    model = load_model(path, ref.RefKernels())
    ours = model.forward(TOKENS[:6], model.new_cache(8), all_logits=True)
    plain = load_model(path, ref.RefKernels())
    for L in plain.layers:
        L.q_norm, L.k_norm = np.ones_like(L.q_norm), np.ones_like(L.k_norm)
    assert rel_err(plain.forward(TOKENS[:6], plain.new_cache(8), all_logits=True), ours) > 100 * TOL
    tensors = [t for name, t in f.tensors.items() if name != "blk.1.attn_q_norm.weight"]
    bad = write_gguf(tmp_path / "no-q-norm.gguf", f.metadata, tensors)
    with pytest.raises(ModelFileError, match=r"blk\.1\.attn_q_norm\.weight.*\(32,\)"):
        load_weights(open_gguf(bad), expected_tensors)


def test_unknown_arch_is_refused(synthetic_model):
    w = load_weights(open_gguf(synthetic_model("llama", "f32")))
    with pytest.raises(UnsupportedError, match="opt"):
        build_model(dataclasses.replace(w.config, arch="opt"), w.tensors, ref.RefKernels())


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_llama_cpp(synthetic_model, cpu_kernels, arch):
    """llama.cpp loads our synthetic files: same file, same tokens, its logits against ours."""
    path = synthetic_model(arch, "f32")
    model = load_model(path, cpu_kernels)
    ours = model.forward(TOKENS, model.new_cache(32), all_logits=True)
    theirs = llama_cpp_logits(path, TOKENS)
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    # llama.cpp differs from an exact f32 computation by ~3e-3 of the logits' spread (its CPU attention and
    # GELU work partly in f16); 1% is tight enough to catch any wrong op
    assert rel_err(ours, theirs) < 0.01


def test_synthetic_vocabulary_in_llama_cpp(synthetic_model):
    """The synthetic SentencePiece vocabulary works in llama.cpp: word pieces merge, unknown characters fall
    back to byte tokens, and text survives a round trip."""
    from powerinfer_py.synth.common import synthetic_vocab
    tokens, _, _ = synthetic_vocab(512)
    llm = llama_cpp.Llama(str(synthetic_model("llama", "f32")), vocab_only=True, verbose=False)
    try:
        ids = llm.tokenize("the one é".encode())
        assert ids[0] == 1  # <s> (add_bos)
        assert [tokens[i] for i in ids[1:]] == ["\u2581the", "\u2581one", "\u2581", "<0xC3>", "<0xA9>"]
        assert llm.detokenize(ids[1:]) == " the one é".encode()
    finally:
        llm.close()
