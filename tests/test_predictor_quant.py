"""The load-time quantized copy of a float predictor (ffn.predictor_copy, the predictor_dtype load option):
the copy holds the file's values quantized by the codec, its logits stay within the quantization's error of a
numpy reference (and do differ from the exact predictor's, so the copy is what runs), the one-token C step
gives the Python path's bits with it, "exact" keeps today's tensors and results, and bad choices are refused
with a message that names the valid ones."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from powerinfer_py.errors import PowerInferError
from powerinfer_py.gguf.types import GGMLType, Tensor
from powerinfer_py.kernels import ref
from powerinfer_py.layers.ffn import (FFN, PREDICTOR_AUTO, PREDICTOR_AUTO_GLU, PREDICTOR_TYPES, FFNWeights, SparseSettings,
                                      predictor_copy, predictor_logits, resolve_predictor, transposed_predictor)
from powerinfer_py.options import PREDICTOR_HELP, LoadOptions, cli_default

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

ROOT = Path(__file__).resolve().parent.parent
N_EMBD, N_FF, RANK = 128, 200, 64
QUANT = {"q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}
FLOATS = {GGMLType.F32: np.float32, GGMLType.F16: np.float16}


def _float_tensor(name, ggml_type, values) -> Tensor:
    if ggml_type == GGMLType.BF16:
        data = (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        data = values.astype(FLOATS[ggml_type])
    return Tensor(name, ggml_type, values.shape, data)


def _weights(ggml_type=GGMLType.F16, seed=0) -> FFNWeights:
    rng = np.random.default_rng(seed)

    def t(name, shape, scale=1.0):
        return _float_tensor(f"blk.0.{name}.weight", ggml_type,
                             (rng.standard_normal(shape) * scale).astype(np.float32))

    return FFNWeights(up=t("ffn_up", (N_FF, N_EMBD), 0.1), gate=t("ffn_gate", (N_FF, N_EMBD), 0.1),
                      down_t=t("ffn_down_t", (N_FF, N_EMBD), 0.1), fc1=t("fc1", (RANK, N_EMBD), 0.1),
                      fc2=t("fc2", (N_FF, RANK), 0.3))


def _ffn(k, w, predictor, threshold=0.0) -> FFN:
    return FFN(k, w, "reglu", SparseSettings("predictor", threshold, predictor=predictor))


def _values(t: Tensor) -> np.ndarray:
    return ref.dequantize(t).astype(np.float64)


def _block_step(x: np.ndarray) -> np.ndarray:
    """Per element, the Q8_0 step (block amax / 127) of the rows of x f64 [..., K] in blocks of 32."""
    a = np.abs(x).reshape(*x.shape[:-1], -1, 32).max(axis=-1) / 127
    return np.repeat(a, 32, axis=-1)


def _weight_error(kind: str, src: np.ndarray) -> np.ndarray:
    """The bound on |copy - src| per weight: Q8_0 d/2 plus the f16 rounding of d times up to 127 codes; Q4_0's
    d = amax / 8 (one side of the range clamps at code 15: a whole step) plus its f16 rounding."""
    step = _block_step(src) * 127
    return step / 127 * 0.57 if kind == "q8_0" else step / 8 * 1.01


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
@pytest.mark.parametrize("src_type", [GGMLType.F32, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_copy_is_the_file_values_quantized(kind, src_type):
    w = _weights(src_type)
    fc1, fc2 = predictor_copy(w.fc1, w.fc2, kind)
    for src, got in ((w.fc1, fc1), (w.fc2, fc2)):
        assert (got.name, got.type, got.shape) == (src.name, QUANT[kind], src.shape)
        values = cpu.dequantize(src)
        assert np.array_equal(got.data, cpu.quantize(values, QUANT[kind]))  # the codec's bytes of the file's values
        err = np.abs(_values(got) - values)
        assert err.max() > 0 and (err <= _weight_error(kind, values.astype(np.float64)) + 1e-12).all()


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_copy_in_pieces_on_threads_gives_the_same_bytes(kind):
    """A tensor of several pieces (predictor_copy's _COPY_PIECE_VALUES), the last one short: the bytes of the
    codec on the whole tensor, whatever the thread count."""
    rng = np.random.default_rng(3)
    big = _float_tensor("blk.0.fc2.weight", GGMLType.F16, rng.standard_normal((2500, 96)).astype(np.float32))
    want = cpu.quantize(cpu.dequantize(big), QUANT[kind])
    for threads in (1, 2, 3):
        _, got = predictor_copy(None, big, kind, threads)
        assert got.type == QUANT[kind] and np.array_equal(got.data, want), threads


def test_copy_keeps_exact_and_quantized_and_unfit_predictors():
    w = _weights()
    assert predictor_copy(w.fc1, w.fc2, "exact") == (w.fc1, w.fc2)
    q = Tensor("blk.0.fc2.weight", GGMLType.Q4_0, (N_FF, RANK),
               ref.quantize(np.ones((N_FF, RANK), np.float32), GGMLType.Q4_0))
    odd = _float_tensor("blk.0.fc1.weight", GGMLType.F16, np.ones((RANK, 40), np.float32))  # 40: not whole blocks
    fc1, fc2 = predictor_copy(odd, q, "q8_0")
    assert fc1 is odd and fc2 is q  # re-quantizing a quantized file predictor would only add error


def _hidden_share(ffn: FFN, p: np.ndarray) -> float:
    return float(np.count_nonzero(np.maximum(ffn.k.matmul(ffn.fc1, p), 0))) / RANK


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_quantized_logits_within_the_quantization_error(pools, kind):
    """predict() with the copy against f64 numpy on the copy's values (error: the Q8_0 activations of p and r)
    and on the file's F16 values (plus the weights' rounding), for one token through the copy by hidden unit,
    one token through the dense fallback (most hidden units non-zero) and a batch; and clearly not the exact
    predictor's logits."""
    w = _weights()
    rng = np.random.default_rng(5)
    p_sparse = rng.standard_normal((1, N_EMBD)).astype(np.float32)
    # a p on which nearly every hidden unit is positive: fc1 · p with p along the sum of fc1's rows
    p_dense = (np.asarray(cpu.dequantize(w.fc1)).sum(axis=0, keepdims=True) * 3).astype(np.float32)
    batch = rng.standard_normal((5, N_EMBD)).astype(np.float32)
    for k in pools.values():
        ffn, exact = _ffn(k, w, kind), _ffn(k, w, "exact")
        assert ffn.fc1.type == ffn.fc2.type == QUANT[kind] and isinstance(ffn.fc2_t, ref.FC2T)
        assert _hidden_share(ffn, p_sparse) < 0.8 < _hidden_share(ffn, p_dense)  # both one-token paths run
        for p in (p_sparse, p_dense, batch):
            got = ffn.predict(p).astype(np.float64)
            for w1, w2, extra in ((_values(ffn.fc1), _values(ffn.fc2), 0.0),
                                  (_values(w.fc1), _values(w.fc2), 1.0)):
                pp = p.astype(np.float64)
                h = w1 @ pp.T  # [R, N]
                e1 = np.abs(w1) @ (0.51 * _block_step(pp)).T
                if extra:
                    e1 += _weight_error(kind, w1) @ np.abs(pp).T
                r = np.maximum(h, 0)
                e_r = e1 + 0.51 * _block_step((r + e1).T).T  # r's own Q8_0 rounding on top of fc1's error
                want = w2 @ r
                bound = np.abs(w2) @ e_r
                if extra:
                    bound += _weight_error(kind, w2) @ (r + e1)
                err = np.abs(got - want.T)
                assert (err <= bound.T * 1.05 + 1e-5).all(), (kind, p.shape, float((err / bound.T).max()))
            assert not np.array_equal(got, exact.predict(p))  # the copy is what ran


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_one_token_step_gives_the_python_path_bits(pools, kind):
    w = _weights()
    rng = np.random.default_rng(7)
    for k in pools.values():
        ffn = _ffn(k, w, kind, threshold=0.2)
        assert ffn.fused is not None
        for _ in range(3):
            x, p = (rng.standard_normal((1, N_EMBD)).astype(np.float32) for _ in range(2))
            fused = ffn(x, p)
            plan, ffn.fused = ffn.fused, None
            python = ffn(x, p)
            ffn.fused = plan
            assert np.array_equal(fused, python)


