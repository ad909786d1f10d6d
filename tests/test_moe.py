"""Mixture-of-experts models (qwen3moe, qwen2moe, Mixtral-style llama files): logits against llama.cpp on the
same synthetic files, one token at a time against a batch, routing against a numpy reference, and the errors
for what these models cannot do."""
from __future__ import annotations

import numpy as np
import pytest

from llama_ref import llama_cpp_logits
from model_checks import assert_matches_llama_cpp, batch_and_steps, llama_cpp_quantized, rewrite_gguf
from test_kernels_matmul import BLOCK_TYPES, FLOAT_TYPES, K_TYPES, make_weight

from powerinfer_py.layers import moe
from powerinfer_py import load
from powerinfer_py.errors import ModelFileError, PowerInferError, UnsupportedError
from powerinfer_py.gguf.reader import open_gguf
from powerinfer_py.layers.moe import MoEFFN
from powerinfer_py.gguf.types import Tensor

TOKENS = [1, 5, 300, 301, 7, 88, 42, 260, 9, 100, 200, 33]


# ---- the grouped expert kernel ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ggml_type", FLOAT_TYPES + BLOCK_TYPES + K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("counts", [(1, 0, 5, 17, 1), (4, 0, 5, 3, 12)], ids=["ragged", "fours"])
def test_matmul_experts_gives_each_experts_matmul_bits(ggml_type, n_threads, counts):
    """Groups of 0, 1 and several tokens, starting on and off a multiple of 4 tokens (the AVX2 Q8_0 prefill's
    token groups), repeated and unsorted experts, rows not a multiple of the row block: each group's rows are
    bit for bit the matmul of its expert's slice, and near the numpy reference."""
    from powerinfer_py.kernels import ref
    from powerinfer_py.kernels.cpu import CpuKernels

    n_expert, n_rows, n_cols = 5, 37, 512 if ggml_type in K_TYPES else 96
    flat = make_weight(ggml_type, n_expert * n_rows, n_cols, seed=3)
    w = Tensor("exps", ggml_type, (n_expert, n_rows, n_cols), flat.data.reshape(n_expert, n_rows, -1))
    experts = np.array([3, 0, 4, 1, 3], dtype=np.int32)
    tok_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    x = np.random.default_rng(4).standard_normal((24, n_cols), dtype=np.float32)
    k = CpuKernels(n_threads)
    try:
        y = k.matmul_experts(w, experts, tok_off, x)
        for g, e in enumerate(experts):
            rows = slice(tok_off[g], tok_off[g + 1])
            if tok_off[g + 1] > tok_off[g]:
                np.testing.assert_array_equal(y[rows], k.matmul(moe.expert(w, e), np.ascontiguousarray(x[rows])))
        want = ref.matmul_experts(w, experts, tok_off, x)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-3 * np.abs(want).max())
        for bad in (dict(tok_off=tok_off[:-1]), dict(experts=experts + 1), dict(x=x[:-1])):
            args = dict(experts=experts, tok_off=tok_off, x=x) | bad
            with pytest.raises(ValueError, match="matmul_experts"):
                k.matmul_experts(w, **args)
    finally:
        k.close()
CASES = [("qwen3moe", {}), ("qwen2moe", {}), ("llama", {"n_expert": 4})]


def _ours(path, tokens=TOKENS) -> tuple[np.ndarray, np.ndarray]:
    return batch_and_steps(path, tokens)


