"""Bad input to the model-wide mode: sparsities out of range, models it does not cover, calibrated files whose
metadata does not match their tensors. Each is a one-line error naming the problem, exit 1, nothing written."""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import powerinfer_py
from powerinfer_cli.main import app
from powerinfer_py.errors import ModelFileError, PowerInferError, UnsupportedError
from powerinfer_py.gguf import open_gguf, write_gguf
from powerinfer_py.gguf.types import GGMLType, Tensor
from powerinfer_py.layers import wide as W
from powerinfer_py.synth.sparse import write_sparse_model
from powerinfer_py.tools.wide_calibrate import calibrate_wide

TEXT = " ".join(["the little boat went out on the water and came back with fish for the town"] * 8)
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_user_error(res, *words):
    assert res.exit_code == 1, (res.exit_code, res.stdout, res.stderr)
    assert res.stderr.startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for w in words:
        assert w in res.stderr, (w, res.stderr)


@pytest.fixture(scope="module")
def calibrated(synthetic_model, tmp_path_factory):
    src = synthetic_model("llama", "f32")
    out = tmp_path_factory.mktemp("wide_err") / "w.gguf"
    calibrate_wide(src, out, 0.3, text=TEXT, n_tokens=120, ctx=64, threads=1, criterion="wina")
    return src, out


@pytest.mark.parametrize("value", ["0.96", "-0.1", "1.5", "nan"])
def test_calibrate_sparsity_out_of_range_writes_nothing(synthetic_model, tmp_path, value):
    out = tmp_path / "w.gguf"
    res = invoke("calibrate", "-m", synthetic_model("llama", "f32"), "--wide", "--sparsity", value, "--tokens", "20",
                 "--text", _text(tmp_path), "-o", out)
    assert_user_error(res, "--sparsity must be in [0, 0.95]")
    assert list(tmp_path.iterdir()) == [tmp_path / "t.txt"]


