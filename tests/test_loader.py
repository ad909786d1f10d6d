"""ModelConfig from metadata, load_weights (validation and conversion of non-kernel types), model_info."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from powerinfer_py.config import ModelConfig
from powerinfer_py.models import read_config
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.gguf import open_gguf, write_gguf
from powerinfer_py.tools.info import model_info
from powerinfer_py.gguf.load import Conversion, load_weights
from powerinfer_py.gguf.types import GGMLType, Tensor

rng = np.random.default_rng(7)


def _meta(arch: str = "llama", **extra) -> dict:
    meta = {
        "general.architecture": arch,
        "general.name": f"tiny-{arch}",
        f"{arch}.context_length": 128,
        f"{arch}.embedding_length": 64,
        f"{arch}.block_count": 2,
        f"{arch}.feed_forward_length": 256,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(32)],
    }
    meta.update(extra)
    return {k: v for k, v in meta.items() if v is not None}


def _q(name: str, ggml_type: GGMLType, shape: tuple[int, ...]) -> tuple[Tensor, np.ndarray]:
    """A quantized tensor and the f32 values it decodes to."""
    data = gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), ggml_type)
    return Tensor(name, ggml_type, shape, data), gguf.quants.dequantize(data, ggml_type)


# Where each K-quant block keeps its f16 scales (byte offsets in the block): random bytes elsewhere are valid.
_KQUANT_F16_FIELDS = {GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2), GGMLType.Q6_K: (208,)}
_KQUANT_F16_FIELDS[GGMLType.IQ4_XS] = (0,)  # its f16 d (random scale bytes after it are valid)
_KQUANT_F16_FIELDS[GGMLType.IQ3_S] = (0,)  # likewise (any grid index, sign and scale bytes)
_KQUANT_F16_FIELDS[GGMLType.TQ2_0] = (64,)  # its f16 d after the 2-bit values (any value bytes are valid)


def _kquant(name: str, ggml_type: GGMLType, shape: tuple[int, ...]) -> tuple[Tensor, np.ndarray]:
    """Random K-quant blocks with sane f16 scales (gguf cannot quantize K-quants, but it decodes them)."""
    block, size = gguf.GGML_QUANT_SIZES[ggml_type]
    blocks = rng.integers(0, 256, (int(np.prod(shape)) // block, size), dtype=np.uint8)
    for off in _KQUANT_F16_FIELDS[ggml_type]:
        scale = rng.uniform(0.001, 0.02, len(blocks)).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    t = Tensor.from_bytes(name, ggml_type, shape, blocks.reshape(-1))
    return t, gguf.quants.dequantize(t.data, ggml_type)


def _f32(name: str, shape: tuple[int, ...]) -> Tensor:
    return Tensor(name, GGMLType.F32, shape, rng.standard_normal(shape).astype(np.float32))


def _write(path: Path, meta: dict, tensors: list[Tensor], magic: str = "GGUF") -> Path:
    return write_gguf(path, meta, tensors, magic=magic)


# ---- config ------------------------------------------------------------------------------------------------

@pytest.mark.real_model
def test_real_model_config(real_model):
    c = read_config(open_gguf(real_model))
    assert (c.arch, c.name) == ("gemma3", "Gemma 3 270m")
    assert (c.n_vocab, c.n_ctx_train, c.n_embd, c.n_layer, c.n_ff) == (262144, 32768, 640, 18, 2048)
    assert (c.n_head, c.n_head_kv, c.head_dim, c.n_rot) == (4, 1, 256, 256)
    assert c.norm_eps == pytest.approx(1e-6)
    assert c.rope_neox and c.rope_freq_base == 1e6 and c.rope_freq_scale == 1.0
    assert c.rope_freq_base_swa == 10000.0 and c.sliding_window == 512
    assert c.swa_layers == tuple(il % 6 != 5 for il in range(18))
    assert sum(c.swa_layers) == 15 and not c.swa_layers[5] and not c.swa_layers[17]
    assert c.attn_scale == pytest.approx(1 / 16) and c.embd_scale == pytest.approx(math.sqrt(640))
    assert c.tied_output and not c.is_sparse and c.sparse_threshold == 0.0 and c.predictor_ranks == ()


def test_llama_defaults(tmp_path):
    f = open_gguf(_write(tmp_path / "l.gguf", _meta(), [_f32("output.weight", (32, 64))]))
    c = read_config(f)
    assert c.n_head_kv == 4 and c.head_dim == 16 and c.n_rot == 16  # defaults from head_count, n_embd/n_head
    assert c.rope_freq_base == 10000.0 and c.rope_freq_scale == 1.0 and not c.rope_neox
    assert c.n_vocab == 32 and not c.tied_output
    assert c.sliding_window == 0 and c.swa_layers == (False, False) and c.rope_freq_base_swa == 10000.0
    assert c.attn_scale == pytest.approx(0.25) and c.embd_scale == 1.0


def test_llama_explicit_keys(tmp_path):
    meta = _meta(**{"llama.attention.head_count_kv": 2, "llama.rope.dimension_count": 8,
                    "llama.rope.freq_base": 500000.0, "llama.rope.scaling.type": "linear",
                    "llama.rope.scaling.factor": 4.0, "llama.attention.key_length": 32,
                    "llama.attention.value_length": 32, "llama.vocab_size": 40})
    c = read_config(open_gguf(_write(tmp_path / "l.gguf", meta, [])))
    assert (c.n_head_kv, c.n_rot, c.head_dim, c.n_vocab) == (2, 8, 32, 40)
    assert c.rope_freq_base == 500000.0 and c.rope_freq_scale == 0.25
    assert c.attn_scale == pytest.approx(1 / math.sqrt(32)) and c.tied_output


def test_qwen2_defaults(tmp_path):
    c = read_config(open_gguf(_write(tmp_path / "q.gguf", _meta("qwen2"), [])))
    assert c.arch == "qwen2" and c.rope_neox and c.rope_freq_base == 1e6


def test_qwen3_head_dim_from_key_length(tmp_path):
    """Qwen3-0.6B's shape: 16 heads of 128 over n_embd 1024, so head_dim must come from key_length."""
    meta = _meta("qwen3", **{"qwen3.embedding_length": 1024, "qwen3.attention.head_count": 16,
                             "qwen3.attention.head_count_kv": 8, "qwen3.attention.key_length": 128,
                             "qwen3.attention.value_length": 128, "qwen3.attention.layer_norm_rms_epsilon": 1e-6,
                             "qwen3.rope.freq_base": 1e6})
    c = read_config(open_gguf(_write(tmp_path / "q3.gguf", meta, [])))
    assert (c.arch, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_rot) == ("qwen3", 1024, 16, 8, 128, 128)
    assert c.rope_neox and c.rope_freq_base == 1e6 and c.norm_eps == pytest.approx(1e-6)
    assert c.attn_scale == pytest.approx(1 / math.sqrt(128))
    # without rope.freq_base: llama.cpp's default base 10000 (qwen2's 1e6 default is not carried over)
    meta.pop("qwen3.rope.freq_base")
    assert read_config(open_gguf(_write(tmp_path / "q3b.gguf", meta, []))).rope_freq_base == 10000.0
    meta["qwen3.attention.value_length"] = 64
    with pytest.raises(UnsupportedError, match="value_length 64"):
        read_config(open_gguf(_write(tmp_path / "q3c.gguf", meta, [])))


