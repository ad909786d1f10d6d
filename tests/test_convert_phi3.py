"""`convert` for Phi3ForCausalLM: tiny HF Phi-3 checkpoints (full and partial rotary, with and without LongRoPE,
tied and untied) -> GGUF arch "phi3"; our engine and llama.cpp on the converted file against a numpy forward of
the HF checkpoint (tests/hf_fixtures.py, written from the HF tensors alone), a negative control (a conversion
with gate and up swapped fails the bar), the metadata and tensor names llama.cpp reads, quantized output, and
the errors for bad or unsupported checkpoints.
"""
from __future__ import annotations

import json
import math

import llama_cpp
import numpy as np
import pytest
from hf_fixtures import hf_phi3_forward, phi3_config, phi3_weights, write_checkpoint
from typer.testing import CliRunner

from powerinfer_py.convert import convert
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors
from powerinfer_py.gguf.types import GGMLType

DIMS = {"n_layer": 2, "n_embd": 64, "n_ff": 128, "n_head": 4, "n_head_kv": 2, "n_vocab": 512}
TOKENS = [1, 50, 300, 7, 99, 400, 12, 77, 5]
N_ROT_PARTIAL = 12  # partial_rotary_factor 0.75 of head_dim 16, as Phi-4-mini (96 of 128)
ORIG_CTX = 256  # llama.cpp rounds n_ctx up to 256: a context of 32 stays short, 512 is long
_RNG = np.random.default_rng(11)