@pytest.mark.parametrize("arch,kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype,tol", [("f32", 0.01), ("q8_0", 0.12)])
def test_logits_match_llama_cpp(synthetic_model, arch, kw, dtype, tol):
    """Routing (softmax, top-k, renormalized or not), the experts and qwen2moe's gated shared expert: a wrong
    choice of any of them misses llama.cpp by 0.3-1.0 of the logits' spread (measured by flipping each)."""
    assert_matches_llama_cpp(synthetic_model(arch, dtype, **kw), TOKENS, tol, same_top1=dtype == "f32")


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("arch,kw", CASES, ids=[c[0] for c in CASES])
def test_layer_matches_numpy_reference(synthetic_model, arch, kw):
    """One MoE layer in float64 numpy from the file's tensors: route, run the chosen experts, weight and add."""
    path = synthetic_model(arch, "f32", **kw)
    rng = np.random.default_rng(1)
    with load(path, threads=2) as llm:
        ffn = llm.model.ffns[1]
        assert isinstance(ffn, MoEFFN)
        x = rng.standard_normal((5, llm.config.n_embd)).astype(np.float32)
        got = ffn(x)
        c = llm.config
        W = {n: np.asarray(t.data, np.float64) for n, t in ((n, getattr(ffn, n)) for n in ("router", "gate", "up", "down"))}
        probs = _softmax(x.astype(np.float64) @ W["router"].T)
        want = np.zeros_like(got, dtype=np.float64)
        for t in range(len(x)):
            top = np.argsort(-probs[t])[:c.n_expert_used]
            w = probs[t, top] / (probs[t, top].sum() if c.expert_weights_norm else 1.0)
            for e, we in zip(top, w):
                g, u = W["gate"][e] @ x[t], W["up"][e] @ x[t]
                want[t] += we * (W["down"][e] @ (g / (1 + np.exp(-g)) * u))
            if c.n_ff_shexp:
                s = ffn.shared.w
                gs, us = np.asarray(s.gate.data, np.float64) @ x[t], np.asarray(s.up.data, np.float64) @ x[t]
                sh = np.asarray(s.down.data, np.float64) @ (gs / (1 + np.exp(-gs)) * us)
                want[t] += sh / (1 + np.exp(-(ffn.shared_gate.astype(np.float64) @ x[t])))
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
        assert ffn.counts.sum() == len(x) * c.n_expert_used


def test_batch_slices_give_the_same_bits(synthetic_model, monkeypatch):
    """A prompt longer than one slice of the batch path gives the bits of one slice."""
    path = synthetic_model("qwen3moe", "f32")
    whole, _ = _ours(path)
    monkeypatch.setattr(MoEFFN, "BATCH_SLICE", 5)  # 12 tokens: slices of 5, 5 and 2
    sliced, _ = _ours(path)
    np.testing.assert_array_equal(sliced, whole)


def test_info_and_sparse_modes(synthetic_model):
    path = synthetic_model("qwen3moe", "f32")
    with load(path, threads=1) as llm:
        c = llm.config
        assert (c.n_expert, c.n_expert_used, c.expert_weights_norm) == (4, 2, True)
    for mode in ("exact", "threshold", "predictor"):
        with pytest.raises(PowerInferError, match="mixture of experts|PWRI"):
            load(path, threads=1, sparse=mode)


def test_activation_tools_refuse_experts(synthetic_model, tmp_path):
    from powerinfer_py.tools.calibrate import calibrate

    path = synthetic_model("qwen3moe", "f32")
    with pytest.raises(UnsupportedError, match="mixture of experts"):
        calibrate(path, tmp_path / "out.gguf", 0.3, text="the cat", n_tokens=8)
    assert not (tmp_path / "out.gguf").exists()
    with load(path, threads=1) as llm, pytest.raises(UnsupportedError, match="mixture of experts"):
        llm.model.ffns[0].observer = lambda *a: None



def test_bad_files(synthetic_model, tmp_path):
    path = synthetic_model("qwen3moe", "f32")
    bad = rewrite_gguf(path, tmp_path / "used.gguf", {"qwen3moe.expert_used_count": 9})
    with pytest.raises(ModelFileError, match="expert_used_count 9 exceeds"):
        load(bad, threads=1)
    bad = rewrite_gguf(path, tmp_path / "drop.gguf", drop=("blk.1.ffn_down_exps.weight",))
    with pytest.raises(ModelFileError, match="blk.1.ffn_down_exps.weight"):
        load(bad, threads=1)


