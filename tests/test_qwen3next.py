"""Qwen3-Next (arch "qwen3next"): qwen35moe's layers with ssm_in / ssm_ba fused per key head, value heads reading
key heads by repeat, plain NeoX RoPE. Tiny synthetic files (synth/qwen35.py, arch "qwen3next") against llama.cpp on
the same file (f32, q8_0, the newer attn_qkv + attn_gate layout, layer kinds set by attention.recurrent_layers),
the recurrent state across calls, a chat whose conversation diverges, and clear errors for broken files.

The 6-layer file has delta-net layers 0, 1, 3, 4 and attention layers 2, 5; 2 key heads serve 4 value heads (r = 2),
every layer has 4 experts (2 used) and a gated shared expert; 16 tokens. How far off each difference from qwen35
would be if done qwen35's way (max |logit difference| / std of llama.cpp's logits on the f32 file, measured by
test_mistakes_are_visible): the right model 0.0008 against a tolerance of 0.01 (q8_0 file: 0.128 against 0.25);
ssm_in split as consecutive blocks q | k | v | z over all heads instead of per key head: 6.4; ssm_ba split as beta
| alpha instead of per key head: 4.5; key heads tiled (value head h reads key head h mod Hk, qwen35's order)
instead of repeated (h // r): 5.4; RoPE on (2i, 2i+1) pairs instead of NeoX pairs: 1.0; the shared expert added
without its sigmoid gate: 4.7. The routers' top-2 / top-3 margin is checked so no expert choice is a near tie.
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

from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.layers.ffn import resolve_sparse
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import expected_tensors, qwen3next, read_config
from powerinfer_py.models.qwen3next import Qwen3NextModel
from powerinfer_py.models.qwen35 import Qwen35Model
from powerinfer_py.synth.qwen35 import fuse_ba, fuse_qkvz
from powerinfer_py.gguf.types import GGMLType, Tensor

# <s> then the pieces of "Hello world, th..." and a few more
TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 301, 302, 303], dtype=np.int32)
TOL = 0.01
QUANT_TOL = 0.25


def all_logits(model, tokens=TOKENS) -> np.ndarray:
    return model.forward(tokens, model.new_cache(32), all_logits=True)


@pytest.fixture(scope="module")
def f32_file(synthetic_model):
    return synthetic_model("qwen3next", "f32")


# ---- mutants: each difference from qwen35 done qwen35's way ------------------------------------------------------

def _blocks_qkvz(d, hk, hv):
    """ssm_in read as consecutive q | k | v | z blocks over all heads."""
    n = 2 * hk * d + hv * d
    return np.arange(n), np.arange(n, n + hv * d)


class BlockQKVZ(Qwen3NextModel):
    qkvz_rows = staticmethod(_blocks_qkvz)


class BlockBA(Qwen3NextModel):
    ba_rows = staticmethod(lambda hk, hv: (np.arange(hv), np.arange(hv, 2 * hv)))


class TiledHeads(Qwen3NextModel):
    def _key_heads(self, x):
        return Qwen35Model._key_heads(self, x)


def mutant_errors(path, kernels) -> dict[str, float]:
    ref = llama_cpp_logits(path, TOKENS)
    out = {"right": rel_err(all_logits(load_model(path, kernels)), ref)}
    for name, cls in (("qkvz", BlockQKVZ), ("ba", BlockBA), ("heads", TiledHeads)):
        out[name] = rel_err(all_logits(load_model(path, kernels, cls)), ref)
    out["rope"] = rel_err(all_logits(load_model(path, kernels, rope_neox=False)), ref)
    m = load_model(path, kernels)
    for ffn in m.ffns:
        ffn.shared_gate = None
    out["shared"] = rel_err(all_logits(m), ref)
    return out


# ---- config, splitting, file checks ------------------------------------------------------------------------------

def test_config_and_info(f32_file):
    c = read_config(open_gguf(f32_file))
    assert c.arch == "qwen3next" and c.rope_neox and c.n_rot == 16 and c.tied_output
    assert c.delta_layers == (True, True, False, True, True, False)
    assert (c.ssm_d_state, c.ssm_n_k_heads, c.ssm_n_v_heads, c.conv_kernel) == (16, 2, 4, 4)
    assert c.n_expert == 4 and c.n_expert_used == 2 and c.expert_weights_norm and c.n_ff_shexp == 128
    text = info_text(f32_file)
    assert "runnable             yes" in text and "delta-net layers     0, 1, 3, 4" in text
    with pytest.raises(UnsupportedError, match="mixture of experts"):
        resolve_sparse(c, "threshold")


def test_refused_files(f32_file, tmp_path):
    """recurrent_layers of the wrong length, and a file without experts (llama.cpp refuses it too)."""
    with pytest.raises(ModelFileError, match=r"attention.recurrent_layers must hold one flag per block \(6\)"):
        read_config(open_gguf(rewrite_gguf(f32_file, tmp_path / "flags.gguf",
                                                     edit={"qwen3next.attention.recurrent_layers": [True] * 5})))
    with pytest.raises(ModelFileError, match="expert_count"):
        read_config(open_gguf(rewrite_gguf(f32_file, tmp_path / "dense.gguf",
                                                     edit={"qwen3next.expert_count": None})))


def test_mtp_block_is_skipped_like_llama_cpp(synthetic_model, cpu_kernels, tmp_path):
    """The converter's default file: a trailing multi-token-prediction block (counted in block_count, flagged not
    recurrent): the main pass runs the first 6 blocks, as llama.cpp does, with the bits of the file without it."""
    path = synthetic_model("qwen3next", "f32", nextn=1, recurrent_layers=True)
    f = open_gguf(path)
    c = read_config(f)
    assert c.n_layer == 6 and c.n_nextn == 1
    ours = all_logits(load_model(path, cpu_kernels))
    assert rel_err(ours, llama_cpp_logits(path, TOKENS)) < TOL
    cut = rewrite_gguf(path, tmp_path / "cut.gguf", drop=[n for n in f.tensors if n.startswith("blk.6.")],
                       edit={"qwen3next.block_count": 6, "qwen3next.nextn_predict_layers": None,
                             "qwen3next.attention.recurrent_layers": None})
    np.testing.assert_array_equal(all_logits(load_model(cut, cpu_kernels)), ours)


def test_split_inverts_the_fusion():
    """The load-time split picks exactly the rows the per-key-head fusion put there (Hk 3, r 2, d 4)."""
    d, hk, hv, E = 4, 3, 6, 5
    rng = np.random.default_rng(0)
    qkv, z = rng.standard_normal((2 * hk * d + hv * d, E)), rng.standard_normal((hv * d, E))
    beta, alpha = rng.standard_normal((hv, E)), rng.standard_normal((hv, E))
    rows_qkv, rows_z = qwen3next.qkvz_rows(d, hk, hv)
    fused = fuse_qkvz(qkv, z, d, hk)
    np.testing.assert_array_equal(fused[rows_qkv], qkv)
    np.testing.assert_array_equal(fused[rows_z], z)
    rows_b, rows_a = qwen3next.ba_rows(hk, hv)
    fused = fuse_ba(beta, alpha, hk)
    np.testing.assert_array_equal(fused[rows_b], beta)
    np.testing.assert_array_equal(fused[rows_a], alpha)
    # group g of ssm_in starts with key head g's q rows
    np.testing.assert_array_equal(fuse_qkvz(qkv, z, d, hk)[(2 * d + 4 * d):(2 * d + 4 * d) + d], qkv[d:2 * d])


def test_broken_files_are_named(f32_file, tmp_path):
    with pytest.raises(ModelFileError, match="missing required tensor 'blk.1.ssm_ba.weight'"):
        load_model(rewrite_gguf(f32_file, tmp_path / "noba.gguf", drop=("blk.1.ssm_ba.weight",)), None)
    with pytest.raises(ModelFileError, match=r"'blk.3.ssm_in.weight' \(or blk.3.attn_qkv.weight and"):
        load_model(rewrite_gguf(f32_file, tmp_path / "noin.gguf", drop=("blk.3.ssm_in.weight",)), None)
    # an ssm_in whose rows do not fit the ssm.* sizes (one key head's group short)
    short = Tensor("blk.0.ssm_in.weight", GGMLType.F32, (160, 64), np.zeros((160, 64), np.float32))
    bad = rewrite_gguf(f32_file, tmp_path / "short.gguf", drop=("blk.0.ssm_in.weight",), extra=(short,))
    with pytest.raises(ModelFileError, match=r"tensor 'blk.0.ssm_in.weight' has shape \(160, 64\), expected \(192, 64\)"):
        load_weights(open_gguf(bad), expected_tensors)


# ---- against llama.cpp ---------------------------------------------------------------------------------------------

# layer kinds by attention.recurrent_layers, not by the interval (layer 0 a delta net: files whose layer 0 attends
# amplify both engines' rounding several times more on these random weights, measured, and need a looser bound)
FLAGS = (True, False, True, True, False, True)


@pytest.mark.parametrize("dtype,opts", [("f32", {}), ("q8_0", {}), ("f32", {"ssm_in": False}),
                                        ("f32", {"recurrent_layers": FLAGS})],
                         ids=["f32", "q8_0", "attn_qkv-layout", "recurrent_layers"])
def test_logits_match_llama_cpp(synthetic_model, cpu_kernels, dtype, opts):
    """Same file, same 16 tokens: every position's logits against llama.cpp's, and the same top-1 wherever
    llama.cpp's top two lie further apart than twice the largest difference (measured: 0.0008, 0.128, 0.0008,
    0.0018)."""
    path = synthetic_model("qwen3next", dtype, **opts)
    want = opts.get("recurrent_layers", (True, True, False, True, True, False))  # default: every 3rd attends
    assert read_config(open_gguf(path)).delta_layers == want
    ours, theirs = all_logits(load_model(path, cpu_kernels)), llama_cpp_logits(path, TOKENS)
    assert rel_err(ours, theirs) < (TOL if dtype == "f32" else QUANT_TOL)
    top2 = np.sort(theirs, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * np.abs(ours - theirs).max()
    assert clear.all() if dtype == "f32" else clear.sum() >= len(TOKENS) // 2, clear
    assert (ours.argmax(1) == theirs.argmax(1))[clear].all()


def test_routers_have_no_near_ties(f32_file, cpu_kernels):
    """At every layer and token the second- and third-largest router logits of the f32 file differ by more than
    5e-3 (measured: 7.7e-3), far above the two engines' difference there, so both pick the same experts."""
    m = load_model(f32_file, cpu_kernels)
    gaps = []
    for ffn in m.ffns:
        def recording(x, logits=None, ffn=ffn, route=ffn.route):
            top = np.sort(cpu_kernels.matmul(ffn.router, x), axis=1)
            gaps.append(float((top[:, -2] - top[:, -3]).min()))
            return route(x, logits)
        ffn.route = recording
    all_logits(m)
    assert len(gaps) == 6 and min(gaps) > 5e-3, gaps


def test_mistakes_are_visible(f32_file, cpu_kernels):
    errs = mutant_errors(f32_file, cpu_kernels)
    assert errs.pop("right") < TOL
    assert min(errs.values()) > 10 * TOL, errs


# ---- the recurrent state across calls --------------------------------------------------------------------------------

def test_steps_and_split_prefill_equal_one_prefill(f32_file, cpu_kernels):
    assert_steps_and_split_match_prefill(load_model(f32_file, cpu_kernels), TOKENS, 7, rel_tol=F16_ROUNDING)


def test_chat_reuse_and_divergence_match_a_fresh_prefill(f32_file):
    assert_chat_reuse_matches_fresh_prefill(f32_file)
