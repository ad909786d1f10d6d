"""`powerinfer convert` for Glm4ForCausalLM: a tiny random checkpoint (BF16 weights, q/k/v biases, the four norms
per block, a fused gate_up_proj, head_dim 32 with n_embd / n_head 16, RoPE on half of each head), converted to f32
GGUF, run by llama.cpp and by our engine (one batch and token by token), each against a float64 numpy reference of
the Hugging Face model written here from transformers' Glm4 definition (hf_glm4_forward).

The reference is sensitive to what GLM-4 changes (max |ours - reference| over the reference's max |logit|, with the
mutated reference; the test passes below 2e-3), measured by `PYTHONPATH=.:tests python tests/test_convert_glm4.py`:
rotate-half RoPE instead of interleaved pairs 0.75, RoPE over the whole head 0.59, no post-attention / post-MLP norms
0.60, gate and up halves swapped 0.74. As built: llama.cpp 4.6e-4, our engine 3.0e-4.
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
HEAD_DIM = 32


def glm4_config(*, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, **extra) -> dict:
    """A Glm4ForCausalLM config.json with the keys GLM-4-9B-0414's has (extra overrides them)."""
    cfg = {"architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "hidden_size": n_embd,
           "intermediate_size": n_ff, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
           "num_key_value_heads": n_head_kv, "head_dim": HEAD_DIM, "vocab_size": n_vocab, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "attention_bias": True,
           "max_position_embeddings": 128, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(extra)
    return cfg


def glm4_weights(rng, *, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab) -> dict[str, np.ndarray]:
    """HF-named random GLM-4 weights (float32), scaled so activations stay O(1)."""
    hd = HEAD_DIM
    w = {"model.embed_tokens.weight": rng.standard_normal((n_vocab, n_embd)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(n_embd),
         "lm_head.weight": rng.standard_normal((n_vocab, n_embd)) / np.sqrt(n_embd)}
    for il in range(n_layer):
        p = f"model.layers.{il}."
        shapes = {"self_attn.q_proj.weight": (n_head * hd, n_embd), "self_attn.k_proj.weight": (n_head_kv * hd, n_embd),
                  "self_attn.v_proj.weight": (n_head_kv * hd, n_embd), "self_attn.o_proj.weight": (n_embd, n_head * hd),
                  "mlp.gate_up_proj.weight": (2 * n_ff, n_embd), "mlp.down_proj.weight": (n_embd, n_ff)}
        for k, s in shapes.items():
            w[p + k] = rng.standard_normal(s) / np.sqrt(s[1])
        for k in ("q_proj", "k_proj", "v_proj"):
            w[f"{p}self_attn.{k}.bias"] = 0.3 * rng.standard_normal(w[f"{p}self_attn.{k}.weight"].shape[0])
        for k in ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"):
            w[f"{p}{k}.weight"] = 1 + 0.1 * rng.standard_normal(n_embd)
    return {k: v.astype(np.float32) for k, v in w.items()}


def hf_glm4_forward(w, cfg, tokens, *, rotate_half=False, full_rotary=False, post_norms=True,
                    swap_gate_up=False) -> np.ndarray:
    """Logits [T, n_vocab] (float64) of Glm4ForCausalLM as transformers computes it, causal from position 0:
        h = x + post_self_attn_norm(o_proj(attn(rope(q), rope(k), v)))    q, k, v = proj(input_norm(x)) + bias
        x = h + post_mlp_norm(down(silu(g) * u))                           g, u = split(gate_up(post_attention_norm(h)))
    RoPE turns interleaved pairs (2i, 2i+1) of the first int(head_dim * partial_rotary_factor) dims of each head
    at frequency theta^(-2i / that width). The keyword switches make the mutated references of the docstring."""
    from hf_fixtures import _rmsnorm

    w = {k: v.astype(np.float64) for k, v in w.items()}
    n_head, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, n_ff = cfg["rms_norm_eps"], cfg["intermediate_size"]
    rot = hd if full_rotary else int(hd * cfg["partial_rotary_factor"])
    tokens = np.asarray(tokens)
    T = len(tokens)
    ang = np.arange(T, dtype=np.float64)[:, None] * cfg["rope_theta"] ** (-np.arange(0, rot, 2) / rot)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):  # x [T, H, hd]
        x = x.copy()
        if rotate_half:
            a, b = x[..., :rot // 2].copy(), x[..., rot // 2:rot].copy()
            x[..., :rot // 2], x[..., rot // 2:rot] = a * cos - b * sin, b * cos + a * sin
        else:
            a, b = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
            x[..., 0:rot:2], x[..., 1:rot:2] = a * cos - b * sin, b * cos + a * sin
        return x

    def post(y, name):
        return _rmsnorm(y, w[name], eps) if post_norms else y

    x = w["model.embed_tokens.weight"][tokens]
    for il in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{il}."
        h = _rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = ((h @ w[f"{p}self_attn.{n}_proj.weight"].T + w[f"{p}self_attn.{n}_proj.bias"]).reshape(T, nh, hd)
                   for n, nh in (("q", n_head), ("k", n_kv), ("v", n_kv)))
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, n_head // n_kv, axis=1), np.repeat(v, n_head // n_kv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        scores = np.where(np.tril(np.ones((T, T), bool))[None], scores, -np.inf)
        prob = np.exp(scores - scores.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", prob, v).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
        x = x + post(attn, p + "post_self_attn_layernorm.weight")
        gu = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps) @ w[p + "mlp.gate_up_proj.weight"].T
        g, u = (gu[:, n_ff:], gu[:, :n_ff]) if swap_gate_up else (gu[:, :n_ff], gu[:, n_ff:])
        x = x + post((g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T, p + "post_mlp_layernorm.weight")
    x = _rmsnorm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T


def _checkpoint(folder, seed: int = 3, **changes):
    from hf_fixtures import write_checkpoint

    cfg = glm4_config(**DIMS, **changes)
    w = glm4_weights(np.random.default_rng(seed), **DIMS)
    return write_checkpoint(folder, cfg, w, dtype="BF16"), cfg


def test_glm4_checkpoint_converts_and_runs_like_the_hf_model(tmp_path):
    from powerinfer_py.convert import convert

    w, cfg = _checkpoint(tmp_path / "hf")
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    with open_gguf(out) as f:
        assert f.metadata["general.architecture"] == "glm4"
        assert f.metadata["glm4.rope.dimension_count"] == 16 and f.metadata["glm4.attention.key_length"] == 32
        assert f.tensors["blk.1.ffn_up.weight"].shape == (256, 64) and "blk.0.attn_v.bias" in f.tensors
        assert "blk.1.post_ffw_norm.weight" in f.tensors and "output.weight" in f.tensors
    expected = hf_glm4_forward(w, cfg, TOKENS)
    ours_batch, ours_steps = batch_and_steps(out, TOKENS)
    for got in (llama_cpp_logits(out, TOKENS), ours_batch, ours_steps):
        assert (got.argmax(1) == expected.argmax(1)).all()
        assert np.abs(got - expected).max() < 2e-3 * np.abs(expected).max()  # K/V are f16 in both engines


@pytest.mark.parametrize("change,words", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(partial_rotary_factor=0.1), "partial_rotary_factor"),
])
def test_variants_we_cannot_run_are_refused(tmp_path, change, words):
    from powerinfer_py.convert import convert
    from powerinfer_py.errors import ModelFileError

    _checkpoint(tmp_path / "hf", **change)
    with pytest.raises((UnsupportedError, ModelFileError), match=words):
        convert(tmp_path / "hf", tmp_path / "out.gguf", outtype="f32")
    assert not (tmp_path / "out.gguf").exists()


MUTATIONS = [("rotate-half RoPE", dict(rotate_half=True)), ("RoPE over the whole head", dict(full_rotary=True)),
             ("no post norms", dict(post_norms=False)), ("gate/up swapped", dict(swap_gate_up=True))]

if __name__ == "__main__":  # measures the numbers of the module docstring
    import tempfile
    from pathlib import Path

    from powerinfer_py.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        w, cfg = _checkpoint(Path(tmp) / "hf")
        out = convert(Path(tmp) / "hf", Path(tmp) / "m.gguf", outtype="f32")
        ours, _ = batch_and_steps(out, TOKENS)
        ref = hf_glm4_forward(w, cfg, TOKENS)
        for name, got in (("llama.cpp", llama_cpp_logits(out, TOKENS)), ("ours", ours)):
            print(f"as built, {name:10s} {np.abs(got - ref).max() / np.abs(ref).max():.3g}")
        for name, how in MUTATIONS:
            bad = hf_glm4_forward(w, cfg, TOKENS, **how)
            print(f"{name:26s} {np.abs(ours - bad).max() / np.abs(bad).max():.3g}")
