"""`powerinfer convert` for GraniteForCausalLM, SmolLM3ForCausalLM, Olmo2ForCausalLM (and Olmo3ForCausalLM) and ArceeForCausalLM: a tiny
random checkpoint per architecture (BF16 weights), converted to f32 GGUF, run by llama.cpp and by our engine
(one batch and token by token), each against a float64 numpy reference of the Hugging Face model
(hf_fixtures.hf_llama_forward).

The reference is sensitive to what each architecture changes (max |ours - reference| over the reference's
max |logit|, measured with the mutated reference; the tests pass below 2e-3):
  granite  without embedding_multiplier 0.37, residual_multiplier 0.13, attention_multiplier (1/sqrt(head_dim)
           instead) 0.023, logits_scaling 0.67
  smollm3  RoPE in every layer (layer 3 is NoPE) 0.11
  olmo2    without the whole-width Q/K norms 0.35; without the attention / MLP output norms 0.78
  arcee    relu instead of relu^2 0.44
As built: llama.cpp 1.5e-5 (granite) to 4.7e-4 (olmo2), our engine 1.3e-5 to 3.7e-4.
(MUTATIONS below; `PYTHONPATH=.:tests python tests/test_convert_more.py` prints them.)
"""
from __future__ import annotations

import numpy as np
import pytest
from llama_ref import llama_cpp_logits
from model_checks import batch_and_steps

from powerinfer_py.errors import UnsupportedError
from powerinfer_py.gguf.reader import open_gguf

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]
DIMS = dict(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=512)
# config.json additions per architecture (and the GGUF arch name it converts to)
CASES = {
    "GraniteForCausalLM": ("granite", dict(embedding_multiplier=6.0, residual_multiplier=0.4,
                                           attention_multiplier=0.1, logits_scaling=3.0)),
    "SmolLM3ForCausalLM": ("smollm3", dict(n_layer=4, no_rope_layers=[1, 1, 1, 0], no_rope_layer_interval=4,
                                           tied=True)),
    "Olmo2ForCausalLM": ("olmo2", dict(rope_theta=5e5)),
    "Olmo3ForCausalLM": ("olmo2", dict(rope_theta=5e5)),  # no window here: the reference has none
    "ArceeForCausalLM": ("arcee", dict(act="relu2")),
}


def _checkpoint(folder, hf_arch: str, seed: int = 3, **changes):
    """(stored weights, config) of a tiny BF16 checkpoint of hf_arch written to folder."""
    from hf_fixtures import llama_config, llama_weights, variant_weights, write_checkpoint

    extra = {**CASES[hf_arch][1], **changes}
    dims = {**DIMS, **{k: extra.pop(k) for k in list(extra) if k in DIMS}}
    tied = extra.pop("tied", False)
    cfg = llama_config(**dims, arch=hf_arch, tied=tied, **extra)
    rng = np.random.default_rng(seed)
    w = variant_weights(llama_weights(rng, **dims, tied=tied), rng, hf_arch, n_layer=dims["n_layer"])
    return write_checkpoint(folder, cfg, w, dtype="BF16"), cfg


@pytest.mark.parametrize("hf_arch", list(CASES))
def test_hf_checkpoint_converts_and_runs_like_the_hf_model(tmp_path, hf_arch):
    from hf_fixtures import hf_llama_forward

    from powerinfer_py.convert import convert

    w, cfg = _checkpoint(tmp_path / "hf", hf_arch)
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    arch = CASES[hf_arch][0]
    with open_gguf(out) as f:
        assert f.metadata["general.architecture"] == arch
        assert ("blk.0.ffn_gate.weight" in f.tensors) == (arch != "arcee")
        assert ("output.weight" in f.tensors) == (arch != "smollm3")
        if arch == "granite":
            assert f.metadata["granite.attention.scale"] == pytest.approx(0.1)
            assert f.metadata["granite.logit_scale"] == 3.0
        if arch == "olmo2":
            assert f.tensors["blk.1.attn_k_norm.weight"].shape == (32,)
    expected = hf_llama_forward(w, cfg, TOKENS)
    ours_batch, ours_steps = batch_and_steps(out, TOKENS)
    for got in (llama_cpp_logits(out, TOKENS), ours_batch, ours_steps):
        assert (got.argmax(1) == expected.argmax(1)).all()
        assert np.abs(got - expected).max() < 2e-3 * np.abs(expected).max()  # K/V are f16 in both engines


def test_variants_we_cannot_run_are_refused(tmp_path):
    """SmolLM3 with NoPE layers other than every 4th, Arcee with another activation, Granite with a head_dim
    of its own: refused by name, nothing written."""
    from powerinfer_py.convert import convert

    for hf_arch, change, words in (("SmolLM3ForCausalLM", dict(no_rope_layers=[1, 1, 0, 1]), "no_rope_layers"),
                                   ("SmolLM3ForCausalLM", dict(no_rope_layers=None, no_rope_layer_interval=3),
                                    "no_rope_layers"),
                                   ("ArceeForCausalLM", dict(act="silu"), "hidden_act"),
                                   ("GraniteForCausalLM", dict(head_dim=32), "head_dim")):
        _checkpoint(tmp_path / "hf", hf_arch, **change)
        with pytest.raises(UnsupportedError, match=words):
            convert(tmp_path / "hf", tmp_path / "out.gguf", outtype="f32", force=True)
        assert not (tmp_path / "out.gguf").exists()


