"""Qwen3.5 (arch "qwen35"): gated delta-net layers mixed with gated attention layers. The config read from the
ssm.* keys and full_attention_interval, tiny synthetic files (synth/qwen35.py) against llama.cpp on the same file (f32
and q8_0), the recurrent state carried across forward calls (one token at a time, a prefill in two parts), the
cache's all-or-nothing truncation and a chat whose conversation diverges, clear errors for broken files, the
sparse modes, and qwen35moe (the same layers with experts and a gated shared expert) against llama.cpp too.

The 6-layer file has delta-net layers 0, 1, 3, 4 and attention layers 2, 5 (full_attention_interval 3), so both
kinds feed both kinds; 2 key heads serve 4 value heads; 16 tokens let the 4-tap conv and the decaying state matter
at every position. How far off the usual mistakes would be (max |logit difference| / std of llama.cpp's logits on
the f32 file, measured by test_mistakes_are_visible): the right model 0.0012 against a tolerance of 0.01 (the
q8_0 file: 0.090 against 0.25; qwen35moe: 0.0022 and 0.099); no output gate on the attention layers: 3.0; no L2 norm of
q and k: 5.6; the decay applied after the delta-rule write instead of before: 4.6; value head h reading key head
h // 2 (a repeat, HF's repeat_interleave) instead of h mod 2 (llama.cpp's tiling): 5.8; the delta state not
carried into the second call of a prefill split 6 + 10: 5.3; q not scaled by 1/sqrt(d): 0.73.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (
    assert_chat_reuse_matches_fresh_prefill,
    F16_ROUNDING,
    assert_steps_and_split_match_prefill,
    info_text,
    load_model,
    rel_err,
    rewrite_gguf,
)

from powerinfer_py import load
from powerinfer_py.layers.cache import DeltaKVCache
from powerinfer_py.errors import ModelFileError, PowerInferError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import expected_tensors, qwen35, read_config
from powerinfer_py.models.qwen35 import Qwen35Model

# <s> then the pieces of "Hello world, th..." and a few more
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 301, 302, 303], dtype=np.int32)
TOL = 0.01  # as the other architectures' f32 files
QUANT_TOL = 0.25  # quantized files (tests/test_models.py's bound)


def all_logits(model, tokens=TOKENS) -> np.ndarray:
    return model.forward(tokens, model.new_cache(32), all_logits=True)


@pytest.fixture(scope="module")
def f32_file(synthetic_model):
    return synthetic_model("qwen35", "f32")


# ---- mutants (test_mistakes_are_visible) -----------------------------------------------------------------------

class NoOutputGate(Qwen35Model):
    """The attention layers' output not multiplied by sigmoid(gate)."""

    def _output_gate(self, a, gate):
        return a


class NoL2Norm(Qwen35Model):
    """q and k of the delta nets used as the conv gives them (q still scaled)."""

    def _delta_qkv(self, y):
        d, hk, _, _ = qwen35.delta_dims(self.config)
        n = y.shape[0]
        q = y[:, :hk * d].reshape(n, hk, d) / np.float32(np.sqrt(d))
        k = y[:, hk * d:2 * hk * d].reshape(n, hk, d)
        return self._key_heads(q), self._key_heads(k), super()._delta_qkv(y)[2]


class Unscaled(Qwen35Model):
    """q not scaled by 1/sqrt(d) (the L2 norm alone)."""

    def _delta_qkv(self, y):
        q, k, v = super()._delta_qkv(y)
        return q * np.float32(np.sqrt(self.config.ssm_d_state)), k, v


class DecayAfter(Qwen35Model):
    """S = exp(g) (S + beta (v - S k) k^T): the decay after the write instead of before it."""

    @staticmethod
    def _recur(S, q, k, v, beta, g):
        o = np.empty(v.shape, dtype=np.float32)
        for t in range(v.shape[0]):
            err = v[t] - np.einsum("hvk,hk->hv", S, k[t])
            S += (beta[t, :, None] * err)[:, :, None] * k[t][:, None, :]
            S *= np.exp(g[t])[:, None, None]
            o[t] = np.einsum("hvk,hk->hv", S, q[t])
        return o


