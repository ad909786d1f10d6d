"""Cohere (archs "command-r" and "cohere2"): one LayerNorm (no bias) feeding attention and a SwiGLU FFN in
parallel, a tied head times logit_scale; command-r files of 64+ layers have per-head Q/K LayerNorms (Command R+);
cohere2 has sliding-window layers with RoPE and global layers without. Tiny synthetic files (synth/command_r.py)
against llama.cpp on the same file, one token at a time against the batch, and broken files.

How far off the mistakes would be (max |logit difference| / std of llama.cpp's logits; measured by
test_mistakes_are_visible, printed with -s): the right model 0.0014 (cohere2, 4 layers, window 4, partial RoPE);
cohere2 with RoPE on its global layer too 0.33, without its window 4.6; the logit scale (0.25) dropped 13.5; a
sequential block (FFN after the attention, on the LayerNorm of the updated residual) 5.1; NeoX instead of normal
RoPE 0.90; command-r's per-head Q/K norms left out (64 layers) 1.02.
Agreement of the right model (test_logits_match_llama_cpp): command-r 0.0010 (F32) / 0.056 (Q8_0), 64 layers
with Q/K norms 0.0016 / 0.087, cohere2 0.0014 / 0.057, with a per-layer pattern 0.0015 / 0.072; one token at a
time gave the batch's logits bit for bit on every file.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import batch_and_steps, info_text, load_model, rel_err, rewrite_gguf

from powerinfer_py import load
from powerinfer_py.tools.calibrate import calibrate
from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.models.command_r import CohereModel
from powerinfer_py.tools.perplexity import perplexity
from powerinfer_py.gguf.types import GGMLType, Tensor

# 12 tokens: longer than the window of 4, so cohere2's sliding layers drop positions the global ones still see
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322], dtype=np.int32)
TOL, QUANT_TOL = 0.01, 0.25
TEXT = "the cat and the dog run in the sun, then the red tree and the big house were there. " * 4
# cohere2, 4 layers: 0-2 slide with RoPE, 3 is global without; partial RoPE (8 of 16 dims, rotary_pct 0.5)
COHERE2 = dict(n_layer=4, n_rot=8)
COMMAND_R_PLUS = dict(n_layer=64)  # the depth at which llama.cpp reads the per-head Q/K norms


def all_logits(model) -> np.ndarray:
    return model.forward(TOKENS, model.new_cache(32), all_logits=True)


class RopeEverywhere(CohereModel):
    """Wrong: RoPE on cohere2's global layers too."""

    def layer_attention(self):
        c = self.config
        return [(c.sliding_window if swa else 0, self.rope_args()) for swa in c.swa_layers]


class Sequential(CohereModel):
    """Wrong: a sequential block, x += attn(norm(x)); x += ffn(norm(x)) with the same attn_norm."""

    def forward(self, tokens, cache, all_logits=False):
        c, k = self.config, self.kernels
        ids, pos, p0 = self._begin(tokens, cache)
        n, hd = ids.shape[0], c.head_dim
        x = k.get_rows(self.token_embd, ids)
        for il, (L, (window, rope)) in enumerate(zip(self.layers, self.layer_attention())):
            h = k.layernorm(x, L.attn_norm, None, c.norm_eps)
            q = self._head_norm(k.matmul(L.wq, h).reshape(n, c.n_head, hd), L.q_norm)
            kk = self._head_norm(k.matmul(L.wk, h).reshape(n, c.n_head_kv, hd), L.k_norm)
            if rope[0]:
                k.rope(q, pos, *rope)
                k.rope(kk, pos, *rope)
            self._store_kv(cache, il, p0, kk, k.matmul(L.wv, h).reshape(n, c.n_head_kv, hd))
            a = k.attention(q, cache.k[il], cache.v[il], p0, window, c.attn_scale)
            x += k.matmul(L.wo, a.reshape(n, c.n_head * hd))
            x += self.ffns[il](k.layernorm(x, L.attn_norm, None, c.norm_eps), x)
        cache.n_past = p0 + n
        return self._head(x, all_logits)


class NoQKNorms(CohereModel):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        for L in self.layers:
            L.q_norm = L.k_norm = None


def test_config_follows_llama_cpp(synthetic_model):
    """LayerNorm eps, normal RoPE, the logit scale (optional for command-r), cohere2's default period 4 and an
    explicit per-layer pattern, NoPE exactly on the global layers."""
    c = read_config(open_gguf(synthetic_model("cohere2", "f32", **COHERE2)))
    assert c.sliding_window == 4 and c.swa_layers == (True, True, True, False) and not c.rope_neox
    assert c.no_rope_layers == (False, False, False, True) and c.n_rot == 8 and c.logit_mul == 0.25
    c = read_config(open_gguf(synthetic_model("cohere2", "f32", n_layer=4, swa_pattern=(False, True, False, True))))
    assert c.swa_layers == (False, True, False, True) and c.no_rope_layers == (True, False, True, False)
    c = read_config(open_gguf(synthetic_model("command-r", "f32", logit_scale=None)))
    assert c.logit_mul == 1.0 and c.sliding_window == 0 and c.no_rope_layers == () and c.norm_eps == pytest.approx(1e-5)