def _longrope(n_rot: int) -> dict:
    return {"type": "longrope", "short_factor": (1 + 2 * _RNG.random(n_rot // 2)).tolist(),
            "long_factor": (1 + 15 * _RNG.random(n_rot // 2)).tolist()}


# name -> (config.json extras, tied embeddings)
VARIANTS = {
    "full-rotary": ({}, False),
    "partial-longrope": ({"partial_rotary_factor": 0.75, "rope_scaling": _longrope(N_ROT_PARTIAL),
                          "original_max_position_embeddings": ORIG_CTX, "max_position_embeddings": 16 * ORIG_CTX}, True),
    "full-longrope": ({"rope_scaling": _longrope(16), "original_max_position_embeddings": ORIG_CTX,
                       "max_position_embeddings": 8 * ORIG_CTX, "sliding_window": None}, False),
    "partial": ({"partial_rotary_factor": 0.75}, True),
}
# max |diff| / std of the reference logits, the reference keeping K and V in f16 as both engines' caches do
ENGINE_TOL = 1e-3
LLAMA_CPP_TOL = 2.5e-3  # llama.cpp also rounds some activations to f16 on the way


def _score(ours: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(ours - want).max() / want.std())


def _checkpoint(folder, variant: str, seed: int = 0, swap_gate_up: bool = False):
    extra, tied = VARIANTS[variant]
    cfg = phi3_config(**DIMS, tied=tied, **extra)
    w = phi3_weights(np.random.default_rng(seed), **DIMS, tied=tied)
    stored_w = dict(w)
    if swap_gate_up:  # a deliberately wrong checkpoint: the halves of every gate_up_proj exchanged
        n = DIMS["n_ff"]
        for k in [k for k in w if k.endswith("gate_up_proj.weight")]:
            stored_w[k] = np.concatenate([w[k][n:], w[k][:n]])
    exact = write_checkpoint(folder, cfg, stored_w)
    if swap_gate_up:
        return cfg, w
    return cfg, exact


def _engine_logits(path, cpu_kernels, n_ctx: int) -> np.ndarray:
    with open_gguf(path) as f:
        weights = load_weights(f, expected_tensors)
        model = build_model(weights.config, weights.tensors, cpu_kernels)
        return model.forward(np.array(TOKENS, np.int32), model.new_cache(n_ctx), all_logits=True).astype(np.float64)


def _llama_cpp_logits(path, n_ctx: int) -> np.ndarray:
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, n_threads=2, verbose=False)
    try:
        llm.eval(TOKENS)
        return np.array(llm.scores[:len(TOKENS)], dtype=np.float64)
    finally:
        llm.close()


def _cases():
    for variant, (extra, _) in VARIANTS.items():
        yield variant, 32, "short"
        if extra.get("rope_scaling"):
            yield variant, 512, "long"


@pytest.mark.parametrize("variant,n_ctx,factors", list(_cases()))
def test_converted_phi3_matches_the_hf_forward(tmp_path, cpu_kernels, variant, n_ctx, factors):
    cfg, w = _checkpoint(tmp_path / "hf", variant)
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    want = hf_phi3_forward(w, cfg, TOKENS, factors=factors, kv_f16=True)
    ours, theirs = _engine_logits(out, cpu_kernels, n_ctx), _llama_cpp_logits(out, n_ctx)
    assert (ours.argmax(1) == want.argmax(1)).all() and (theirs.argmax(1) == want.argmax(1)).all()
    assert _score(ours, want) < ENGINE_TOL
    assert _score(theirs, want) < LLAMA_CPP_TOL
    if cfg["rope_scaling"]:  # the factor set matters: the other one is far outside the bar
        other = hf_phi3_forward(w, cfg, TOKENS, factors="long" if factors == "short" else "short", kv_f16=True)
        assert _score(ours, other) > 50 * ENGINE_TOL and _score(theirs, other) > 50 * LLAMA_CPP_TOL


def test_negative_control_swapped_gate_up_fails_the_bar(tmp_path, cpu_kernels):
    """A checkpoint whose gate_up_proj halves are swapped, converted, is compared with the reference of the true
    weights: the bar used above must reject it (the comparison can see a wrong gate/up order)."""
    cfg, w = _checkpoint(tmp_path / "hf", "partial-longrope", swap_gate_up=True)
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    want = hf_phi3_forward(w, cfg, TOKENS, kv_f16=True)
    assert _score(_engine_logits(out, cpu_kernels, 32), want) > 50 * ENGINE_TOL
    assert _score(_llama_cpp_logits(out, 32), want) > 50 * LLAMA_CPP_TOL


def test_metadata_and_tensors_are_llama_cpps(tmp_path):
    cfg, w = _checkpoint(tmp_path / "hf", "partial-longrope")
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f16")
    n_embd, n_ff, hd = DIMS["n_embd"], DIMS["n_ff"], DIMS["n_embd"] // DIMS["n_head"]
    with open_gguf(out) as f:
        m, t = f.metadata, f.tensors
        assert m["general.architecture"] == "phi3" and m["general.file_type"] == 1
        assert m["phi3.context_length"] == 16 * ORIG_CTX and m["phi3.rope.scaling.original_context_length"] == ORIG_CTX
        assert m["phi3.rope.dimension_count"] == N_ROT_PARTIAL and m["phi3.block_count"] == 2
        assert m["phi3.embedding_length"] == n_embd and m["phi3.feed_forward_length"] == n_ff
        assert m["phi3.attention.head_count"] == 4 and m["phi3.attention.head_count_kv"] == 2
        assert m["phi3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
        assert m["phi3.rope.freq_base"] == 10000.0 and m["phi3.attention.sliding_window"] == 2047
        assert m["phi3.rope.scaling.attn_factor"] == pytest.approx(math.sqrt(1 + math.log(16) / math.log(ORIG_CTX)))
        assert "phi3.attention.key_length" not in m
        for key in ("short", "long"):
            r = t[f"rope_factors_{key}.weight"]
            assert r.type == GGMLType.F32 and r.shape == (N_ROT_PARTIAL // 2,)
            np.testing.assert_array_equal(r.data.view(np.float32),
                                          np.float32(cfg["rope_scaling"][f"{key}_factor"]))
        assert t["blk.0.attn_qkv.weight"].shape == ((4 + 2 * 2) * hd, n_embd)
        assert t["blk.1.ffn_up.weight"].shape == (2 * n_ff, n_embd)
        assert t["blk.1.ffn_down.weight"].shape == (n_embd, n_ff)
        assert t["blk.0.attn_output.weight"].shape == (n_embd, n_embd)
        up = t["blk.0.ffn_up.weight"].data.view(np.float16).reshape(2 * n_ff, n_embd)  # gate rows first, as HF
        np.testing.assert_array_equal(up, w["model.layers.0.mlp.gate_up_proj.weight"].astype(np.float16))
        assert "output.weight" not in t  # tied: llama.cpp reuses token_embd.weight
        names = {n.split(".", 2)[-1] for n in t if n.startswith("blk.0.")}
        assert names == {"attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
                         "ffn_up.weight", "ffn_down.weight"}


def test_no_longrope_writes_no_factors(tmp_path):
    _checkpoint(tmp_path / "hf", "full-rotary")
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f16")
    with open_gguf(out) as f:
        m, t = f.metadata, f.tensors
        assert m["phi3.rope.dimension_count"] == 16 and "phi3.rope.scaling.attn_factor" not in m
        assert not any(n.startswith("rope_factors") for n in t) and "output.weight" in t


def test_given_attention_factor_is_kept(tmp_path):
    cfg, _ = _checkpoint(tmp_path / "hf", "full-longrope")
    cfg["rope_scaling"] = dict(cfg["rope_scaling"], attention_factor=1.25)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with open_gguf(convert(tmp_path / "hf", tmp_path / "model.gguf")) as f:
        assert f.metadata["phi3.rope.scaling.attn_factor"] == pytest.approx(1.25)
        assert f.metadata["phi3.attention.sliding_window"] == 0  # config's null, as llama.cpp writes it


# measured: q8_0 0.063 (engine) / 0.054 (llama.cpp), f16 2.0e-3 / 2.4e-3; both engines also round activations
# to Q8_0 before Q8_0 matmuls
@pytest.mark.parametrize("outtype,ggml_type,tol", [("q8_0", GGMLType.Q8_0, 0.12), ("f16", GGMLType.F16, 5e-3)])
def test_quantized_output_through_the_cli(tmp_path, cpu_kernels, outtype, ggml_type, tol):
    from powerinfer_cli.main import app

    cfg, w = _checkpoint(tmp_path / "hf", "partial-longrope")
    out = tmp_path / f"model-{outtype}.gguf"
    r = CliRunner().invoke(app, ["convert", str(tmp_path / "hf"), "-o", str(out), "--outtype", outtype])
    assert r.exit_code == 0, r.output
    with open_gguf(out) as f:
        assert f.tensors["blk.0.attn_qkv.weight"].type == ggml_type
        assert f.tensors["rope_factors_long.weight"].type == GGMLType.F32
    want = hf_phi3_forward(w, cfg, TOKENS, kv_f16=True)
    ours, theirs = _engine_logits(out, cpu_kernels, 32), _llama_cpp_logits(out, 32)
    assert _score(ours, want) < tol
    assert _score(theirs, want) < tol


# ---- bad and unsupported checkpoints -----------------------------------------------------------------------

def _rewrite(folder, drop: str | None = None, reshape: str | None = None):
    from powerinfer_py.convert.checkpoint import Checkpoint
    from powerinfer_py.convert.safetensors import write_safetensors

    ckpt = Checkpoint(folder)
    tensors = {n: ckpt.get(n).read() for n in ckpt.tensors if n != drop}
    if reshape:
        tensors[reshape] = tensors[reshape][:-2]
    (folder / "model.safetensors").unlink()
    write_safetensors(folder / "model.safetensors", {n: ("F32", v.astype(np.float32)) for n, v in tensors.items()})


def test_missing_or_misshapen_qkv_is_named(tmp_path):
    _checkpoint(tmp_path / "hf", "partial")
    _rewrite(tmp_path / "hf", drop="model.layers.1.self_attn.qkv_proj.weight")
    with pytest.raises(ModelFileError, match=r"'model\.layers\.1\.self_attn\.qkv_proj\.weight' not found"):
        convert(tmp_path / "hf", tmp_path / "a.gguf")
    _checkpoint(tmp_path / "hf2", "partial")
    _rewrite(tmp_path / "hf2", reshape="model.layers.0.self_attn.qkv_proj.weight")
    with pytest.raises(ModelFileError, match=r"'model\.layers\.0\.self_attn\.qkv_proj\.weight' has shape \[126, 64\]"):
        convert(tmp_path / "hf2", tmp_path / "b.gguf")
    assert not list(tmp_path.glob("*.gguf"))


@pytest.mark.parametrize("change,error,match", [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, UnsupportedError, "rope_scaling type 'yarn'"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                       "short_mscale": 1.0, "long_mscale": 1.2}}, UnsupportedError, "short_mscale"),
    ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 5, "long_factor": [2.0] * 8}}, ModelFileError,
     "short_factor must list n_rot/2 = 8"),
    ({"attention_bias": True}, UnsupportedError, "biases"),
    ({"partial_rotary_factor": 0.35}, ModelFileError, "partial_rotary_factor"),
    ({"architectures": ["Phi3SmallForCausalLM"]}, UnsupportedError, "'Phi3SmallForCausalLM' is not supported"),
])
def test_unsupported_or_bad_configs_are_refused(tmp_path, change, error, match):
    cfg, _ = _checkpoint(tmp_path / "hf", "full-rotary")
    cfg.update(change)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(error, match=match):
        convert(tmp_path / "hf", tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()