def test_vocab_from_token_embd_without_tokenizer(tmp_path):
    meta = _meta(**{"tokenizer.ggml.tokens": None})
    c = read_config(open_gguf(_write(tmp_path / "v.gguf", meta, [_f32("token_embd.weight", (50, 64))])))
    assert c.n_vocab == 50


def test_sparse_model_config(tmp_path):
    meta = _meta(**{"powerinfer.sparse_threshold": 0.5})
    tensors = [_f32("blk.0.fc1.weight", (12, 64)), _f32("blk.1.fc1.weight", (20, 64))]
    f = open_gguf(_write(tmp_path / "s.gguf", meta, tensors, magic="PWRI"))
    c = read_config(f)
    assert c.is_sparse and c.sparse_threshold == 0.5 and c.predictor_ranks == (12, 20)
    # a PWRI file missing a layer's predictor is named
    f = open_gguf(_write(tmp_path / "s2.gguf", meta, tensors[:1], magic="PWRI"))
    with pytest.raises(ModelFileError, match=r"blk\.1\.fc1\.weight"):
        read_config(f)


def test_unknown_architecture(tmp_path):
    f = open_gguf(_write(tmp_path / "u.gguf", _meta("mamba"), []))
    with pytest.raises(UnsupportedError) as exc:
        read_config(f)
    assert "'mamba'" in str(exc.value) and all(a in str(exc.value) for a in ("llama", "qwen2", "qwen3", "gemma3"))


