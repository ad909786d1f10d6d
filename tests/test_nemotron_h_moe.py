"""Nemotron-H MoE (arch "nemotron_h_moe", Nemotron 3 Nano 30B-A3B's layout): nemotron_h's Mamba-2 / attention
stack with every FFN layer a mixture of ungated squared-ReLU experts (sigmoid router, selection bias, renormalized
and scaled weights, latent projections) plus a squared-ReLU shared expert; a trailing MTP block that is not run.

The file is synth/nemotron_h's "M-M*M-" (seed 1) with 8 experts (2 chosen), a 32-wide latent and one MTP block, against
llama.cpp on the same file (f32 and q8_0). Its routing has no near-ties (test_router_has_no_near_ties: the
smallest gap between the 2nd and 3rd selection score over every token and layer is asserted > MARGIN; measured
0.0039 and 0.0055 on the two expert layers; seed 0 had 0.0005 and is not used), so the
logits compare without a flipped choice. How far off the usual mistakes would be (max |logit difference| / std
of llama.cpp's logits on the f32 file, measured by test_mistakes_are_visible): the right model 0.00037 against a
tolerance of 0.01 (q8_0: 0.044 against 0.25); selection bias ignored: 3.3; no weight scale (2.5): 2.6; no
renormalization: 2.1; shared expert dropped: 2.8; relu instead of relu^2 in the experts: 2.3.
`--sparse exact` is refused on these experts: moe.py says why it would save nothing.
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import (assert_matches_llama_cpp, assert_steps_and_split_match_prefill, info_text, load_model,
                          rel_err, rewrite_gguf)

from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.layers.ffn import resolve_sparse
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import expected_tensors
from powerinfer_py.layers.nemotron_moe import NemotronMoE

TOKENS = np.array([1, 332, 292, 263, 270, 270, 273, 455, 276, 270, 262, 322, 300, 301, 302, 303], dtype=np.int32)
OPTS = {"moe_latent": 32, "n_nextn": 1, "seed": 1}
TOL, QUANT_TOL = 0.01, 0.25  # as tests/test_nemotron_h.py
MISTAKE = 0.5  # every mistake below is further off than this (measured: 2.07 and more)
MARGIN = 1e-3  # smallest gap between the last chosen and the first unchosen selection score


@pytest.fixture(scope="module")
def f32_file(synthetic_model):
    return synthetic_model("nemotron_h_moe", "f32", **OPTS)


@pytest.fixture(scope="module")
def reference(f32_file):
    return llama_cpp_logits(f32_file, TOKENS)


def all_logits(model) -> np.ndarray:
    return model.forward(TOKENS, model.new_cache(32), all_logits=True)


def expert_layers(model) -> list[NemotronMoE]:
    return [f for f in model.ffns if isinstance(f, NemotronMoE)]


def test_config_reads_experts_and_skips_the_mtp_block(f32_file):
    c = load_weights(open_gguf(f32_file), expected_tensors).config
    assert (c.arch, c.n_layer, c.n_nextn) == ("nemotron_h_moe", 6, 1)  # block_count 7: the MTP block left out
    assert c.ffn_layers == (False, True, False, False, False, True) and c.moe_layers == c.ffn_layers
    assert (c.n_expert, c.n_expert_used, c.moe_latent_size, c.expert_gating) == (8, 2, 32, "sigmoid")
    assert c.expert_weights_norm and c.expert_weights_scale == 2.5 and c.n_ff_shexp == c.n_ff_exp > 0


def test_logits_match_llama_cpp_f32(f32_file, cpu_kernels, reference):
    assert rel_err(all_logits(load_model(f32_file, cpu_kernels)), reference) < TOL
    assert_matches_llama_cpp(f32_file, TOKENS, TOL, same_top1=True)


def test_logits_match_llama_cpp_q8_0(synthetic_model):
    assert_matches_llama_cpp(synthetic_model("nemotron_h_moe", "q8_0", **OPTS), TOKENS, QUANT_TOL, same_top1=False)


def test_router_has_no_near_ties(f32_file, cpu_kernels):
    model = load_model(f32_file, cpu_kernels)
    gaps = []
    for f in expert_layers(model):
        route, moe = f.experts.route, f.experts

        def spy(x, logits=None, route=route, moe=moe):
            s = 1.0 / (1.0 + np.exp(-logits.astype(np.float64))) + moe.select_bias
            s = -np.sort(-s, axis=1)
            gaps.append((s[:, moe.n_used - 1] - s[:, moe.n_used]).min())
            return route(x, logits)
        f.experts.route = spy
    all_logits(model)
    print("router gaps", gaps)
    assert len(gaps) == 2 and min(gaps) > MARGIN, gaps


def test_prefill_in_two_parts_and_one_token_at_a_time(f32_file, cpu_kernels):
    assert_steps_and_split_match_prefill(load_model(f32_file, cpu_kernels), TOKENS, split=6)


def test_mistakes_are_visible(f32_file, cpu_kernels, reference):
    def mutated(change):
        model = load_model(f32_file, cpu_kernels)
        for f in expert_layers(model):
            change(f)
        return rel_err(all_logits(model), reference)

    far = {"selection bias ignored": mutated(lambda f: setattr(f.experts, "select_bias", None)),
           "no weight scale": mutated(lambda f: setattr(f.experts, "weights_scale", 1.0)),
           "no renorm": mutated(lambda f: setattr(f.experts, "norm_weights", False)),
           "shared expert dropped": mutated(lambda f: setattr(f, "shared", lambda n: np.float32(0))),
           "relu, not relu^2": mutated(lambda f: setattr(f.experts, "act", lambda g, u=None: np.maximum(g, 0)))}
    print({k: round(v, 2) for k, v in far.items()})
    assert min(far.values()) > MISTAKE, far


def test_missing_selection_bias_is_a_clear_error(f32_file, tmp_path):
    bad = rewrite_gguf(f32_file, tmp_path / "bad.gguf", drop=("blk.5.exp_probs_b.bias",))
    with pytest.raises(ModelFileError, match="blk.5.exp_probs_b.bias"):
        load(bad)
    half = rewrite_gguf(f32_file, tmp_path / "half.gguf", drop=("blk.1.ffn_latent_up.weight",))
    with pytest.raises(ModelFileError, match="latent"):
        load(half)


def test_sparse_exact_is_refused_on_the_experts(f32_file):
    c = load_weights(open_gguf(f32_file), expected_tensors).config
    with pytest.raises(UnsupportedError, match="experts"):
        resolve_sparse(c, "exact")


def test_info_lists_the_arch(f32_file):
    text = info_text(f32_file)
    assert "nemotron_h_moe" in text and "expert FFN 1, 5" in text and "dense FFN layers" not in text