def test_exact_keeps_todays_tensors_and_bits(pools):
    """predictor "exact" (and SparseSettings' default) runs the file's fc1/fc2 themselves, with today's F16
    transposed fc2: its logits are the bits of the kernels called as predictor mode called them before the
    option existed, and its outputs the default settings' bits."""
    w = _weights()
    rng = np.random.default_rng(9)
    for k in pools.values():
        ffn = _ffn(k, w, "exact")
        default = FFN(k, w, "reglu", SparseSettings("predictor", 0.0))
        assert ffn.fc1 is w.fc1 and ffn.fc2 is w.fc2 and default.fc1 is w.fc1
        assert ffn.fc2_t.type == GGMLType.F16 and ffn.fc2_t.shape == (RANK, N_FF)
        fc2_t = transposed_predictor(w.fc2, k)
        for n in (1, 4):
            p = rng.standard_normal((n, N_EMBD)).astype(np.float32)
            r = np.maximum(k.matmul(w.fc1, p), 0)
            old = predictor_logits(k, fc2_t, r) if n == 1 else None
            old = k.matmul(w.fc2, r) if old is None else old
            assert np.array_equal(ffn.predict(p), old)
            x = rng.standard_normal((n, N_EMBD)).astype(np.float32)
            assert np.array_equal(ffn(x, p), default(x, p))