def test_powerinfer_architecture_parses(tmp_path):
    c = read_config(open_gguf(_write(tmp_path / "b.gguf", _meta("bamboo"), [])))
    assert c.arch == "bamboo" and c.hidden_act == "relu" and not c.rope_neox


@pytest.mark.parametrize("key", ["llama.embedding_length", "llama.block_count", "llama.context_length",
                                 "llama.attention.layer_norm_rms_epsilon", "general.architecture"])
def test_missing_required_key(tmp_path, key):
    f = open_gguf(_write(tmp_path / "m.gguf", _meta(**{key: None}), []))
    with pytest.raises(ModelFileError) as exc:
        read_config(f)
    assert repr(key) in str(exc.value) and str(f.path) in str(exc.value)


def test_wrongly_typed_key(tmp_path):
    f = open_gguf(_write(tmp_path / "w.gguf", _meta(**{"llama.block_count": "two"}), []))
    with pytest.raises(ModelFileError, match="'llama.block_count'"):
        read_config(f)


def test_gemma3_swa_and_scaling(tmp_path):
    meta = _meta("gemma3", **{"gemma3.attention.sliding_window": 16, "gemma3.attention.key_length": 32,
                              "gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0,
                              "gemma3.block_count": 7, "gemma3.attention.head_count_kv": 1})
    c = read_config(open_gguf(_write(tmp_path / "g.gguf", meta, [])))
    assert c.swa_layers == (True, True, True, True, True, False, True)
    assert c.sliding_window == 16 and c.rope_freq_scale == 0.125 and c.rope_freq_base_swa == 10000.0
    assert c.rope_neox and c.embd_scale == pytest.approx(8.0) and c.attn_scale == pytest.approx(1 / math.sqrt(32))
    meta.pop("gemma3.attention.sliding_window")  # as llama.cpp: no key = no window layers (test_gemma3_keys.py)
    c = read_config(open_gguf(_write(tmp_path / "g2.gguf", meta, [])))
    assert c.sliding_window == 0 and not any(c.swa_layers)


# ---- load_weights ------------------------------------------------------------------------------------------