def _text(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text(TEXT)
    return p


def test_run_sparsity_out_of_range(calibrated):
    _, cal = calibrated
    with pytest.raises(PowerInferError, match=r"\[0, 0.95\]"):
        powerinfer_py.load(cal, sparsity=0.97)
    res = invoke("run", "-m", cal, "hello", "-n", "2", "--sparsity", "0.99", "-t", "1")
    assert_user_error(res, "--sparsity must be in [0, 0.95]")


def test_wide_mode_needs_the_calibration(synthetic_model):
    with pytest.raises(PowerInferError, match="calibrate -m MODEL --wide"):
        powerinfer_py.load(synthetic_model("llama", "f32"), sparse="wide")


def test_threshold_only_options_do_not_go_with_wide(synthetic_model, tmp_path):
    res = invoke("calibrate", "-m", synthetic_model("llama", "f32"), "--wide", "--sparsity", "0.3", "--one-stage",
                 "--text", _text(tmp_path), "-o", tmp_path / "w.gguf")
    assert_user_error(res, "not of --wide")
    res = invoke("calibrate", "-m", synthetic_model("llama", "f32"), "--sparsity", "0.3", "--criterion", "wina",
                 "--text", _text(tmp_path), "-o", tmp_path / "w.gguf")
    assert_user_error(res, "--criterion and --rotate apply to --wide only")
    assert not (tmp_path / "w.gguf").exists()


def test_relu_pwri_file_is_refused_naming_the_arch(tmp_path):
    pwri, _ = write_sparse_model(tmp_path / "relu.pwri", n_layer=1, n_embd=64, n_ff=128, n_head=4, n_vocab=512,
                                 dtype="f32", rank=16, n_sample=32)
    with pytest.raises(UnsupportedError, match="PowerInfer \\(PWRI\\) llama file"):
        powerinfer_py.load(pwri, sparse="wide")
    res = invoke("calibrate", "-m", pwri, "--wide", "--sparsity", "0.3", "--text", _text(tmp_path),
                 "-o", tmp_path / "w.gguf")
    assert_user_error(res, "PWRI", "llama")
    assert not (tmp_path / "w.gguf").exists()


@pytest.mark.parametrize("arch,words", [("qwen2moe", ("qwen2moe", "mixture of experts")),
                                        ("mamba2", ("mamba2",)),
                                        ("phi3", ("phi3",)),
                                        ("arcee", ("arcee", "relu2")),
                                        ("glm4", ("glm4", "blk.0.attn_q.weight")),
                                        ("olmo2", ("olmo2", "own forward"))])
def test_models_the_mode_does_not_cover_are_refused_naming_the_arch(synthetic_model, tmp_path, arch, words):
    src = synthetic_model(arch, "f32")
    res = invoke("calibrate", "-m", src, "--wide", "--sparsity", "0.3", "--text", _text(tmp_path),
                 "-o", tmp_path / "w.gguf")
    assert_user_error(res, *words)
    assert not (tmp_path / "w.gguf").exists()


def _rewrite(src, dst, *, drop=(), replace=None, meta_edit=None):
    """A copy of the calibrated file with tensors dropped or replaced, or its metadata edited."""
    with open_gguf(src) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        tensors = [t for n, t in f.tensors.items() if n not in drop]
        if replace:
            tensors = [replace.get(t.name, t) for t in tensors]
        if meta_edit:
            meta_edit(meta, types)
        write_gguf(dst, meta, tensors, types=types, magic=f.magic, alignment=f.alignment)
    return dst


def test_missing_transposed_tensor(calibrated, tmp_path):
    bad = _rewrite(calibrated[1], tmp_path / "bad.gguf", drop={"blk.1.ffn_down_t.weight"})
    with pytest.raises(ModelFileError, match="missing required tensor 'blk.1.ffn_down_t.weight'"):
        powerinfer_py.load(bad)
    assert_user_error(invoke("run", "-m", bad, "hi", "-n", "1"), "blk.1.ffn_down_t.weight")


def test_transposed_tensor_of_the_wrong_shape(calibrated, tmp_path):
    wrong = np.zeros((64, 100), np.float32)
    bad = _rewrite(calibrated[1], tmp_path / "bad.gguf",
                   replace={"blk.0.attn_qkv_t.weight": Tensor("blk.0.attn_qkv_t.weight", GGMLType.F32, wrong.shape, wrong)})
    with pytest.raises(ModelFileError, match="'blk.0.attn_qkv_t.weight' has shape \\(64, 100\\), expected \\(64, 128\\)"):
        powerinfer_py.load(bad)


@pytest.mark.parametrize("key,n", [(W.KEY_QUANTILES, 50), (W.KEY_ALLOC, 7), (W.KEY_CUTOFFS, 3),
                                   (W.KEY_COL_NORMS + "1", 10)])
def test_tables_of_the_wrong_length(calibrated, tmp_path, key, n):
    def edit(meta, types):
        meta[key] = np.asarray(meta[key], np.float32)[:n]
    bad = _rewrite(calibrated[1], tmp_path / "bad.gguf", meta_edit=edit)
    with pytest.raises(ModelFileError, match=f"{key} holds {n} values"):
        powerinfer_py.load(bad)
    assert_user_error(invoke("run", "-m", bad, "hi", "-n", "1", "--sparse", "off"), key)  # off reads them too


def test_missing_table_and_bad_criterion(calibrated, tmp_path):
    def drop(meta, types):
        meta.pop(W.KEY_ALLOC)
    with pytest.raises(ModelFileError, match=f"without {W.KEY_ALLOC}"):
        powerinfer_py.load(_rewrite(calibrated[1], tmp_path / "a.gguf", meta_edit=drop))

    def crit(meta, types):
        meta[W.KEY_CRITERION] = "oracle"
    with pytest.raises(ModelFileError, match="criterion 'oracle' is not one of"):
        powerinfer_py.load(_rewrite(calibrated[1], tmp_path / "b.gguf", meta_edit=crit))


def test_calibrating_a_calibrated_file_is_refused(calibrated, tmp_path):
    with pytest.raises(PowerInferError, match="already a wide-calibrated file"):
        calibrate_wide(calibrated[1], tmp_path / "x.gguf", 0.3, text=TEXT, n_tokens=40, ctx=32, threads=1)
    assert not (tmp_path / "x.gguf").exists()


def test_rotated_file_without_its_rotation_or_with_a_bad_rotated_key(synthetic_model, tmp_path):
    cal = tmp_path / "r.gguf"
    calibrate_wide(synthetic_model("llama", "q8_0"), cal, 0.3, text=TEXT, n_tokens=120, ctx=64, threads=1,
                   criterion="plain", rotate=True)
    with open_gguf(cal) as f:
        assert f.metadata[W.KEY_ROTATED] == "ffn_in" and "blk.1.ffn_in_rot.weight" in f.tensors
        assert "blk.1.attn_in_rot.weight" not in f.tensors
    bad = _rewrite(cal, tmp_path / "bad.gguf", drop={"blk.0.ffn_in_rot.weight"})
    with pytest.raises(ModelFileError, match="missing required tensor 'blk.0.ffn_in_rot.weight'"):
        powerinfer_py.load(bad)

    def edit(meta, types):
        meta[W.KEY_ROTATED] = "ffn_in,ffn_mid"
    with pytest.raises(ModelFileError, match="names 'ffn_mid'"):
        powerinfer_py.load(_rewrite(cal, tmp_path / "bad2.gguf", meta_edit=edit))


@pytest.fixture(scope="module")
def tiled(synthetic_model, tmp_path_factory):
    """A wide file of a quantized source: its transposes in Q8 tiles (I8 .weight + F32 .scale)."""
    src = synthetic_model("llama", "q4_0")
    out = tmp_path_factory.mktemp("wide_tiles") / "w.gguf"
    calibrate_wide(src, out, 0.3, text=TEXT, n_tokens=120, ctx=64, threads=1, criterion="plain")
    with open_gguf(out) as f:
        assert f.tensors["blk.0.attn_qkv_t.weight"].type == GGMLType.I8
        assert f.tensors["blk.0.attn_qkv_t.scale"].shape == (2, 4)
    return src, out


def _scale(tiled, name="blk.0.attn_qkv_t.scale"):
    with open_gguf(tiled[1]) as f:
        return np.array(f.tensors[name].data, np.float32)


def test_the_tiled_file_itself_runs(tiled):
    """(The cases below break this file one tensor at a time.)"""
    res = invoke("run", "-m", tiled[1], "the little boat", "-n", "3", "--temp", "0", "-t", "1")
    assert res.exit_code == 0, res.stderr


def test_i8_weight_without_its_scale(tiled, tmp_path):
    bad = _rewrite(tiled[1], tmp_path / "bad.gguf", drop={"blk.1.ffn_down_t.scale"})
    with pytest.raises(ModelFileError, match="'blk.1.ffn_down_t.weight' is I8 .* no 'blk.1.ffn_down_t.scale'"):
        powerinfer_py.load(bad)
    assert_user_error(invoke("run", "-m", bad, "hi", "-n", "1", "--sparse", "off"), "blk.1.ffn_down_t.scale")


def test_tile_scale_of_the_wrong_shape(tiled, tmp_path):
    d = np.ones((2, 3), np.float32)
    name = "blk.0.attn_qkv_t.scale"
    bad = _rewrite(tiled[1], tmp_path / "bad.gguf", replace={name: Tensor(name, GGMLType.F32, d.shape, d)})
    with pytest.raises(ModelFileError, match=r"'blk.0.attn_qkv_t.scale' has shape \(2, 3\), expected \(2, 4\)"):
        powerinfer_py.load(bad)


def test_tile_scale_of_the_wrong_type(tiled, tmp_path):
    name = "blk.0.attn_qkv_t.scale"
    d = _scale(tiled).astype(np.float16)
    bad = _rewrite(tiled[1], tmp_path / "bad.gguf", replace={name: Tensor(name, GGMLType.F16, d.shape, d)})
    with pytest.raises(ModelFileError, match="'blk.0.attn_qkv_t.scale' .* must be F32, got F16"):
        powerinfer_py.load(bad)


@pytest.mark.parametrize("value,words", [(np.nan, "not finite"), (np.inf, "not finite"), (-0.01, "negative scale")])
def test_tile_scale_not_finite_or_negative(tiled, tmp_path, value, words):
    name = "blk.1.ffn_gate_up_t.scale"
    d = _scale(tiled, name)
    d[1, 5] = value
    bad = _rewrite(tiled[1], tmp_path / "bad.gguf", replace={name: Tensor(name, GGMLType.F32, d.shape, d)})
    with pytest.raises(ModelFileError, match=f"'blk.1.ffn_gate_up_t.scale' .* {words}"):
        powerinfer_py.load(bad)
    assert_user_error(invoke("run", "-m", bad, "hi", "-n", "1"), "blk.1.ffn_gate_up_t.scale", words)


def test_i8_weight_of_the_wrong_shape(tiled, tmp_path):
    name = "blk.0.ffn_gate_up_t.weight"
    q = np.zeros((64, 224), np.int8)  # its scale (2, 8) would fit 225..256 columns: the weight's shape is checked
    bad = _rewrite(tiled[1], tmp_path / "bad.gguf", replace={name: Tensor(name, GGMLType.I8, q.shape, q)})
    with pytest.raises(ModelFileError,
                       match=r"'blk.0.ffn_gate_up_t.weight' has shape \(64, 224\), expected \(64, 256\)"):
        powerinfer_py.load(bad)


def test_a_tile_scale_beside_a_weight_that_is_not_i8(tiled, calibrated, tmp_path):
    """A .scale tensor next to a float transpose: the file mixes layouts, refused naming both tensors."""
    with open_gguf(calibrated[1]) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        tensors = list(f.tensors.values())
        d = np.ones((2, 4), np.float32)
        tensors.append(Tensor("blk.0.attn_qkv_t.scale", GGMLType.F32, d.shape, d))
        write_gguf(tmp_path / "bad.gguf", meta, tensors, types=types, magic=f.magic, alignment=f.alignment)
    with pytest.raises(ModelFileError, match="'blk.0.attn_qkv_t.scale' holds Q8 tile scales, but "
                                             "'blk.0.attn_qkv_t.weight' is F32, not I8"):
        powerinfer_py.load(tmp_path / "bad.gguf")