def test_arcee_yarn_is_written_as_llama_cpp_reads_it(tmp_path):
    """The keys llama.cpp's converter writes; both engines run the file alike (measured 3.1e-4 of the logits'
    max), and YaRN matters here (the same weights without it: 0.30). Not compared with HF's YaRN."""
    from powerinfer_py.convert import convert

    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16}
    _checkpoint(tmp_path / "hf", "ArceeForCausalLM", rope_scaling=yarn)
    out = convert(tmp_path / "hf", tmp_path / "m.gguf", outtype="f32")
    with open_gguf(out) as f:
        assert f.metadata["arcee.rope.scaling.type"] == "yarn"
        assert f.metadata["arcee.rope.scaling.factor"] == 8.0
        assert f.metadata["arcee.rope.scaling.original_context_length"] == 16
    theirs = llama_cpp_logits(out, TOKENS)
    for got in batch_and_steps(out, TOKENS):
        assert (got.argmax(1) == theirs.argmax(1)).all()
        assert np.abs(got - theirs).max() < 2e-3 * np.abs(theirs).max()


def test_olmo3_window_and_yarn_are_written_as_llama_cpp_reads_them(tmp_path):
    """Olmo3ForCausalLM: the window and layer_types become attention.sliding_window(_pattern), YaRN its three keys;
    both engines run the file alike over 12 tokens through a window of 4 (measured 5.2e-4 of the logits' max), and
    the window matters (the same file without it: 1.08 off). Not compared with HF's model."""
    from powerinfer_py.convert import convert

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    _checkpoint(tmp_path / "hf", "Olmo3ForCausalLM", n_layer=4, sliding_window=4, layer_types=types,
                rope_scaling=yarn)
    out = convert(tmp_path / "hf", tmp_path / "m.gguf", outtype="f32")
    with open_gguf(out) as f:
        assert f.metadata["general.architecture"] == "olmo2"
        assert f.metadata["olmo2.attention.sliding_window"] == 4
        assert list(f.metadata["olmo2.attention.sliding_window_pattern"]) == [True, False, True, False]
        assert f.metadata["olmo2.rope.scaling.type"] == "yarn"
        assert f.metadata["olmo2.rope.scaling.original_context_length"] == 16
    theirs = llama_cpp_logits(out, TOKENS)
    for got in batch_and_steps(out, TOKENS):
        assert (got.argmax(1) == theirs.argmax(1)).all()
        assert np.abs(got - theirs).max() < 2e-3 * np.abs(theirs).max()
    from model_checks import load_model
    from powerinfer_py.kernels.cpu import CpuKernels
    k = CpuKernels(n_threads=1)
    m = load_model(out, k, sliding_window=0)
    no_window = m.forward(np.asarray(TOKENS, np.int32), m.new_cache(32), all_logits=True)
    k.close()
    assert np.abs(no_window - theirs).max() > 20 * 2e-3 * np.abs(theirs).max()


# what each mutation changes in the reference's config / weights (module docstring)
MUTATIONS = {
    "GraniteForCausalLM": [("no embedding_multiplier", dict(embedding_multiplier=1.0)),
                           ("no residual_multiplier", dict(residual_multiplier=1.0)),
                           ("no attention_multiplier", dict(attention_multiplier=0.25)),
                           ("no logits_scaling", dict(logits_scaling=1.0))],
    "SmolLM3ForCausalLM": [("RoPE everywhere", dict(no_rope_layers=[1, 1, 1, 1]))],
    "Olmo2ForCausalLM": [("no Q/K norms", ("self_attn.q_norm.weight", "self_attn.k_norm.weight")),
                         ("no output norms", ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight"))],
    "ArceeForCausalLM": [("relu", dict(hidden_act="relu"))],
}


def _mutated_reference(w, cfg, how):
    """The reference with a config change (dict), or with some OLMo 2 norms made identities (a tuple of their
    HF names below model.layers.N.)."""
    import hf_fixtures

    if isinstance(how, dict):
        return hf_fixtures.hf_llama_forward(w, {**cfg, **how}, TOKENS)
    marker = np.zeros(1, np.float32)  # a norm weight of this shape stands for "no norm here"
    w = {k: marker if k.split(".", 3)[-1] in how else v for k, v in w.items()}
    saved = hf_fixtures._rmsnorm
    hf_fixtures._rmsnorm = lambda x, wt, eps: x if wt.shape == (1,) else saved(x, wt, eps)
    try:
        return hf_fixtures.hf_llama_forward(w, cfg, TOKENS)
    finally:
        hf_fixtures._rmsnorm = saved


if __name__ == "__main__":  # measures the mutation numbers of the module docstring
    import tempfile
    from pathlib import Path

    from powerinfer_py.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        for hf_arch, mutations in MUTATIONS.items():
            w, cfg = _checkpoint(Path(tmp) / hf_arch, hf_arch)
            ours, _ = batch_and_steps(convert(Path(tmp) / hf_arch, Path(tmp) / f"{hf_arch}.gguf", outtype="f32"),
                                      TOKENS)
            for name, how in mutations:
                ref = _mutated_reference(w, cfg, how)
                print(f"{hf_arch:20s} {name:26s} {np.abs(ours - ref).max() / np.abs(ref).max():.3g}")