def _mixed_file(tmp_path: Path):
    q5, _ = _q("blk.0.ffn_up.weight", GGMLType.Q5_1, (96, 64))
    # converted: types without a kernel (TQ2_0: 2-D to Q8_0, 1-D to F32)
    iq, iq_ref = _kquant("blk.0.extra.weight", GGMLType.TQ2_0, (5, 256))
    q41_1d, q41_ref = _kquant("blk.0.odd.weight", GGMLType.TQ2_0, (256,))
    f64 = Tensor("blk.0.f64.weight", GGMLType.F64, (3, 5), rng.standard_normal((3, 5)))
    q8, _ = _q("token_embd.weight", GGMLType.Q8_0, (32, 64))
    f16 = Tensor("blk.0.attn_q.weight", GGMLType.F16, (64, 64), rng.standard_normal((64, 64)).astype(np.float16))
    norm = _f32("output_norm.weight", (64,))
    # kept as they are: the quantized types the kernels compute on (Q5_1 above; Gemma 3's Q5_0 / Q4_K / Q6_K; Q3_K,
    # Q2_K, IQ4_XS, IQ3_S)
    native = [_q("blk.0.attn_v.weight", GGMLType.Q5_0, (16, 64))[0],
              _kquant("blk.0.ffn_gate.weight", GGMLType.Q4_K, (4, 256))[0],
              _kquant("blk.1.ffn_down.weight", GGMLType.Q6_K, (2, 256))[0],
              _kquant("blk.0.attn_output.weight", GGMLType.Q3_K, (5, 256))[0],
              _kquant("blk.0.ffn_down.weight", GGMLType.Q2_K, (3, 512))[0],
              _kquant("blk.1.ffn_gate.weight", GGMLType.IQ4_XS, (3, 512))[0],
              _kquant("blk.1.ffn_up.weight", GGMLType.IQ3_S, (3, 512))[0]]
    tensors = [q5, iq, q41_1d, f64, q8, f16, norm] + native
    refs = {iq.name: iq_ref, q41_1d.name: q41_ref,
            f64.name: f64.data.astype(np.float32)}
    return _write(tmp_path / "mixed.gguf", _meta(), tensors), refs


def test_conversion_of_non_kernel_types(tmp_path):
    path, refs = _mixed_file(tmp_path)
    f = open_gguf(path)
    w = load_weights(f)
    assert w.config.arch == "llama" and w.file is f
    assert list(w.tensors) == list(f.tensors)
    assert w.conversions == [
        Conversion("blk.0.extra.weight", GGMLType.TQ2_0, GGMLType.Q8_0),
        Conversion("blk.0.odd.weight", GGMLType.TQ2_0, GGMLType.F32),  # 1-D
        Conversion("blk.0.f64.weight", GGMLType.F64, GGMLType.F32),  # rows of 5: not a multiple of 32
    ]
    for name, ref in refs.items():
        t = w.tensors[name]
        assert t.shape == f.tensors[name].shape
        got = gguf.quants.dequantize(t.data, t.type)
        if t.type == GGMLType.F32:
            np.testing.assert_array_equal(got, ref)
        else:
            # Q8_0 re-quantization error: half a step (block max / 127 / 2) plus the f16 rounding of the
            # block scale (relative 2^-11, times up to 127 steps)
            blocks = ref.reshape(-1, 32)
            bound = np.abs(blocks).max(axis=1, keepdims=True) * (0.5 / 127 + 1 / 1024) + 1e-6
            assert np.all(np.abs(got.reshape(-1, 32) - blocks) <= bound), name
    # kernel types are untouched zero-copy views
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight", "blk.0.attn_v.weight",
                 "blk.0.ffn_gate.weight", "blk.1.ffn_down.weight", "blk.0.ffn_up.weight",
                 "blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.1.ffn_gate.weight",
                 "blk.1.ffn_up.weight"):
        assert w.tensors[name] is f.tensors[name] and np.shares_memory(w.tensors[name].data, f._map)


def test_expected_tensors_checked(tmp_path):
    path, _ = _mixed_file(tmp_path)
    f = open_gguf(path)

    def expected(extra):
        def fn(config):
            assert config.n_embd == 64
            base = {"token_embd.weight": ((32, 64), True), "output.weight": ((32, 64), False)}
            base.update(extra)
            return base
        return fn

    w = load_weights(f, expected({}))  # an optional tensor may be absent
    assert "output.weight" not in w.tensors
    with pytest.raises(ModelFileError) as exc:
        load_weights(f, expected({"blk.0.attn_k.weight": ((16, 64), True)}))
    assert "'blk.0.attn_k.weight'" in str(exc.value) and "missing" in str(exc.value)
    with pytest.raises(ModelFileError) as exc:
        load_weights(f, expected({"blk.0.ffn_up.weight": ((256, 64), True)}))
    msg = str(exc.value)
    assert "'blk.0.ffn_up.weight'" in msg and "(96, 64)" in msg and "(256, 64)" in msg