class RepeatHeads(Qwen35Model):
    """Value head h reads key head h // (Hv / Hk) (a repeat, as HF's repeat_interleave) instead of h mod Hk."""

    def _key_heads(self, x):
        return np.repeat(x, self.config.ssm_n_v_heads // self.config.ssm_n_k_heads, axis=1)


class ForgetsDelta(Qwen35Model):
    """Each forward starts the delta states S from zero (the conv states are carried)."""

    def _delta_net(self, il, L, h, cache, p0):
        cache.delta[il][...] = 0
        return super()._delta_net(il, L, h, cache, p0)


def mutant_errors(path, kernels) -> dict[str, float]:
    """Each mutant's max |logit difference| / spread against llama.cpp on `path` (the module docstring's numbers)."""
    ref = llama_cpp_logits(path, TOKENS)
    out = {"right": rel_err(all_logits(load_model(path, kernels)), ref)}
    m = load_model(path, kernels, ForgetsDelta)
    cache = m.new_cache(32)
    first = m.forward(TOKENS[:6], cache, all_logits=True)
    out["stateless"] = rel_err(np.concatenate([first, m.forward(TOKENS[6:], cache, all_logits=True)]), ref)
    for name, cls in (("gate", NoOutputGate), ("l2", NoL2Norm), ("decay", DecayAfter), ("heads", RepeatHeads),
                      ("scale", Unscaled)):
        out[name] = rel_err(all_logits(load_model(path, kernels, cls)), ref)
    return out


# ---- config and file checks -----------------------------------------------------------------------------------

def test_config_and_info(f32_file):
    """Every full_attention_interval-th layer attends; the delta-net sizes come from the ssm.* keys; text M-RoPE
    is NeoX RoPE over rope.dimension_count dims; `powerinfer info` names the delta-net layers."""
    c = read_config(open_gguf(f32_file))
    assert c.arch == "qwen35" and c.rope_neox and c.tied_output and c.n_head_kv == 2 and c.n_rot == 16
    assert c.delta_layers == (True, True, False, True, True, False) and c.conv_kernel == 4
    assert (c.ssm_d_state, c.ssm_n_k_heads, c.ssm_n_v_heads) == (16, 2, 4)
    assert "delta-net layers     0, 1, 3, 4 (2 key / 4 value heads of 16, conv over 4 tokens)" in info_text(f32_file)


def test_attention_interval_defaults_to_4(f32_file, tmp_path):
    """Without full_attention_interval, llama.cpp makes every 4th layer attend: so do we."""
    c = read_config(open_gguf(rewrite_gguf(f32_file, tmp_path / "i4.gguf",
                                                     edit={"qwen35.full_attention_interval": None})))
    assert c.delta_layers == (True, True, True, False, True, True)


def test_missing_delta_tensor_is_named(f32_file, tmp_path):
    name = "blk.1.ssm_alpha.weight"
    with pytest.raises(ModelFileError, match=f"missing required tensor '{name}'"):
        load_weights(open_gguf(rewrite_gguf(f32_file, tmp_path / "missing.gguf", drop=(name,))), expected_tensors)


def test_bad_ssm_keys_are_refused(f32_file, tmp_path):
    """Value heads that are not a multiple of the key heads, a conv of one tap, and more multi-token-prediction
    blocks than blocks fail on the key."""
    with pytest.raises(ModelFileError, match="time_step_rank 3 .* not a multiple of ssm.group_count 2"):
        bad = rewrite_gguf(f32_file, tmp_path / "heads.gguf", edit={"qwen35.ssm.time_step_rank": 3})
        read_config(open_gguf(bad))
    with pytest.raises(ModelFileError, match="qwen35.ssm.conv_kernel must be at least 2"):
        read_config(open_gguf(rewrite_gguf(f32_file, tmp_path / "k1.gguf", edit={"qwen35.ssm.conv_kernel": 1})))
    with pytest.raises(ModelFileError, match=r"nextn_predict_layers 6 must be in 0..5 \(block_count 6\)"):
        read_config(open_gguf(rewrite_gguf(f32_file, tmp_path / "mtp.gguf",
                                                     edit={"qwen35.nextn_predict_layers": 6})))


# ---- against llama.cpp ----------------------------------------------------------------------------------------

# as the real files: as many key as value heads, RoPE on a quarter of 128-wide heads in sections 11, 11, 10, 0
REAL_SHAPE = dict(n_layer=4, full_attention_interval=4, n_k_heads=4, n_v_heads=4, head_dim=128, n_rot=64,
                  rope_sections=(11, 11, 10, 0), n_head=2, n_head_kv=1, seed=7)


@pytest.mark.parametrize("dtype,shape", [("f32", {}), ("q8_0", {}), ("f32", REAL_SHAPE)], ids=["f32", "q8_0", "real-shape"])
def test_logits_match_llama_cpp(synthetic_model, cpu_kernels, dtype, shape):
    """Same file, same 16 tokens: the logits at every position against llama.cpp's, and the same top-1 wherever
    llama.cpp's top two are not a near tie (measured: 0.0012, 0.090, real-shape 0.0009)."""
    path = synthetic_model("qwen35", dtype, **shape)
    ours, theirs = all_logits(load_model(path, cpu_kernels)), llama_cpp_logits(path, TOKENS)
    assert rel_err(ours, theirs) < (TOL if dtype == "f32" else QUANT_TOL)
    # the same top-1 wherever llama.cpp's top two lie further apart than twice the largest difference of the two
    # engines (every position on the f32 file, at least half of them on the q8_0 file)
    top2 = np.sort(theirs, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * np.abs(ours - theirs).max()
    assert clear.all() if dtype == "f32" else clear.sum() >= len(TOKENS) // 2, clear
    assert (ours.argmax(1) == theirs.argmax(1))[clear].all()


def test_mistakes_are_visible(f32_file, cpu_kernels):
    """Each mistake the test above must catch is far outside its tolerance (numbers: module docstring)."""
    errs = mutant_errors(f32_file, cpu_kernels)
    assert errs.pop("right") < TOL
    assert min(errs.values()) > 10 * TOL, errs


# ---- the recurrent state across calls ---------------------------------------------------------------------------

def test_steps_and_split_prefill_equal_one_prefill(f32_file, cpu_kernels):
    """One token at a time, and a prefill in two parts (6 + 10), continue each delta-net layer's conv and delta
    states: their logits are the single prefill's (up to the f16 K/V cache's rounding: a prefill runs the delta rule
    in closed-form chunks, a step token by token; model_checks.F16_ROUNDING)."""
    assert_steps_and_split_match_prefill(load_model(f32_file, cpu_kernels), TOKENS, 6, rel_tol=F16_ROUNDING)


def test_chunked_delta_rule_equals_the_recurrence():
    """The closed form over chunks (prefill: 150 tokens = 64 + 64 + 22) gives the token-by-token recurrence's
    outputs and final state, starting from a non-zero state, with decays down to exp(-3) per token."""
    rng = np.random.default_rng(1)
    n, H, d = 150, 4, 16
    q, k = (qwen35.l2norm(rng.standard_normal((n, H, d), dtype=np.float32), 1e-6) for _ in range(2))
    v = rng.standard_normal((n, H, d), dtype=np.float32)
    beta = rng.uniform(0, 1, (n, H)).astype(np.float32)
    g = -rng.uniform(0, 3, (n, H)).astype(np.float32)
    S0 = rng.standard_normal((H, d, d), dtype=np.float32)
    S1, S2 = S0.copy(), S0.copy()
    chunked = Qwen35Model._recur(S1, q, k, v, beta, g)
    steps = np.concatenate([Qwen35Model._recur(S2, q[t:t + 1], k[t:t + 1], v[t:t + 1], beta[t:t + 1], g[t:t + 1])
                            for t in range(n)])
    np.testing.assert_allclose(chunked, steps, rtol=0, atol=1e-4)
    np.testing.assert_allclose(S1, S2, rtol=0, atol=1e-4)


def test_cache_truncation_keeps_all_or_nothing(f32_file, cpu_kernels):
    """The states cannot be rewound: truncating to n_past keeps them, to anything shorter restarts at 0; a cache
    moved back by hand is refused."""
    m = load_model(f32_file, cpu_kernels)
    cache = m.new_cache(32)
    assert isinstance(cache, DeltaKVCache) and cache.k[0].nbytes == 0 and cache.k[2].nbytes > 0
    assert cache.delta[0].shape == (4, 16, 16) and cache.conv[0].shape == (3, 128) and cache.delta[2] is None
    m.forward(TOKENS[:8], cache)
    cache.truncate(8)
    assert cache.n_past == 8 and np.abs(cache.delta[0]).max() > 0
    cache.truncate(5)
    assert cache.n_past == 0
    np.testing.assert_allclose(m.forward(TOKENS, cache), all_logits(m)[-1], rtol=0, atol=1e-5)
    cache.n_past = 4  # a cache moved back without truncate
    with pytest.raises(PowerInferError, match="state is for position 16, not 4"):
        m.forward(TOKENS[4:6], cache)


def test_chat_reuse_and_divergence_match_a_fresh_prefill(f32_file):
    assert_chat_reuse_matches_fresh_prefill(f32_file)


# ---- sparse modes -----------------------------------------------------------------------------------------------

def test_threshold_mode_runs_and_moe_refuses(f32_file, synthetic_model, tmp_path):
    """The FFN is a plain SwiGLU: `powerinfer calibrate` at 50% writes cut-offs, and the calibrated file runs in
    threshold mode (its default) skipping about half of the neurons; qwen35moe refuses
    sparse modes with a clear error."""
    from powerinfer_py.tools.calibrate import calibrate
    from powerinfer_py.layers.ffn import resolve_sparse

    out = tmp_path / "t50.gguf"
    calibrate(f32_file, out, 0.5, text="hello world, the cat and the dog walk in the sun " * 4, n_tokens=60, ctx=32,
              threads=1)
    with load(out, threads=1) as llm, load(f32_file, threads=1) as dense:
        assert llm.model.sparse.mode == "threshold"
        sparse = all_logits(llm.model)
        assert all(0.3 < f < 0.7 for f in llm.model.sparsity.fractions), llm.model.sparsity.fractions
        # random weights have no trained sparsity: skipping half of the neurons moves the logits (3.2 spreads)
        assert np.isfinite(sparse).all() and rel_err(sparse, all_logits(dense.model)) > 0.1
    moe = read_config(open_gguf(synthetic_model("qwen35moe", "f32")))
    with pytest.raises(UnsupportedError, match="mixture of experts"):
        resolve_sparse(moe, "threshold")


# ---- qwen35moe ----------------------------------------------------------------------------------------------------

def test_qwen35moe_matches_llama_cpp(synthetic_model, cpu_kernels):
    """Experts (4, 2 used, softmax, renormalized) plus the sigmoid-gated shared expert in every layer: the f32 file
    against llama.cpp, one token at a time against the prefill, and the shared expert's gate visible."""
    path = synthetic_model("qwen35moe", "f32")
    c = read_config(open_gguf(path))
    assert c.n_expert == 4 and c.n_expert_used == 2 and c.expert_weights_norm and c.n_ff_shexp == 128
    ours, theirs = all_logits(load_model(path, cpu_kernels)), llama_cpp_logits(path, TOKENS)
    assert rel_err(ours, theirs) < TOL
    m = load_model(path, cpu_kernels)
    cache = m.new_cache(32)
    steps = np.stack([m.forward(TOKENS[i:i + 1], cache) for i in range(len(TOKENS))])
    np.testing.assert_allclose(steps, ours, rtol=0, atol=1e-4 * ours.std())
    for ffn in m.ffns:
        ffn.shared_gate = None  # the shared expert added ungated
    assert rel_err(all_logits(m), theirs) > 10 * TOL


def test_qwen35moe_q8_0_matches_llama_cpp(synthetic_model, cpu_kernels):
    """The Q8_0 file (measured: 0.099 of the spread)."""
    path = synthetic_model("qwen35moe", "q8_0")
    assert rel_err(all_logits(load_model(path, cpu_kernels)), llama_cpp_logits(path, TOKENS)) < QUANT_TOL


# ---- files as llama.cpp's converter writes them now: a multi-token-prediction block and recurrent_layers ----------

@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_mtp_blocks_are_skipped_like_llama_cpp(synthetic_model, cpu_kernels, tmp_path, arch):
    """The converter appends nextn_predict_layers full-attention blocks with nextn.* tensors (counted in block_count)
    and writes attention.recurrent_layers: the main pass runs only the first block_count - nextn blocks, as
    llama.cpp does on the same file, and gives the bits of that file with the MTP block cut out."""
    path = synthetic_model(arch, "f32", nextn=1, recurrent_layers=True)
    f = open_gguf(path)
    c = read_config(f)
    assert c.n_layer == 6 and c.n_nextn == 1 and c.delta_layers == (True, True, False, True, True, False)
    assert "1 next-token-prediction block(s) in the file, not run" in info_text(path)
    ours = all_logits(load_model(path, cpu_kernels))
    assert rel_err(ours, llama_cpp_logits(path, TOKENS)) < TOL
    cut = rewrite_gguf(path, tmp_path / "cut.gguf", drop=[n for n in f.tensors if n.startswith("blk.6.")],
                       edit={f"{arch}.block_count": 6, f"{arch}.nextn_predict_layers": None,
                             f"{arch}.attention.recurrent_layers": None})
    np.testing.assert_array_equal(all_logits(load_model(cut, cpu_kernels)), ours)


def test_recurrent_layers_key_decides_the_layer_kinds(f32_file, tmp_path, cpu_kernels):
    """attention.recurrent_layers overrides full_attention_interval (llama.cpp reads it first); a wrong length or an
    MTP block marked recurrent is a clear error."""
    flags = [True, True, False, True, True, False]
    good = rewrite_gguf(f32_file, tmp_path / "flags.gguf",
                        edit={"qwen35.attention.recurrent_layers": flags, "qwen35.full_attention_interval": 5})
    assert read_config(open_gguf(good)).delta_layers == tuple(flags)
    short = rewrite_gguf(f32_file, tmp_path / "short.gguf", edit={"qwen35.attention.recurrent_layers": flags[:4]})
    with pytest.raises(ModelFileError, match="recurrent_layers must hold one flag per block"):
        read_config(open_gguf(short))