def test_choices_resolve_and_bad_ones_are_refused():
    assert PREDICTOR_TYPES == ("auto", "exact", "q8_0", "q4_0")
    assert resolve_predictor(None, "predictor") == resolve_predictor("auto", "predictor") == PREDICTOR_AUTO
    for variant in ("reglu", "fatreglu", "dreglu", "relu"):
        assert resolve_predictor("auto", "predictor", variant) == PREDICTOR_AUTO == "q8_0"
    for variant in ("swiglu", "geglu"):  # trained predictors of gated non-ReLU FFNs: as stored by default
        assert resolve_predictor("auto", "predictor", variant) == PREDICTOR_AUTO_GLU == "exact"
        assert resolve_predictor("q8_0", "predictor", variant) == "q8_0"
    assert resolve_predictor("Q4_0", "predictor") == "q4_0"
    assert resolve_predictor("exact", "off") == resolve_predictor("auto", "exact") == "exact"
    for bad in ("q5_k", "f16", "", 8):
        with pytest.raises(PowerInferError, match=r"unknown predictor dtype .*; one of auto, exact, q8_0, q4_0"):
            resolve_predictor(bad, "predictor")
    with pytest.raises(PowerInferError, match="applies to sparse mode 'predictor' only; this model runs in 'exact'"):
        resolve_predictor("q8_0", "exact")


@pytest.fixture(scope="module")
def tiny_f16(tmp_path_factory):
    from powerinfer_py.synth.sparse import SHAPES, write_sparse_model

    path = tmp_path_factory.mktemp("predq") / "tiny.f16.pwri"
    write_sparse_model(path, n_layer=2, dtype="f16", **SHAPES["tiny"])
    return path


def test_load_option_reaches_the_layers(tiny_f16):
    """load()'s predictor_dtype (checked before anything else is built) decides what every layer runs."""
    from powerinfer_py import models
    from powerinfer_py.gguf import open_gguf
    from powerinfer_py.gguf.load import load_weights
    from powerinfer_py.layers.ffn import runtime_sparse
    import powerinfer_py

    with pytest.raises(PowerInferError, match="unknown predictor dtype 'fp8'"):
        powerinfer_py.load(tiny_f16, threads=1, predictor_dtype="fp8")
    with pytest.raises(PowerInferError, match="applies to sparse mode 'predictor' only"):
        powerinfer_py.load(tiny_f16, threads=1, sparse="exact", predictor_dtype="q4_0")
    f = open_gguf(tiny_f16)
    try:
        cfg = models.read_config(f)
        tensors = load_weights(f, expected=models.expected_tensors, config=cfg).tensors
        k = cpu.CpuKernels(1)
        for choice, want in (("auto", QUANT[PREDICTOR_AUTO] if PREDICTOR_AUTO != "exact" else GGMLType.F16),
                             ("exact", GGMLType.F16), ("q4_0", GGMLType.Q4_0)):
            m = models.build_model(cfg, tensors, k, runtime_sparse(cfg, None, None, None, choice))
            assert all(f.fc1.type == f.fc2.type == want and f.fused is not None for f in m.ffns), choice
            if choice == "exact":
                assert all(f.fc1 is tensors[f"blk.{i}.fc1.weight"] for i, f in enumerate(m.ffns))
        k.close()
    finally:
        f.close()


def test_cli_flag_and_its_refusal(tiny_f16):
    from powerinfer_cli.main import app

    assert cli_default(LoadOptions, "predictor_dtype") == LoadOptions().predictor_dtype == "auto"
    res = CliRunner().invoke(app, ["run", "-m", str(tiny_f16), "hello", "-n", "1", "--predictor-dtype", "int3"])
    assert res.exit_code != 0
    assert "unknown predictor dtype 'int3'; one of auto, exact, q8_0, q4_0" in res.output + (res.stderr or "")
    res = CliRunner().invoke(app, ["bench", "-m", str(tiny_f16), "--predictor-dtype", "q2"])
    assert res.exit_code != 0 and "unknown predictor dtype 'q2'" in res.output + (res.stderr or "")
    for flag, note in ((["--predictor-dtype", "q4_0"], "converted at load: 4 tensors F16 -> Q4_0"),
                       (["--predictor-dtype", "exact"], None)):
        res = CliRunner().invoke(app, ["run", "-m", str(tiny_f16), "hello", "-n", "2", "--temp", "0", "-v"] + flag)
        assert res.exit_code == 0, res.stderr
        assert f"predictor dtype {flag[1]}" in res.stderr
        assert (note in res.stderr) if note else ("converted at load" not in res.stderr)


def test_default_is_documented():
    """The default the code resolves "auto" to is the one the option's help and docs/sparse.md state."""
    assert (f'"auto" (the default) picks "{PREDICTOR_AUTO}" for ReLU-family models and "{PREDICTOR_AUTO_GLU}" for '
            'SwiGLU/GeGLU models') in PREDICTOR_HELP
    doc = " ".join((ROOT / "docs/sparse.md").read_text(encoding="utf-8").split())
    assert (f"`--predictor-dtype auto` (the default) is `{PREDICTOR_AUTO}` for ReLU-family models and "
            f"`{PREDICTOR_AUTO_GLU}` for SwiGLU/GeGLU models") in doc