def test_unconvertible_type_is_named(tmp_path):
    block, size = gguf.GGML_QUANT_SIZES[GGMLType.Q8_1]  # gguf has no dequantizer for Q8_1
    t = Tensor.from_bytes("blk.0.x.weight", GGMLType.Q8_1, (2, 32), np.zeros(2 * size, np.uint8))
    f = open_gguf(_write(tmp_path / "x.gguf", _meta(), [t]))
    with pytest.raises(ModelFileError, match=r"'blk\.0\.x\.weight'.*Q8_1"):
        load_weights(f)


# ---- info --------------------------------------------------------------------------------------------------

def test_model_info(tmp_path):
    path, _ = _mixed_file(tmp_path)
    info = model_info(path)
    assert info["arch"] == "llama" and info["magic"] == "GGUF" and not info["sparse"]
    # a handful of tensors, not a whole model: described all the same, with the reason it cannot run
    assert not info["runnable"] and "missing required tensor 'blk.0.attn_norm.weight'" in info["problem"]
    assert info["name"] == "tiny-llama"
    assert info["file_size"] == path.stat().st_size and info["n_tensors"] == 14
    assert info["config"]["n_embd"] == 64 and info["config"]["swa_layers"] == [False, False]
    assert info["tensor_types"]["Q5_1"] == {"count": 1, "bytes": 96 * 64 // 32 * 24}
    assert info["tensor_types"]["Q5_0"] == {"count": 1, "bytes": 16 * 64 // 32 * 22}
    assert info["tensor_types"]["IQ4_XS"] == {"count": 1, "bytes": 3 * 512 // 256 * 136}  # native: not converted
    assert info["tensor_types"]["IQ3_S"] == {"count": 1, "bytes": 3 * 512 // 256 * 110}
    assert {(c["from"], c["to"], c["count"]) for c in info["conversions"]} == {
        ("TQ2_0", "Q8_0", 1), ("TQ2_0", "F32", 1), ("F64", "F32", 1)}


def test_model_info_checks_tensors_from_the_header(synthetic_model, tmp_path):
    """A whole model is runnable; the same file with one tensor of the wrong shape is not, and says which."""
    src = synthetic_model("llama", "f32")
    assert model_info(src)["runnable"] and model_info(src)["problem"] is None
    f = open_gguf(src)
    bad = [_f32(n, (t.shape[0] + 1, *t.shape[1:])) if n == "blk.1.ffn_up.weight" else t for n, t in f.tensors.items()]
    info = model_info(_write(tmp_path / "bad.gguf", dict(f.metadata), bad))
    assert not info["runnable"] and "'blk.1.ffn_up.weight' has shape" in info["problem"]
    assert info["config"]["n_layer"] == 2  # still described


def test_model_info_sparse_and_unsupported(tmp_path):
    tensors = [_f32("blk.0.fc1.weight", (12, 64)), _f32("blk.1.fc1.weight", (20, 64))]
    info = model_info(_write(tmp_path / "s.gguf", _meta("bamboo"), tensors, magic="PWRI"))
    assert info["sparse"] and info["predictor_ranks"] == [12, 20] and not info["runnable"]
    info = model_info(_write(tmp_path / "x.gguf", _meta("mamba"), []))
    assert info["config"] is None and "'mamba'" in info["problem"]
    info = model_info(_write(tmp_path / "k.gguf", _meta(**{"llama.block_count": None}), []))
    assert info["config"] is None and "'llama.block_count'" in info["problem"] and info["arch"] == "llama"
