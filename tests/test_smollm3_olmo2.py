"""SmolLM3 (arch "smollm3") and OLMo 2 (arch "olmo2"): the config read from metadata, tiny synthetic files
against llama.cpp on the same file (f32 and q8_0), the one-call decode step against the Python path (bit for
bit), decode steps against one prefill, and clear errors for broken or unsupported files.

How far off the usual mistakes would be (max |logit difference| / std of llama.cpp's logits on the f32 files
below, measured with the mutants of test_mistakes_are_visible): smollm3 with RoPE on every layer (the NoPE
layer il = 3 rotated) 0.42, smollm3 with NeoX RoPE 3.0; olmo2 with per-head instead of whole-width Q/K norms
0.55, olmo2 with normal instead of NeoX RoPE 1.4. The correct models are off by 0.0023 (smollm3) and 0.0015
(olmo2), against a tolerance of 0.01. On the 8-layer smollm3 file (0.0020 when right), RoPE switched off on the
last layer only would be off by 0.43, on layer 3 only by 0.18: the step of 4 is what llama.cpp runs.
OLMo 3 (olmo2 with a window of 4 on layers 0-2, 12 tokens): 0.0018; with YaRN (factor 4) 0.0019, Q8_0 0.076;
on that YaRN file, no window would be off by 4.8, YaRN applied to the window layers too by 0.65.
"""
from __future__ import annotations


import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import assert_fused_decode_equals_python, load_model, rel_err

from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.writer import write_gguf
from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import expected_tensors, read_config
from powerinfer_py.models.olmo2 import Olmo2Model

# <s> then the pieces of "Hello world, th"
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)
TOL = 0.01  # as tests/test_gemma2.py: llama.cpp's f16 rounding of q in attention costs a few 1e-3 of the spread
QUANT_TOL = 0.25  # quantized files (tests/test_models.py's bound); measured: smollm3 0.095, olmo2 0.042


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def kern(request):
    k = CpuKernels(n_threads=request.param)
    yield k
    k.close()


def all_logits(model) -> np.ndarray:
    return model.forward(TOKENS, model.new_cache(32), all_logits=True)


class PerHeadQKNorm(Olmo2Model):
    """A wrong OLMo 2: Q and K normalized per head (as qwen3 does) with the same weights, split per head."""

    def _qkv(self, L, h, n):
        c, k = self.config, self.kernels
        q = k.matmul(L.wq, h).reshape(n, c.n_head, c.head_dim)
        kk = k.matmul(L.wk, h).reshape(n, c.n_head_kv, c.head_dim)
        q = k.rmsnorm(q, None, c.norm_eps) * L.q_norm.reshape(c.n_head, c.head_dim)
        kk = k.rmsnorm(kk, None, c.norm_eps) * L.k_norm.reshape(c.n_head_kv, c.head_dim)
        v = k.matmul(L.wv, h).reshape(n, c.n_head_kv, c.head_dim)
        return np.ascontiguousarray(q, np.float32), np.ascontiguousarray(kk, np.float32), v


class YarnEverywhere(Olmo2Model):
    """A wrong OLMo 3: the window layers rotated with the file's YaRN scaling too."""

    def layer_attention(self):
        return [(w, self.rope_args()) for w, _ in super().layer_attention()]


# ---- config -------------------------------------------------------------------------------------------------

def test_config(synthetic_model):
    """smollm3: normal RoPE, every 4th layer ((il + 1) % 4 == 0) without it, tied head; olmo2: NeoX RoPE for
    all layers, separate output head."""
    c = read_config(open_gguf(synthetic_model("smollm3", "f32", n_layer=8)))
    assert c.arch == "smollm3" and not c.rope_neox and c.tied_output and c.n_rot == c.head_dim
    assert c.no_rope_layers == (False, False, False, True, False, False, False, True)
    c = read_config(open_gguf(synthetic_model("olmo2", "f32")))
    assert c.arch == "olmo2" and c.rope_neox and not c.tied_output and c.no_rope_layers == ()
    assert c.attn_scale == pytest.approx(c.head_dim ** -0.5) and c.sliding_window == 0


OLMO3 = dict(n_layer=4, sliding_window=4, n_ctx_train=64)  # layers 0-2 windowed, layer 3 global (period 4)
OLMO3_YARN = dict(OLMO3, rope_scaling=(("type", "yarn"), ("factor", 4.0), ("original_context_length", 8)))


def test_olmo3_config(synthetic_model, tmp_path):
    """OLMo 3 (olmo2 with attention.sliding_window): 3 of every 4 layers windowed unless
    attention.sliding_window_pattern says otherwise (one bool per layer); the window layers' RoPE base is
    rope.freq_base_swa when given; a pattern of the wrong length is a clear error."""
    path = synthetic_model("olmo2", "f32", **OLMO3)
    c = read_config(open_gguf(path))
    assert c.sliding_window == 4 and c.swa_layers == (True, True, True, False)
    assert c.rope_freq_base_swa == c.rope_freq_base
    f = open_gguf(path)
    tensors = list(f.tensors.values())
    meta = dict(f.metadata, **{"olmo2.attention.sliding_window_pattern": [True, False, True, False],
                               "olmo2.rope.freq_base_swa": 5000.0})
    c = read_config(open_gguf(write_gguf(tmp_path / "pattern.gguf", meta, tensors)))
    assert c.swa_layers == (True, False, True, False) and c.rope_freq_base_swa == 5000.0
    meta["olmo2.attention.sliding_window_pattern"] = [True, False]
    with pytest.raises(ModelFileError, match="sliding_window_pattern has 2 entries for 4 layers"):
        read_config(open_gguf(write_gguf(tmp_path / "short.gguf", meta, tensors)))


