"""EXAONE 4 (arch "exaone4"): olmo2's block with per-head Q/K norms, rope_freqs.weight, and on 64-layer files only
sliding windows plus RoPE-less global layers. Tiny synthetic files against llama.cpp on the same file, the
one-call decode step against the Python path, MTP blocks skipped, and a broken file.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits; measured by
test_mistakes_are_visible): the right model 0.0010-0.0039 (f32; Q8_0 0.058); on the 64-layer file with a window
of 4, RoPE on the global layers too 1.03, no window 5.5; on a 4-layer file whose keys ask for a window (which
llama.cpp ignores at that depth) honouring it 3.5; rope_freqs.weight ignored 0.21.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import assert_fused_decode_equals_python, info_text, load_model, rel_err, rewrite_gguf

from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.models.exaone4 import Exaone4Model

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)
TOL, QUANT_TOL = 0.01, 0.25
FREQS = tuple(np.linspace(1.0, 4.0, 8).tolist())  # rope_freqs.weight: head_dim 16 / 2 factors
DEEP = dict(n_layer=64, sliding_window=4)  # the 32B's depth: windows on 3 of every 4 layers, no RoPE on the rest


def all_logits(model) -> np.ndarray:
    return model.forward(TOKENS, model.new_cache(32), all_logits=True)


class RopeEverywhere(Exaone4Model):
    """Wrong: RoPE on the global layers of a windowed file too."""

    def layer_attention(self):
        c = self.config
        return [(c.sliding_window if swa else 0, self.rope_args()) for swa in c.swa_layers]


class NoRopeFreqs(Exaone4Model):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rope_freqs = None


def test_config_follows_llama_cpp(synthetic_model):
    """Windows and RoPE-less layers only at 64 layers (default window 4096 without the key); other depths
    attend everywhere even with a sliding_window key."""
    c = read_config(open_gguf(synthetic_model("exaone4", "f32", **DEEP)))
    assert c.sliding_window == 4 and c.swa_layers[:4] == (True, True, True, False) and sum(c.swa_layers) == 48
    assert c.no_rope_layers == tuple(not s for s in c.swa_layers) and c.rope_neox
    c = read_config(open_gguf(synthetic_model("exaone4", "f32", n_layer=64)))
    assert c.sliding_window == 4096 and sum(c.swa_layers) == 48
    c = read_config(open_gguf(synthetic_model("exaone4", "f32", n_layer=4, sliding_window=4)))
    assert c.sliding_window == 0 and not any(c.swa_layers) and c.no_rope_layers == ()


@pytest.mark.parametrize("dtype,shape", [("f32", dict(n_layer=2)), ("f32", dict(n_layer=2, rope_freqs=FREQS)),
                                         ("q8_0", dict(n_layer=2)), ("f32", DEEP), ("f32", dict(n_layer=64)),
                                         ("f32", dict(n_layer=4, sliding_window=4))],
                         ids=["f32", "rope-freqs", "q8_0", "64-layers-window", "64-layers", "4-layers-window-key"])
def test_logits_match_llama_cpp(synthetic_model, cpu_kernels, dtype, shape):
    path = synthetic_model("exaone4", dtype, **shape)
    ours, theirs = all_logits(load_model(path, cpu_kernels)), llama_cpp_logits(path, TOKENS)
    assert rel_err(ours, theirs) < (TOL if dtype == "f32" else QUANT_TOL)
    if dtype == "f32":
        assert (ours.argmax(1) == theirs.argmax(1)).all()


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    path = synthetic_model("exaone4", "f32", **DEEP)
    theirs = llama_cpp_logits(path, TOKENS)
    assert rel_err(all_logits(load_model(path, cpu_kernels, RopeEverywhere)), theirs) > 10 * TOL
    assert rel_err(all_logits(load_model(path, cpu_kernels, sliding_window=0)), theirs) > 10 * TOL
    path = synthetic_model("exaone4", "f32", n_layer=4, sliding_window=4)
    theirs = llama_cpp_logits(path, TOKENS)
    windowed = load_model(path, cpu_kernels, sliding_window=4, swa_layers=(True, True, True, False))
    assert rel_err(all_logits(windowed), theirs) > 10 * TOL
    path = synthetic_model("exaone4", "f32", n_layer=2, rope_freqs=FREQS)
    assert rel_err(all_logits(load_model(path, cpu_kernels, NoRopeFreqs)), llama_cpp_logits(path, TOKENS)) > 10 * TOL


@pytest.mark.parametrize("shape", [dict(n_layer=2, rope_freqs=FREQS), DEEP], ids=["2-layers", "64-layers"])
def test_fused_decode_equals_python_path(synthetic_model, cpu_kernels, shape):
    assert_fused_decode_equals_python(load_model(synthetic_model("exaone4", "f32", **shape), cpu_kernels), TOKENS)


def test_mtp_block_is_not_run_and_broken_file_is_named(synthetic_model, cpu_kernels, tmp_path):
    """EXAONE 4.5 files: a trailing nextn block in block_count is left out (here: the file's last layer relabelled
    as one, so the logits equal a 1-layer run of the same weights); a missing per-head norm is named."""
    path = synthetic_model("exaone4", "f32", n_layer=2)
    mtp = rewrite_gguf(path, tmp_path / "mtp.gguf", edit={"exaone4.nextn_predict_layers": 1})
    c = read_config(open_gguf(mtp))
    assert c.n_layer == 1 and c.n_nextn == 1
    one = rewrite_gguf(path, tmp_path / "one.gguf", edit={"exaone4.block_count": 1},
                       drop=[n for n in open_gguf(path).tensors if n.startswith("blk.1.")])
    np.testing.assert_array_equal(all_logits(load_model(mtp, cpu_kernels)), all_logits(load_model(one, cpu_kernels)))
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", drop=["blk.1.attn_k_norm.weight"])
    with pytest.raises(ModelFileError, match="blk.1.attn_k_norm.weight"):
        load_model(bad, cpu_kernels)
    assert "exaone4" in info_text(path)
