"""`convert` and `quantize`: synthetic Hugging Face checkpoints in the real layouts -> GGUF / PWRI.

The strongest check: a tiny SiLU LLaMA converted to GGUF runs in llama.cpp with the logits of a numpy forward
pass of the original HF weights (this is what proves the Q/K permutation and every name/shape mapping).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from hf_fixtures import (hf_llama_forward, llama_config, llama_weights, write_checkpoint, write_predictor)
from powerinfer_py.models import read_config
from powerinfer_py.convert import convert, quantize
from powerinfer_py.convert import output as output_mod
from powerinfer_py.convert.plan import falcon_qkv_order, rope_permutation
from powerinfer_py.errors import ModelFileError, PowerInferError, UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels import ref

DIMS = dict(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=512)
TOKENS = [1, 50, 300, 7, 99, 400, 12]


def _checkpoint(folder: Path, *, seed=0, dtype="F32", layout="single", act="silu", arch="LlamaForCausalLM",
                tied=False, qkv_bias=False, **cfg_extra):
    rng = np.random.default_rng(seed)
    cfg = llama_config(**DIMS, act=act, arch=arch, tied=tied, **cfg_extra)
    w = llama_weights(rng, **DIMS, tied=tied, qkv_bias=qkv_bias)
    return cfg, write_checkpoint(folder, cfg, w, dtype=dtype, layout=layout)


def _llama_cpp_logits(path: Path, tokens) -> np.ndarray:
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=32, n_threads=2, verbose=False)
    try:
        llm.eval(list(tokens))
        return np.array(llm.scores[:len(tokens)], dtype=np.float64)
    finally:
        llm.close()


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _deq(t) -> np.ndarray:
    return ref.dequantize(t).astype(np.float32)


# ---- dense GGUF in llama.cpp --------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_dense_gguf_runs_in_llama_cpp_like_the_hf_model(tmp_path, arch):
    cfg, w = _checkpoint(tmp_path / "hf", layout="sharded", arch=arch, qkv_bias=arch.startswith("Qwen2"))
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    theirs = _llama_cpp_logits(out, TOKENS)
    expected = hf_llama_forward(w, cfg, TOKENS)
    assert (theirs.argmax(1) == expected.argmax(1)).all()
    assert _rel(theirs, expected) < 2e-3  # llama.cpp keeps K/V in f16
    with open_gguf(out) as f:
        assert f.magic == "GGUF"
        assert f.metadata["general.architecture"] == ("qwen2" if arch.startswith("Qwen2") else "llama")
        assert f.metadata["tokenizer.chat_template"].startswith("{% for m in messages %}")


def test_tokenizer_model_carried_into_llama_cpp(tmp_path):
    _checkpoint(tmp_path / "hf")
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f16")
    llm = llama_cpp.Llama(str(out), vocab_only=True, verbose=False)
    try:
        ids = llm.tokenize("the one é".encode())
        assert ids[0] == 1 and llm.detokenize(ids[1:]) == " the one é".encode()
        assert llm.token_eos() == 2
    finally:
        llm.close()
    with open_gguf(out) as f:
        m = f.metadata
        assert m["tokenizer.ggml.model"] == "llama" and len(m["tokenizer.ggml.tokens"]) == DIMS["n_vocab"]
        assert m["tokenizer.ggml.tokens"][:3] == ["<unk>", "<s>", "</s>"] and m["tokenizer.ggml.token_type"][3] == 6
        assert m["tokenizer.ggml.add_bos_token"] is True and m["general.file_type"] == 1


def test_engine_runs_converted_model_like_hf(tmp_path):
    """Our own engine on the converted file agrees with the HF reference too."""
    from powerinfer_py.gguf.load import load_weights
    from powerinfer_py.models import build_model, expected_tensors

    cfg, w = _checkpoint(tmp_path / "hf", tied=True)
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    with open_gguf(out) as f:
        weights = load_weights(f, expected_tensors)
        model = build_model(weights.config, weights.tensors, ref.RefKernels())
        ours = model.forward(np.array(TOKENS, np.int32), model.new_cache(32), all_logits=True)
    expected = hf_llama_forward(w, cfg, TOKENS)
    assert (ours.argmax(1) == expected.argmax(1)).all()
    assert _rel(ours, expected) < 2e-3  # the KV cache is f16


def test_qwen3_converts_and_runs_like_the_hf_model(tmp_path):
    """Qwen3: per-head q_norm/k_norm, no biases, head_dim from config (32, not 64 / 4), tied head. llama.cpp and
    our engine both run the converted file with the logits of the HF model."""
    from powerinfer_py.kernels.cpu import CpuKernels
    from powerinfer_py.gguf.load import load_weights
    from powerinfer_py.models import build_model, expected_tensors

    cfg = llama_config(**DIMS, arch="Qwen3ForCausalLM", tied=True, head_dim=32, attention_bias=False,
                       rope_theta=1e6, rms_norm_eps=1e-6)
    w = llama_weights(np.random.default_rng(5), **DIMS, tied=True, head_dim=32, qk_norm=True)
    w = write_checkpoint(tmp_path / "hf", cfg, w, dtype="BF16")
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")
    with open_gguf(out) as f:
        m, t = f.metadata, f.tensors
        assert m["general.architecture"] == "qwen3" and m["qwen3.attention.key_length"] == 32
        assert t["blk.1.attn_q_norm.weight"].shape == (32,) and t["blk.0.attn_q.weight"].shape == (4 * 32, 64)
        np.testing.assert_array_equal(_deq(t["blk.1.attn_k_norm.weight"]), w["model.layers.1.self_attn.k_norm.weight"])
        assert "output.weight" not in t and "blk.0.attn_q.bias" not in t
        weights = load_weights(f, expected_tensors)
        k = CpuKernels(n_threads=2)
        try:
            model = build_model(weights.config, weights.tensors, k)
            ours = model.forward(np.array(TOKENS, np.int32), model.new_cache(32), all_logits=True)
        finally:
            k.close()
    expected = hf_llama_forward(w, cfg, TOKENS)
    theirs = _llama_cpp_logits(out, TOKENS)
    for got in (ours, theirs):
        assert (got.argmax(1) == expected.argmax(1)).all()
        assert _rel(got, expected) < 2e-3  # K/V are f16 in both engines
    # the norms are not a no-op: without them the HF model computes other logits
    plain = {k: v for k, v in w.items() if not k.endswith(("q_norm.weight", "k_norm.weight"))}
    assert _rel(hf_llama_forward(plain, cfg, TOKENS), expected) > 0.05


# ---- tensor layout ------------------------------------------------------------------------------------------

def test_bf16_checkpoint_tensors_and_permutation(tmp_path):
    cfg, w = _checkpoint(tmp_path / "hf", dtype="BF16")
    out = convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="bf16")
    with open_gguf(out) as f:
        t = f.tensors
        assert t["blk.0.attn_q.weight"].type.name == "BF16" and t["blk.0.attn_norm.weight"].type.name == "F32"
        np.testing.assert_array_equal(_deq(t["token_embd.weight"]), w["model.embed_tokens.weight"])  # exact
        q = w["model.layers.1.self_attn.q_proj.weight"]
        hd = DIMS["n_embd"] // DIMS["n_head"]
        # llama.cpp's layout: within each head, rows (0, hd/2, 1, hd/2+1, ...) of the HF head
        perm = np.concatenate([h * hd + np.stack([np.arange(hd // 2), hd // 2 + np.arange(hd // 2)], 1).ravel()
                               for h in range(DIMS["n_head"])])
        np.testing.assert_array_equal(perm, rope_permutation(len(q), DIMS["n_head"]))
        np.testing.assert_array_equal(_deq(t["blk.1.attn_q.weight"]), q[perm])
        k = w["model.layers.1.self_attn.k_proj.weight"]
        np.testing.assert_array_equal(_deq(t["blk.1.attn_k.weight"]), k[rope_permutation(len(k), DIMS["n_head_kv"])])
        np.testing.assert_array_equal(_deq(t["blk.1.ffn_down.weight"]), w["model.layers.1.mlp.down_proj.weight"])
        np.testing.assert_array_equal(_deq(t["output.weight"]), w["lm_head.weight"])


def test_pwri_relu_llama_from_bin_with_predictor(tmp_path):
    cfg, w = _checkpoint(tmp_path / "hf", dtype="F16", layout="bin", act="relu")
    ranks = [16, 24]
    pred = write_predictor(tmp_path / "pred", ranks, DIMS["n_embd"], DIMS["n_ff"], np.random.default_rng(1),
                           threshold=0.25, dtype=np.float16)
    out = convert(tmp_path / "hf", tmp_path / "model.powerinfer.gguf", predictor=tmp_path / "pred", outtype="f16")
    assert out.read_bytes()[:4] == b"PWRI"
    with open_gguf(out) as f:
        assert f.is_sparse
        m, t = f.metadata, f.tensors
        assert m["powerinfer.sparse_threshold"] == pytest.approx(0.25) and m["powerinfer.hidden_act"] == "relu"
        assert "blk.0.ffn_down.weight" not in t
        for il in range(DIMS["n_layer"]):
            down = w[f"model.layers.{il}.mlp.down_proj.weight"]  # [n_embd, n_ff]
            np.testing.assert_array_equal(_deq(t[f"blk.{il}.ffn_down_t.weight"]), down.T)
            assert t[f"blk.{il}.fc1.weight"].shape == (ranks[il], DIMS["n_embd"])  # ne [n_embd, R]
            assert t[f"blk.{il}.fc2.weight"].shape == (DIMS["n_ff"], ranks[il])  # ne [R, n_ff]
            np.testing.assert_array_equal(_deq(t[f"blk.{il}.fc1.weight"]), pred[il][0].astype(np.float32))
            np.testing.assert_array_equal(_deq(t[f"blk.{il}.fc2.weight"]), pred[il][1].astype(np.float32))
        config = read_config(f)
        assert config.is_sparse and config.predictor_ranks == tuple(ranks)
        assert config.sparse_threshold == pytest.approx(0.25)


def test_prosparse_fatrelu_threshold_in_metadata(tmp_path):
    _checkpoint(tmp_path / "hf", act="fatrelu", arch="SparseLlamaForCausalLM", hidden_act_param=0.01)
    write_predictor(tmp_path / "pred", [8, 8], DIMS["n_embd"], DIMS["n_ff"], np.random.default_rng(2))
    out = convert(tmp_path / "hf", tmp_path / "m.gguf", predictor=tmp_path / "pred", outtype="q8_0")
    with open_gguf(out) as f:
        assert f.metadata["powerinfer.hidden_act"] == "fatrelu"
        assert f.metadata["powerinfer.hidden_act_param"] == pytest.approx(0.01)
        assert f.metadata["powerinfer.sparse_threshold"] == 0.0  # no predictor config.json
        assert f.tensors["blk.0.fc1.weight"].type.name == "Q8_0"
        assert f.tensors["blk.0.fc2.weight"].type.name == "F16"  # rank 8 is not a multiple of 32


def test_falcon_qkv_regrouping_order():
    # 2 KV groups of [q0 q1 | k | v] with head_dim 1 -> [q0 q1 q0' q1' | k k' | v v']
    np.testing.assert_array_equal(falcon_qkv_order(4, 2, 1), [0, 1, 4, 5, 2, 6, 3, 7])


# ---- quantize -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_quantize_keeps_everything_but_the_encoding(tmp_path, qtype):
    _checkpoint(tmp_path / "hf", act="relu")
    write_predictor(tmp_path / "pred", [32, 64], DIMS["n_embd"], DIMS["n_ff"], np.random.default_rng(3))
    f32 = convert(tmp_path / "hf", tmp_path / "f32.gguf", predictor=tmp_path / "pred", outtype="f32")
    q = quantize(f32, tmp_path / f"{qtype}.gguf", qtype)
    direct = convert(tmp_path / "hf", tmp_path / "direct.gguf", predictor=tmp_path / "pred", outtype=qtype)
    with open_gguf(f32) as a, open_gguf(q) as b, open_gguf(direct) as c:
        assert b.magic == "PWRI" and list(a.tensors) == list(b.tensors)
        assert {k: v for k, v in a.metadata.items() if k != "general.file_type"} == \
               {k: v for k, v in b.metadata.items() if k != "general.file_type"}
        assert b.metadata["general.file_type"] == {"q8_0": 7, "q4_0": 2}[qtype]
        tol = {"q8_0": 0.01, "q4_0": 0.15}[qtype]
        for name, t in a.tensors.items():
            u = b.tensors[name]
            if len(t.shape) == 1:
                assert u.type.name == "F32" and np.array_equal(u.data, t.data)
            else:
                assert u.type.name == qtype.upper(), name
                x = _deq(t)
                assert np.abs(_deq(u) - x).max() <= tol * np.abs(x).max(), name
            # converting straight to the type gives the same bytes as converting then quantizing
            assert np.array_equal(np.asarray(c.tensors[name].data), np.asarray(u.data)), name


def test_quantized_gguf_runs_in_llama_cpp(tmp_path):
    cfg, w = _checkpoint(tmp_path / "hf")
    out = convert(tmp_path / "hf", tmp_path / "q8.gguf", outtype="q8_0")
    theirs = _llama_cpp_logits(out, TOKENS)
    assert _rel(theirs, hf_llama_forward(w, cfg, TOKENS)) < 0.03


# ---- safety -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_threads, crash_with", [(1, KeyboardInterrupt), (2, RuntimeError)])
def test_interrupted_convert_leaves_nothing(tmp_path, monkeypatch, n_threads, crash_with):
    _checkpoint(tmp_path / "hf")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    calls = {"n": 0}
    real = output_mod.encode_block

    def crash(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise crash_with("simulated crash")  # mid-write: header and some tensors are in the temp file
        return real(*args)

    monkeypatch.setattr(output_mod, "encode_block", crash)
    with pytest.raises(crash_with):
        convert(tmp_path / "hf", out_dir / "model.gguf", outtype="q4_0", n_threads=n_threads)
    assert calls["n"] >= 5 and os.listdir(out_dir) == []


def test_existing_output_needs_force(tmp_path):
    _checkpoint(tmp_path / "hf")
    target = tmp_path / "model.gguf"
    target.write_bytes(b"precious")
    with pytest.raises(PowerInferError, match="model.gguf: already exists; pass --force"):
        convert(tmp_path / "hf", target, outtype="f16")
    assert target.read_bytes() == b"precious"
    with pytest.raises(PowerInferError, match="already exists"):
        quantize(tmp_path / "model.gguf", target, "q8_0")
    convert(tmp_path / "hf", target, outtype="f16", force=True)
    with open_gguf(target) as f:
        assert f.metadata["general.architecture"] == "llama"
    quantize(target, target, "q8_0", force=True)  # in place, through the temporary file
    with open_gguf(target) as f:
        assert f.tensors["blk.0.ffn_up.weight"].type.name == "Q8_0"
    assert sorted(os.listdir(tmp_path)) == ["hf", "model.gguf"]


def test_not_enough_disk_space(tmp_path, monkeypatch):
    _checkpoint(tmp_path / "hf")
    from powerinfer_py import outfile

    monkeypatch.setattr(outfile.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(PowerInferError, match=r"not enough free disk space .* MB are free"):
        convert(tmp_path / "hf", tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def _truncate(path: Path, n: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - n)


def test_checkpoint_errors_name_the_file(tmp_path):
    hf = tmp_path / "hf"
    _checkpoint(hf, layout="sharded")
    out = tmp_path / "o.gguf"
    shard = hf / "model-00002-of-00002.safetensors"
    _truncate(shard, 100)
    with pytest.raises(ModelFileError, match=r"model-00002-of-00002.safetensors: file is truncated: tensor"):
        convert(hf, out)
    shard.unlink()
    with pytest.raises(ModelFileError, match=r"model-00002-of-00002.safetensors: shard listed in .* is missing"):
        convert(hf, out)
    with pytest.raises(ModelFileError, match=r"nowhere: not a folder"):
        convert(tmp_path / "nowhere", out)
    taken = tmp_path / "taken.gguf"  # a missing input is named even when the output exists too
    taken.write_bytes(b"keep")
    with pytest.raises(ModelFileError, match=r"nowhere: not a folder"):
        convert(tmp_path / "nowhere", taken)
    assert taken.read_bytes() == b"keep"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match=r"empty/config.json: file not found"):
        convert(tmp_path / "empty", out)
    assert not out.exists()


def test_architecture_and_layer_errors(tmp_path):
    hf = tmp_path / "hf"
    cfg, _ = _checkpoint(hf)
    out = tmp_path / "o.gguf"
    (hf / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPTNeoXForCausalLM"]}))
    with pytest.raises(UnsupportedError, match=r"config.json: architecture 'GPTNeoXForCausalLM' is not supported"):
        convert(hf, out)
    (hf / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    with pytest.raises(ModelFileError, match=r"model.safetensors: tensor 'model.layers.1.* layer count mismatch"):
        convert(hf, out)
    (hf / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(ModelFileError, match=r"tensor 'model.layers.2.input_layernorm.weight' not found"):
        convert(hf, out)
    (hf / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(ModelFileError, match=r"gate_proj.weight' has shape \[128, 64\], config.json implies"):
        convert(hf, out)
    assert not out.exists()


CONFIG_DAMAGE = [  # found by feeding damaged checkpoints to `powerinfer convert`; each was a traceback before
    ({"max_position_embeddings": "x"}, r"max_position_embeddings must be a positive number, got 'x'"),
    ({"hidden_size": -64}, r"hidden_size must be a positive number, got -64"),
    ({"rms_norm_eps": [1, 2]}, r"rms_norm_eps must be a positive number"),
    ({"num_attention_heads": True}, r"num_attention_heads must be a positive number, got True"),
    ({"hidden_size": 64.5}, r"n_embd must be a whole number, got 64.5"),
    ({"num_attention_heads": 10 ** 12}, r"inconsistent attention sizes"),
    ({"num_key_value_heads": 8}, r"inconsistent attention sizes: 4 heads \(8 for K/V\)"),
    ({"architectures": 5}, r"architectures must be a list of class names, got 5"),
]


@pytest.mark.parametrize("change,words", CONFIG_DAMAGE, ids=[next(iter(c)) + "=" + repr(c[next(iter(c))])[:12]
                                                            for c, _ in CONFIG_DAMAGE])
def test_a_damaged_config_is_named(tmp_path, change, words):
    hf = tmp_path / "hf"
    cfg, _ = _checkpoint(hf)
    out = tmp_path / "o.gguf"
    (hf / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ModelFileError, match=r"config.json: " + words):
        convert(hf, out)
    assert not out.exists()
    (hf / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 64.0}))  # integral floats pass
    convert(hf, out)


@pytest.mark.parametrize("text,words", [("[]", "expected a JSON object, got list"),
                                        ('{"chat_template": 5}', "chat_template must be a string or a list"),
                                        ('{"chat_template": [5]}', "chat_template entries must be objects")])
def test_a_damaged_tokenizer_config_is_named(tmp_path, text, words):
    hf = tmp_path / "hf"
    _checkpoint(hf)
    (hf / "tokenizer_config.json").write_text(text)
    with pytest.raises(ModelFileError, match=words):
        convert(hf, tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()


def test_predictor_errors(tmp_path):
    hf = tmp_path / "hf"
    _checkpoint(hf, act="relu")
    out = tmp_path / "o.gguf"
    rng = np.random.default_rng(0)
    write_predictor(tmp_path / "wrong_embd", [8, 8], 32, DIMS["n_ff"], rng)
    with pytest.raises(ModelFileError, match=r"model_0.pt: fc1.weight has shape \[8, 32\], the model needs"):
        convert(hf, out, predictor=tmp_path / "wrong_embd")
    write_predictor(tmp_path / "wrong_ff", [8, 8], DIMS["n_embd"], 100, rng)
    with pytest.raises(ModelFileError, match=r"model_0.pt: fc2.weight has shape \[100, 8\]"):
        convert(hf, out, predictor=tmp_path / "wrong_ff")
    write_predictor(tmp_path / "short", [8], DIMS["n_embd"], DIMS["n_ff"], rng)
    with pytest.raises(ModelFileError, match=r"short: 1 predictor files .* 2 layers: layer count mismatch"):
        convert(hf, out, predictor=tmp_path / "short")
    pred = tmp_path / "gap"
    write_predictor(pred, [8, 8, 8], DIMS["n_embd"], DIMS["n_ff"], rng)
    (pred / "model_1.pt").unlink()
    (pred / "model_2.pt").rename(pred / "model_7.pt")
    with pytest.raises(ModelFileError, match=r"model_1.pt is missing"):
        convert(hf, out, predictor=pred)
    assert not out.exists()


def test_malicious_bin_checkpoint_is_refused(tmp_path):
    import pickle

    hf = tmp_path / "hf"
    _checkpoint(hf, layout="bin")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import zipfile
    with zipfile.ZipFile(hf / "pytorch_model.bin", "w") as z:  # replaces the real checkpoint
        z.writestr("archive/data.pkl", pickle.dumps({"model.embed_tokens.weight": Evil()}, protocol=2))
        z.writestr("archive/version", b"3\n")
    with pytest.raises(ModelFileError, match=r"pytorch_model.bin: refusing to load"):
        convert(hf, tmp_path / "o.gguf")
    assert not marker.exists() and not (tmp_path / "o.gguf").exists()


# ---- CLI ----------------------------------------------------------------------------------------------------

def test_cli_convert_and_quantize(tmp_path):
    from cli import convert_cmds

    app = typer.Typer()
    app.command("convert")(convert_cmds.convert)
    app.command("quantize")(convert_cmds.quantize)
    _checkpoint(tmp_path / "hf")
    runner = CliRunner()
    out = tmp_path / "m.gguf"
    r = runner.invoke(app, ["convert", str(tmp_path / "hf"), "-o", str(out), "--outtype", "q8_0"])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and out.exists()
    r = runner.invoke(app, ["convert", str(tmp_path / "hf"), "-o", str(out)])
    assert r.exit_code == 1 and "already exists" in r.output
    r = runner.invoke(app, ["quantize", str(out), str(tmp_path / "q4.gguf"), "q4_0"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["quantize", str(out), str(tmp_path / "x.gguf"), "q5_k"])
    assert r.exit_code == 1 and "not supported" in r.output


def test_tokenizer_json_bpe_carried_into_llama_cpp(tmp_path):
    """A byte-level BPE tokenizer.json (no tokenizer.model) becomes a "gpt2" vocabulary llama.cpp uses."""
    from hf_fixtures import write_bpe_tokenizer_json

    hf = tmp_path / "hf"
    _checkpoint(hf, arch="Qwen2ForCausalLM", qkv_bias=True)
    (hf / "tokenizer.model").unlink()
    merges = [("t", "h"), ("th", "e"), ("\u0120", "the"), ("o", "n"), ("on", "e")]
    vocab = write_bpe_tokenizer_json(hf, merges, ["<|endoftext|>", "<|im_start|>"])
    (hf / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "add_bos_token": False}))
    out = convert(hf, tmp_path / "m.gguf", outtype="f16")
    with open_gguf(out) as f:
        m = f.metadata
        assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "qwen2"
        assert m["tokenizer.ggml.merges"][:2] == ["t h", "th e"]
        eos = len(vocab)
        assert m["tokenizer.ggml.eos_token_id"] == eos and m["tokenizer.ggml.token_type"][eos] == 3  # CONTROL
        assert m["tokenizer.ggml.token_type"][-1] == 5 and len(m["tokenizer.ggml.tokens"]) == DIMS["n_vocab"]
    llm = llama_cpp.Llama(str(out), vocab_only=True, verbose=False)
    try:
        ids = llm.tokenize(b"the one", add_bos=False)
        assert ids == [vocab["the"], vocab["\u0120"], vocab["one"]]
        assert llm.detokenize(ids) == b"the one"
        assert llm.tokenize(b"<|im_start|>", add_bos=False, special=True) == [len(vocab) + 1]
    finally:
        llm.close()


# The split regexes of real tokenizer.json files (data, as the files hold them): Llama 3, Qwen2, Phi-4-mini (o200k)
_CONTR = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
_QWEN2 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
_CASED_UP, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_O200K = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED_UP}*{_LOWER}+{_CONTR}?|[^\r\n\p{{L}}\p{{N}}]?{_CASED_UP}+{_LOWER}*{_CONTR}?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(regex: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


# name, pre_tokenizer, and how llama.cpp must then split "12345" and "aB" with the merges below
_PRE_CASES = [
    ("llama-bpe", _split_then_bytes(_LLAMA3), ["123", "45"], ["aB"]),
    ("qwen2", _split_then_bytes(_QWEN2), ["1", "2", "3", "4", "5"], ["aB"]),
    ("gpt-4o", _split_then_bytes(_O200K), ["123", "45"], ["a", "B"]),
    ("tekken", _split_then_bytes(rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED_UP}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_CASED_UP}+{_LOWER}*"
                                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
     ["1", "2", "3", "4", "5"], ["a", "B"]),
    ("falcon", {"type": "Sequence", "pretokenizers": [
        {"type": "Punctuation", "behavior": "Contiguous"},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        {"type": "Digits", "individual_digits": False},
        {"type": "Split", "pattern": {"Regex": "[0-9][0-9][0-9]"}, "behavior": "Isolated", "invert": False}]},
     ["123", "45"], ["aB"]),
    ("gpt-2", {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, ["12", "34", "5"], ["aB"]),
    ("smollm", {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                       {"type": "ByteLevel", "add_prefix_space": False}]},
     ["1", "2", "3", "4", "5"], ["aB"]),
]


@pytest.mark.parametrize("name,pre,digits,letters", _PRE_CASES, ids=[c[0] for c in _PRE_CASES])
def test_pre_tokenizer_read_from_tokenizer_json(tmp_path, name, pre, digits, letters):
    """tokenizer.ggml.pre follows the split rules of tokenizer.json (it used to be "default" for every
    non-Qwen model, which splits numbers and words as no Llama 3 or Phi-4 tokenizer does), and llama.cpp then
    splits text as that model family's tokenizer would: digits in runs of three (Llama 3, o200k), one by one
    (Qwen2, SmolLM) or whole (GPT-2), letters at case changes (o200k). The merges make each split visible: "3 4"
    ranks first, so a chunk holding "34" merges it before "12"."""
    from hf_fixtures import write_bpe_tokenizer_json

    hf = tmp_path / "hf"
    _checkpoint(hf)
    (hf / "tokenizer.model").unlink()
    merges = [("3", "4"), ("1", "2"), ("12", "3"), ("4", "5"), ("a", "B")]
    vocab = write_bpe_tokenizer_json(hf, merges, ["<|endoftext|>"], pre_tokenizer=pre)
    (hf / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "add_bos_token": False}))
    out = convert(hf, tmp_path / "m.gguf", outtype="f16")
    with open_gguf(out) as f:
        assert f.metadata["tokenizer.ggml.pre"] == name
    llm = llama_cpp.Llama(str(out), vocab_only=True, verbose=False)
    try:
        assert llm.tokenize(b"12345", add_bos=False) == [vocab[t] for t in digits]
        assert llm.tokenize(b"aB", add_bos=False) == [vocab[t] for t in letters]
    finally:
        llm.close()


def test_unknown_pre_tokenizer_warns_and_keeps_the_old_name(tmp_path):
    from hf_fixtures import write_bpe_tokenizer_json

    hf = tmp_path / "hf"
    _checkpoint(hf)
    (hf / "tokenizer.model").unlink()
    write_bpe_tokenizer_json(hf, [("a", "b")], ["<|endoftext|>"], pre_tokenizer=_split_then_bytes(r"\w+|\s+"))
    with pytest.warns(UserWarning, match="not one we recognize"):
        out = convert(hf, tmp_path / "m.gguf", outtype="f16")
    with open_gguf(out) as f:
        assert f.metadata["tokenizer.ggml.pre"] == "default"


# ---- falcon and opt -----------------------------------------------------------------------------------------

def _random(rng, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    return {k: (rng.standard_normal(s) / np.sqrt(s[-1] if len(s) > 1 else 100)).astype(np.float32)
            for k, s in shapes.items()}


def _falcon_checkpoint(folder: Path, n_layer=2, d=64, n_head=4, n_kv=2, n_vocab=512):
    hd, ff = d // n_head, 4 * d
    shapes = {"transformer.word_embeddings.weight": (n_vocab, d), "transformer.ln_f.weight": (d,),
              "transformer.ln_f.bias": (d,), "lm_head.weight": (n_vocab, d)}
    for il in range(n_layer):
        p = f"transformer.h.{il}."
        shapes.update({p + "ln_attn.weight": (d,), p + "ln_attn.bias": (d,), p + "ln_mlp.weight": (d,),
                       p + "ln_mlp.bias": (d,), p + "self_attention.query_key_value.weight": ((n_head + 2 * n_kv) * hd, d),
                       p + "self_attention.dense.weight": (d, d), p + "mlp.dense_h_to_4h.weight": (ff, d),
                       p + "mlp.dense_4h_to_h.weight": (d, ff)})
    cfg = {"architectures": ["FalconForCausalLM"], "hidden_size": d, "num_attention_heads": n_head,
           "num_kv_heads": n_kv, "num_hidden_layers": n_layer, "vocab_size": n_vocab, "new_decoder_architecture": True,
           "parallel_attn": True, "bias": False, "alibi": False, "layer_norm_epsilon": 1e-5,
           "tie_word_embeddings": False, "hidden_act": "relu"}
    return cfg, write_checkpoint(folder, cfg, _random(np.random.default_rng(5), shapes), layout="single")


def test_falcon_dense_loads_in_llama_cpp_and_sparse_layout(tmp_path):
    cfg, w = _falcon_checkpoint(tmp_path / "hf")
    dense = convert(tmp_path / "hf", tmp_path / "falcon.gguf", outtype="f32")
    logits = _llama_cpp_logits(dense, TOKENS)  # llama.cpp accepts every name, shape and hparam
    assert np.isfinite(logits).all() and logits.std() > 0
    write_predictor(tmp_path / "pred", [16, 32], 64, 256, np.random.default_rng(6))
    sparse = convert(tmp_path / "hf", tmp_path / "falcon.pwri.gguf", predictor=tmp_path / "pred", outtype="f16")
    with open_gguf(sparse) as f:
        t = f.tensors
        assert f.metadata["general.architecture"] == "falcon" and f.metadata["falcon.attention.head_count_kv"] == 2
        qkv = w["transformer.h.1.self_attention.query_key_value.weight"]
        np.testing.assert_array_equal(_deq(t["blk.1.attn_qkv.weight"]), qkv[falcon_qkv_order(4, 2, 16)].astype(np.float16))
        np.testing.assert_array_equal(_deq(t["blk.0.ffn_down_t.weight"]),
                                      w["transformer.h.0.mlp.dense_4h_to_h.weight"].T.astype(np.float16))
        assert t["blk.0.attn_norm_2.bias"].shape == (64,) and t["blk.1.fc2.weight"].shape == (256, 32)
        assert "blk.0.ffn_gate.weight" not in t and "blk.0.ffn_norm.weight" not in t


def test_opt_sparse_layout(tmp_path):
    d, ff, n_vocab, n_ctx = 64, 256, 512, 32
    shapes = {"model.decoder.embed_tokens.weight": (n_vocab, d), "model.decoder.embed_positions.weight": (n_ctx + 2, d),
              "model.decoder.final_layer_norm.weight": (d,), "model.decoder.final_layer_norm.bias": (d,)}
    for il in range(2):
        p = f"model.decoder.layers.{il}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes.update({f"{p}self_attn.{proj}.weight": (d, d), f"{p}self_attn.{proj}.bias": (d,)})
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            shapes.update({f"{p}{norm}.weight": (d,), f"{p}{norm}.bias": (d,)})
        shapes.update({p + "fc1.weight": (ff, d), p + "fc1.bias": (ff,), p + "fc2.weight": (d, ff), p + "fc2.bias": (d,)})
    cfg = {"architectures": ["OPTForCausalLM"], "hidden_size": d, "ffn_dim": ff, "num_hidden_layers": 2,
           "num_attention_heads": 4, "max_position_embeddings": n_ctx, "vocab_size": n_vocab,
           "word_embed_proj_dim": d, "do_layer_norm_before": True, "activation_function": "relu"}
    w = write_checkpoint(tmp_path / "hf", cfg, _random(np.random.default_rng(7), shapes), layout="bin-sharded")
    write_predictor(tmp_path / "pred", [8, 8], d, ff, np.random.default_rng(8))
    out = convert(tmp_path / "hf", tmp_path / "opt.gguf", predictor=tmp_path / "pred", outtype="f32")
    with open_gguf(out) as f:
        t = f.tensors
        assert f.magic == "PWRI" and f.metadata["opt.context_length"] == n_ctx
        np.testing.assert_array_equal(_deq(t["position_embd.weight"]), w["model.decoder.embed_positions.weight"][2:])
        np.testing.assert_array_equal(_deq(t["blk.1.ffn_down_t.weight"]), w["model.decoder.layers.1.fc2.weight"].T)
        np.testing.assert_array_equal(_deq(t["blk.1.ffn_down_t.bias"]), w["model.decoder.layers.1.fc2.bias"])
        np.testing.assert_array_equal(_deq(t["blk.0.attn_q.bias"]), w["model.decoder.layers.0.self_attn.q_proj.bias"])
        assert "output.weight" not in t  # OPT ties its head to the embeddings