# ---- against llama.cpp ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,dtype,shape", [("smollm3", "f32", dict(n_layer=4)), ("smollm3", "f32", dict(n_layer=8)),
                                              ("smollm3", "q8_0", dict(n_layer=4)), ("olmo2", "f32", dict(n_layer=2)),
                                              ("olmo2", "q8_0", dict(n_layer=2)), ("olmo2", "f32", OLMO3),
                                              ("olmo2", "f32", OLMO3_YARN), ("olmo2", "q8_0", OLMO3_YARN)],
                         ids=["smollm3-4", "smollm3-8", "smollm3-q8_0", "olmo2", "olmo2-q8_0", "olmo3", "olmo3-yarn",
                              "olmo3-yarn-q8_0"])
def test_logits_match_llama_cpp(synthetic_model, cpu_kernels, arch, dtype, shape):
    """Same file, same tokens: the logits at every position against llama.cpp's. smollm3 with 8 layers: the
    NoPE layers are 3 and 7 (a step of 4), not only the last one. OLMo 3: 12 tokens through a window of 4 on
    layers 0-2, and with YaRN, which llama.cpp applies to the global layer only."""
    path = synthetic_model(arch, dtype, **shape)
    ours, theirs = all_logits(load_model(path, cpu_kernels)), llama_cpp_logits(path, TOKENS)
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    assert rel_err(ours, theirs) < (TOL if dtype == "f32" else QUANT_TOL)


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    """The mistakes the test above must catch are each far outside its tolerance (numbers: module docstring)."""
    path = synthetic_model("smollm3", "f32")
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels, no_rope_layers=())), theirs) > 10 * TOL
    assert rel_err(all_logits(load_model(path, cpu_kernels, rope_neox=True)), theirs) > 10 * TOL
    path = synthetic_model("olmo2", "f32")
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels, PerHeadQKNorm)), theirs) > 10 * TOL
    assert rel_err(all_logits(load_model(path, cpu_kernels, rope_neox=False)), theirs) > 10 * TOL
    path = synthetic_model("olmo2", "f32", **OLMO3_YARN)
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels, sliding_window=0)), theirs) > 10 * TOL
    assert rel_err(all_logits(load_model(path, cpu_kernels, YarnEverywhere)), theirs) > 10 * TOL


# ---- one token at a time ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,dtype,shape", [("smollm3", "f32", {}), ("smollm3", "q8_0", {}), ("olmo2", "f32", {}),
                                              ("olmo2", "q8_0", {}), ("olmo2", "f32", OLMO3_YARN)],
                         ids=["smollm3", "smollm3-q8_0", "olmo2", "olmo2-q8_0", "olmo3-yarn"])
def test_fused_decode_equals_python_path(synthetic_model, kern, arch, dtype, shape):
    """Prompt of 3 tokens, then one at a time: the one-call C attention block (smollm3: n_rot 0 on layer 3;
    olmo2: no pre-norm, whole-width Q/K norms, output norm) gives the Python path's logits and KV cache bit for
    bit, and the steps agree with one prefill of all tokens."""
    model = load_model(synthetic_model(arch, dtype, **shape), kern)
    assert_fused_decode_equals_python(model, TOKENS)


# ---- broken files ------------------------------------------------------------------------------------------------

def test_broken_olmo2_file_names_the_tensor(synthetic_model, tmp_path):
    src = synthetic_model("olmo2", "f32")
    f = open_gguf(src)
    name = "blk.1.attn_k_norm.weight"  # whole width: n_head_kv * head_dim = 32 values, not head_dim = 16
    tensors = [t for n, t in f.tensors.items() if n != name]
    with pytest.raises(ModelFileError, match=f"missing required tensor '{name}'"):
        load_weights(open_gguf(write_gguf(tmp_path / "missing.gguf", f.metadata, tensors)), expected_tensors)


def test_whole_width_norm_plan_checks_sizes(synthetic_model):
    """attn_block_plan with qk_norm_full takes q_norm [n_head * head_dim] and k_norm [n_head_kv * head_dim];
    per-head-sized weights (or the reverse) are refused with the name of the norm."""
    k = CpuKernels(1)
    model = load_model(synthetic_model("olmo2", "f32"), k)
    L, c = model.layers[0], model.config
    shape = dict(n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim, n_rot=c.n_rot, rope_base=1e4,
                 rope_scale=1.0, rope_neox=True, eps=1e-6, attn_scale=0.25)
    k.steps.attn_block_plan(L.wq, L.wk, L.wv, L.wo, None, None, q_norm=L.q_norm, k_norm=L.k_norm, qk_norm_full=True,
                            **shape)
    with pytest.raises(ValueError, match="q_norm must be"):
        k.steps.attn_block_plan(L.wq, L.wk, L.wv, L.wo, None, None, q_norm=L.q_norm[:c.head_dim].copy(),
                                k_norm=L.k_norm, qk_norm_full=True, **shape)
    with pytest.raises(ValueError, match="k_norm must be"):
        k.steps.attn_block_plan(L.wq, L.wk, L.wv, L.wo, None, None, q_norm=L.q_norm[:c.head_dim].copy(),
                                k_norm=L.k_norm, **shape)
    k.close()