def test_q4_k_m_file_from_llama_cpp_quantizer(synthetic_model, tmp_path):
    """llama.cpp's own Q4_K_M of a qwen3moe file (K-quant expert stacks, as real MoE downloads are): loaded with
    no conversion, it matches llama.cpp, and one token at a time gives the batch's bits."""
    import llama_cpp

    src = synthetic_model("qwen3moe", "f32", n_embd=256, n_ff=256, n_head=4, n_head_kv=2, n_expert=4)
    path = llama_cpp_quantized(src, tmp_path / "moe-q4_k_m.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    assert open_gguf(path).tensors["blk.0.ffn_gate_exps.weight"].type.name.endswith("_K")
    batch, step = _ours(path)
    np.testing.assert_array_equal(step, batch)
    ref = llama_cpp_logits(path, TOKENS)
    assert np.abs(batch - ref).max() < 0.12 * ref.std()


# ---- conversion of Hugging Face checkpoints ----------------------------------------------------------------------

HF_DIMS = dict(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=512)


@pytest.mark.parametrize("hf_arch", ["Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"])
def test_hf_checkpoint_converts_and_runs_like_the_hf_model(tmp_path, hf_arch):
    """The experts of each layer are stacked into 3-D tensors in llama.cpp's names (the router kept f32):
    llama.cpp and our engine both run the converted file with the logits of a float64 HF reference."""
    from hf_fixtures import hf_llama_forward, llama_config, llama_weights, moe_weights, write_checkpoint

    from powerinfer_py.convert import convert

    qwen3, qwen2 = hf_arch.startswith("Qwen3"), hf_arch.startswith("Qwen2")
    extra = (dict(num_experts=4, moe_intermediate_size=48, norm_topk_prob=True, head_dim=32) if qwen3 else
             dict(num_experts=4, moe_intermediate_size=48, norm_topk_prob=False, shared_expert_intermediate_size=96)
             if qwen2 else dict(num_local_experts=4))
    cfg = llama_config(**HF_DIMS, arch=hf_arch, num_experts_per_tok=2, rope_theta=1e4 if not (qwen2 or qwen3) else 1e6,
                       **extra)
    rng = np.random.default_rng(7)
    w = llama_weights(rng, **HF_DIMS, head_dim=32 if qwen3 else None, qk_norm=qwen3, qkv_bias=qwen2)
    w = moe_weights(w, rng, hf_arch, n_layer=2, n_embd=64, n_expert=4, n_ff=48 if qwen2 or qwen3 else 128,
                    n_ff_shared=96 if qwen2 else 0)
    w = write_checkpoint(tmp_path / "hf", cfg, w, dtype="BF16")
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    arch = "qwen3moe" if qwen3 else "qwen2moe" if qwen2 else "llama"
    with open_gguf(out) as f:
        assert f.metadata["general.architecture"] == arch and f.metadata[f"{arch}.expert_count"] == 4
        assert f.tensors["blk.1.ffn_down_exps.weight"].shape == (4, 64, 48 if qwen2 or qwen3 else 128)
        if qwen2:
            assert f.tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (64,)
    expected = hf_llama_forward(w, cfg, TOKENS)
    theirs = llama_cpp_logits(out, TOKENS)
    ours, _ = _ours(out)
    for got in (ours, theirs):
        assert (got.argmax(1) == expected.argmax(1)).all()
        assert np.abs(got - expected).max() < 2e-3 * np.abs(expected).max()  # K/V are f16 in both engines


def test_hf_moe_variants_we_cannot_run_are_refused(tmp_path):
    from hf_fixtures import llama_config, llama_weights, moe_weights, write_checkpoint

    from powerinfer_py.convert import convert

    rng = np.random.default_rng(8)
    w = moe_weights(llama_weights(rng, **HF_DIMS, qk_norm=True), rng, "Qwen3MoeForCausalLM", n_layer=2, n_embd=64,
                    n_expert=4, n_ff=48)
    for bad in (dict(norm_topk_prob=False), dict(mlp_only_layers=[1])):
        cfg = llama_config(**HF_DIMS, arch="Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=48, **bad)
        write_checkpoint(tmp_path / "hf", cfg, w)
        with pytest.raises(UnsupportedError, match="norm_topk_prob|mlp_only_layers"):
            convert(tmp_path / "hf", tmp_path / "out.gguf", outtype="f32", force=True)
        assert not (tmp_path / "out.gguf").exists()