@pytest.mark.parametrize("arch,dtype,shape", [
    ("command-r", "f32", {}), ("command-r", "q8_0", {}), ("command-r", "f32", COMMAND_R_PLUS),
    ("command-r", "q8_0", COMMAND_R_PLUS), ("cohere2", "f32", COHERE2), ("cohere2", "q8_0", COHERE2),
    ("cohere2", "f32", dict(n_layer=4, swa_pattern=(False, True, False, True)))],
    ids=["r-f32", "r-q8_0", "r-plus-f32", "r-plus-q8_0", "cohere2-f32", "cohere2-q8_0", "cohere2-pattern"])
def test_logits_match_llama_cpp(synthetic_model, arch, dtype, shape):
    """Every position's logits within TOL (QUANT_TOL at Q8_0) of llama.cpp's spread, the same top-1 at F32, and
    one token at a time (decode) giving the batch's (prefill) logits."""
    path = synthetic_model(arch, dtype, **shape)
    theirs = llama_cpp_logits(path, TOKENS)
    batch, steps = batch_and_steps(path, TOKENS)
    assert rel_err(batch, theirs) < (TOL if dtype == "f32" else QUANT_TOL)
    if dtype == "f32":
        assert (batch.argmax(1) == theirs.argmax(1)).all()
    np.testing.assert_allclose(steps, batch, rtol=0, atol=1e-4 * batch.std())


def test_mistakes_are_visible(synthetic_model, cpu_kernels):
    path = synthetic_model("cohere2", "f32", **COHERE2)
    theirs = llama_cpp_logits(path, TOKENS)
    right = rel_err(all_logits(load_model(path, cpu_kernels)), theirs)
    wrong = {"rope": rel_err(all_logits(load_model(path, cpu_kernels, RopeEverywhere)), theirs),
             "window": rel_err(all_logits(load_model(path, cpu_kernels, sliding_window=0)), theirs),
             "scale": rel_err(all_logits(load_model(path, cpu_kernels, logit_mul=1.0)), theirs),
             "seq": rel_err(all_logits(load_model(path, cpu_kernels, Sequential)), theirs),
             "neox": rel_err(all_logits(load_model(path, cpu_kernels, rope_neox=True)), theirs)}
    path = synthetic_model("command-r", "f32", **COMMAND_R_PLUS)
    wrong["qk"] = rel_err(all_logits(load_model(path, cpu_kernels, NoQKNorms)), llama_cpp_logits(path, TOKENS))
    print(f"right {right:.4f}", {k: round(v, 3) for k, v in wrong.items()})
    assert right < TOL and all(v > 10 * TOL for v in wrong.values()), wrong


def test_bad_files_are_named(synthetic_model, cpu_kernels, tmp_path):
    """Command R+'s Q/K norms are required at 64 layers, cohere2's logit_scale and sliding_window keys, and a
    fused attn_qkv is refused, never ignored; `powerinfer info` shows the arch."""
    plus = synthetic_model("command-r", "f32", **COMMAND_R_PLUS)
    bad = rewrite_gguf(plus, tmp_path / "no-qnorm.gguf", drop=["blk.7.attn_q_norm.weight"])
    with pytest.raises(ModelFileError, match="blk.7.attn_q_norm.weight"):
        load_model(bad, cpu_kernels)
    path = synthetic_model("cohere2", "f32", **COHERE2)
    for key in ("cohere2.logit_scale", "cohere2.attention.sliding_window"):
        with pytest.raises(ModelFileError, match=key):
            load_model(rewrite_gguf(path, tmp_path / "bad.gguf", edit={key: None}), cpu_kernels)
    f = open_gguf(path)
    q, k, v = (f.tensors[f"blk.0.attn_{x}.weight"] for x in "qkv")
    fused = Tensor("blk.0.attn_qkv.weight", GGMLType.F32, (q.shape[0] + 2 * k.shape[0], q.shape[1]),
                   np.concatenate([np.asarray(t.data) for t in (q, k, v)]))
    with pytest.raises(UnsupportedError, match="attn_qkv"):
        load_model(rewrite_gguf(path, tmp_path / "fused.gguf", extra=[fused]), cpu_kernels)
    assert "cohere2" in info_text(path) and "command-r" in info_text(plus)


def test_calibrate_and_threshold_mode(synthetic_model, tmp_path):
    """The FFN is the generic SwiGLU one, so `calibrate` and the threshold mode work: sparsity 0 gives the dense
    logits bit for bit, and a file calibrated at 0.5 skips about half of the FFN neurons on the calibration text."""
    path = synthetic_model("cohere2", "f32", **COHERE2)
    res = calibrate(path, tmp_path / "c2.t50.gguf", 0.5, text=TEXT, n_tokens=120, ctx=32, threads=1)
    with load(res.path, threads=1, sparse="off") as dense, \
            load(res.path, threads=1, sparse="threshold", sparsity=0) as zero:
        np.testing.assert_array_equal(all_logits(dense.model), all_logits(zero.model))
    with load(res.path, threads=1, sparse="threshold") as sparse:
        perplexity(sparse, TEXT, ctx=32, max_tokens=120)
        assert abs(sparse.sparsity_stats.skipped_fraction - 0.5) <= 0.05
