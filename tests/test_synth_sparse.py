"""The synthetic sparse model generator (powerinfer_py.synth.sparse) and its hidden CLI command.

Tiny shapes only (d 128, n_ff 512): every file is written in well under a second. The activity figures are
measured on fresh random tokens, not the tokens the generator calibrated on, and checked once more against an
independent forward pass built from tests/reference_forward.py."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import math

import numpy as np
import pytest
import typer
from reference_forward import causal_attention, dequantize, rms_norm, rope
from typer.testing import CliRunner

from powerinfer_py.synth import sparse as S
from powerinfer_py.tools.bench import LlamaCppRef
from powerinfer_py.models import read_config
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.types import GGMLType

TINY = S.SHAPES["tiny"]
D, F, R = TINY["n_embd"], TINY["n_ff"], TINY["rank"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """made(dtype="f16", dense=True, **kw) -> (pwri, dense or None), each parameter set written once."""
    folder = tmp_path_factory.mktemp("synth_sparse")
    cache: dict = {}

    def make(dtype: str = "f16", dense: bool = True, **kw):
        key = (dtype, dense, tuple(sorted(kw.items())))
        if key not in cache:
            stem = folder / f"m{len(cache)}-{dtype}"
            kw = {"n_layer": 2, "n_sample": 1024, **TINY, **kw}
            cache[key] = S.write_sparse_model(stem.with_suffix(".pwri"), dtype=dtype,
                                              dense_path=stem.with_suffix(".gguf") if dense else None, **kw)
        return cache[key]

    return make


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- files -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_pwri_reads_back_with_tensors_shapes_and_metadata(made, dtype):
    pwri, _ = made(dtype)
    f = open_gguf(pwri)
    assert f.magic == "PWRI" and f.is_sparse
    want = S.DTYPES[dtype]
    for il in range(2):
        p = f"blk.{il}."
        shapes = {"attn_q": (D, D), "attn_k": (D, D), "attn_v": (D, D), "attn_output": (D, D),
                  "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down_t": (F, D), "fc1": (R, D), "fc2": (F, R)}
        for name, shape in shapes.items():
            t = f.tensors[p + name + ".weight"]
            assert (t.shape, t.type) == (shape, want), name
        for name in ("attn_norm", "ffn_norm"):
            assert f.tensors[p + name + ".weight"].type == GGMLType.F32
        assert p + "ffn_down.weight" not in f.tensors
    assert f.tensors["token_embd.weight"].shape == (TINY["n_vocab"], D)
    assert f.tensors["output.weight"].shape == (TINY["n_vocab"], D)
    cfg = read_config(f)
    assert (cfg.arch, cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_head) == ("llama", 2, D, F, TINY["n_head"])
    assert cfg.is_sparse and cfg.predictor_ranks == (R, R) and cfg.hidden_act == "relu"
    info = S.synth_info(pwri)
    assert cfg.sparse_threshold == pytest.approx(info["threshold"]) and info["threshold"] != 0.0
    assert f.metadata["powerinfer.hidden_act"] == "relu"
    assert 0.08 < info["measured_active"] < 0.12 and info["measured_recall"] == pytest.approx(0.9, abs=0.01)
    f.close()


def test_dense_twin_holds_the_same_weights(made):
    """Every tensor the two files share has the same bytes; ffn_down is ffn_down_t transposed (exact in f16)."""
    pwri, dense = made("f16")
    fs, fd = open_gguf(pwri), open_gguf(dense)
    assert fd.magic == "GGUF" and not fd.is_sparse
    assert not any(n.endswith(("fc1.weight", "fc2.weight", "ffn_down_t.weight")) for n in fd.tensors)
    assert read_config(fd).hidden_act == "relu"
    shared = [n for n in fd.tensors if n in fs.tensors]
    assert len(shared) == len(fd.tensors) - 2  # all but the two ffn_down
    for n in shared:
        assert np.array_equal(np.asarray(fs.tensors[n].data), np.asarray(fd.tensors[n].data)), n
    for il in range(2):
        down, down_t = fd.tensors[f"blk.{il}.ffn_down.weight"], fs.tensors[f"blk.{il}.ffn_down_t.weight"]
        assert down.shape == (D, F)
        assert np.array_equal(np.asarray(down.data), np.asarray(down_t.data).T)
    fs.close()
    fd.close()


@pytest.mark.parametrize("dtype", ["f16", "q4_0"])
def test_dense_twin_runs_in_llama_cpp(made, dtype):
    import llama_cpp

    _, dense = made(dtype)
    llm = llama_cpp.Llama(str(dense), vocab_only=False, n_ctx=64, n_threads=1, verbose=False)
    ids = llm.tokenize(b"the cat and the dog")
    assert ids[0] == 1 and len(ids) > 3
    llm.close()
    ref = LlamaCppRef(dense, n_ctx=64, threads=1)  # the low-level API: logits of the last position
    logits = ref.decode(ids)
    ref.close()
    assert logits.shape == (TINY["n_vocab"],) and np.isfinite(logits).all() and logits.std() > 0.1


# ---- sparsity: real, data-dependent, following the law ----------------------------------------------------

@pytest.mark.parametrize("mean_active,power", [(0.10, 1.0), (0.05, 1.5), (0.25, 0.7)])
def test_activation_frequency_follows_the_design(made, mean_active, power):
    pwri, _ = made("f16", dense=False, n_layer=3, mean_active=mean_active, power=power)
    st = S.measure_sparsity(pwri, n_tokens=2048, seed=7)  # tokens the generator never saw
    assert st.active == pytest.approx(mean_active, rel=0.12)
    assert all(a == pytest.approx(mean_active, rel=0.2) for a in st.layer_active)
    intended = np.stack([S.intended_probabilities(0, il, F, mean_active, power) for il in range(3)])
    assert intended.mean() == pytest.approx(mean_active, rel=1e-3)
    assert np.corrcoef(st.frequencies.ravel(), intended.ravel())[0, 1] > 0.97
    assert np.abs(st.frequencies - intended).mean() < 0.03
    # the hottest 5% and the coldest 20% of the neurons fire as often as designed
    hot, cold = intended >= np.quantile(intended, 0.95), intended <= np.quantile(intended, 0.2)
    assert st.frequencies[hot].mean() == pytest.approx(intended[hot].mean(), rel=0.05)
    assert st.frequencies[cold].mean() == pytest.approx(intended[cold].mean(), rel=0.25, abs=0.002)
    assert intended[hot].mean() > 5 * intended[cold].mean()


def test_power_law_is_skewed():
    p = S.firing_probabilities(11008, 0.10, 1.0, np.random.default_rng(0))
    assert p.mean() == pytest.approx(0.10, rel=1e-3)
    top = np.sort(p)[::-1]
    assert top[0] == pytest.approx(S.P_CAP)  # a few neurons fire for almost every token
    assert np.median(p) < 0.05  # most fire rarely
    assert top[: len(p) // 4].sum() / p.sum() > 0.6  # a quarter of the neurons carry most of the activity


def test_sparsity_depends_on_the_tokens(made):
    """Different tokens activate different neurons: the set is decided by the data, not fixed."""
    pwri, _ = made("f16", dense=False)
    a = S.measure_sparsity(pwri, tokens=np.array([[5, 6]]))
    b = S.measure_sparsity(pwri, tokens=np.array([[300, 301]]))
    fa, fb = a.frequencies[0] > 0, b.frequencies[0] > 0
    jaccard = (fa & fb).sum() / (fa | fb).sum()
    assert 0.05 < jaccard < 0.7


@pytest.mark.parametrize("recall", [0.8, 0.9, 0.97])
def test_predictor_recall_is_the_requested_one(made, recall):
    pwri, _ = made("q4_0", dense=False, n_layer=3, recall=recall)
    st = S.measure_sparsity(pwri, n_tokens=2048, seed=11)
    assert st.recall == pytest.approx(recall, abs=0.025)
    assert st.threshold == pytest.approx(S.synth_info(pwri)["threshold"])
    # a useful predictor: it marks few more neurons than are active (at 0.9: ~12% for 10% active)
    assert st.active * recall * 0.9 < st.predicted < st.active * 2


def test_more_noise_costs_precision(made):
    clean = S.measure_sparsity(made("f16", dense=False, noise=0.1)[0], n_tokens=1024, seed=3)
    noisy = S.measure_sparsity(made("f16", dense=False, noise=0.8)[0], n_tokens=1024, seed=3)
    assert clean.recall == pytest.approx(0.9, abs=0.03) and noisy.recall == pytest.approx(0.9, abs=0.03)
    assert noisy.predicted > clean.predicted * 1.3


def _reference_active(dense_path, ids: np.ndarray) -> list[np.ndarray]:
    """Truly active neurons [T, n_ff] per layer of one sequence, from reference_forward's primitives on the
    dense twin: an implementation that shares nothing with synth_sparse's forward pass."""
    f = open_gguf(dense_path)
    w = {n: dequantize(t) for n, t in f.tensors.items()}
    m, a = f.metadata, "llama"
    n_head, eps = m[f"{a}.attention.head_count"], m[f"{a}.attention.layer_norm_rms_epsilon"]
    f.close()
    hd, pos = D // n_head, np.arange(len(ids), dtype=np.float64)
    x = w["token_embd.weight"][ids].astype(np.float64)
    out = []
    for il in range(m[f"{a}.block_count"]):
        def L(s: str, il: int = il) -> np.ndarray:
            return w[f"blk.{il}.{s}.weight"]

        h = rms_norm(x, L("attn_norm"), eps)
        q, k, v = (h @ L(n).T for n in ("attn_q", "attn_k", "attn_v"))
        q, k = (rope(t.reshape(len(ids), n_head, hd), pos, hd, 10000.0, 1.0, False) for t in (q, k))
        att = causal_attention(q, k, v.reshape(len(ids), n_head, hd), 1.0 / math.sqrt(hd), 0)
        x = x + att.reshape(len(ids), -1) @ L("attn_output").T
        h = rms_norm(x, L("ffn_norm"), eps)
        g = h @ L("ffn_gate").T
        out.append(g > 0)
        x = x + (np.maximum(g, 0) * (h @ L("ffn_up").T)) @ L("ffn_down").T
    return out


def test_measurement_agrees_with_an_independent_forward_pass(made):
    pwri, dense = made("f16", n_layer=3)
    ids = np.random.default_rng(5).integers(3, TINY["n_vocab"], size=48)
    ref = _reference_active(dense, ids)
    st = S.measure_sparsity(pwri, tokens=ids[None])
    for il, mask in enumerate(ref):
        # frequencies over one sequence: counts of active positions per neuron
        assert np.abs(st.frequencies[il] * len(ids) - mask.sum(axis=0)).max() <= 1
        assert st.layer_active[il] == pytest.approx(mask.mean(), abs=2e-3)


# ---- determinism, arguments, atomicity, CLI ----------------------------------------------------------------

def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    kw = dict(n_layer=1, dtype="q4_0", **TINY)
    a = S.write_sparse_model(tmp_path / "a.pwri", dense_path=tmp_path / "a.gguf", seed=3, **kw)
    b = S.write_sparse_model(tmp_path / "b.pwri", dense_path=tmp_path / "b.gguf", seed=3, **kw)
    c = S.write_sparse_model(tmp_path / "c.pwri", seed=4, **kw)
    assert _sha(a[0]) == _sha(b[0]) and _sha(a[1]) == _sha(b[1])
    assert _sha(a[0]) != _sha(c[0])


@pytest.mark.parametrize("kw,match", [
    (dict(arch="falcon"), "arch"), (dict(dtype="q5_k"), "dtype"), (dict(rank=63), "rank"),
    (dict(rank=48, dtype="q4_0"), "multiples of 32"), (dict(n_head=3), "head"), (dict(recall=1.5), "recall"),
    (dict(mean_active=0.0), "mean_active"),
])
def test_bad_arguments_are_refused(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        S.write_sparse_model(tmp_path / "x.pwri", **{"n_layer": 1, **TINY, **kw})
    assert not list(tmp_path.iterdir())


def test_interrupted_write_leaves_nothing(tmp_path):
    def stop(name, i, n):
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        S.write_sparse_model(tmp_path / "x.pwri", dense_path=tmp_path / "x.gguf", n_layer=2, progress=stop, **TINY)
    assert not list(tmp_path.iterdir())  # neither file, no temporary left behind


def _cli():
    from powerinfer_cli.synth_cmd import EPILOG, synth

    app = typer.Typer()
    app.command("synth", hidden=True, epilog=EPILOG)(synth)
    app.command("noop", hidden=True)(lambda: None)  # two commands: Typer keeps "synth" as a sub-command
    return app


def test_cli_synth_writes_both_files_and_refuses_to_overwrite(tmp_path):
    app, out, dense = _cli(), tmp_path / "t.pwri", tmp_path / "t.gguf"
    args = ["synth", str(out), "--shape", "tiny", "--layers", "2", "--dtype", "q8_0", "--dense", str(dense),
            "--active", "0.2", "--recall", "0.95"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert open_gguf(out).is_sparse and not open_gguf(dense).is_sparse
    info = S.synth_info(out)
    assert info["mean_active"] == pytest.approx(0.2) and info["recall_target"] == pytest.approx(0.95)
    assert "active" in r.output and "recall" in r.output
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1 and "already exists" in r.output
    r = CliRunner().invoke(app, args[:2] + ["--shape", "tiny", "--rank", "40", "--dtype", "q4_0", "--force"])
    assert r.exit_code == 1 and "multiples of 32" in r.output


def test_info_verbose_measures_active_neurons_per_layer(made):
    """`powerinfer info -v --json` runs the sample text and reports what the sparse engine counted."""
    pwri, dense = made("f16")
    from powerinfer_py import load
    from powerinfer_py.tools.info import SAMPLE_TEXT

    out = subprocess.run([sys.executable, "-m", "powerinfer_cli", "info", str(pwri), "-v", "--json", "-t", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    act = json.loads(out.stdout)["activity"]
    with load(pwri, threads=1) as llm:  # the same run through the API: the same counts
        list(llm.generate_tokens(SAMPLE_TEXT, max_tokens=16, temperature=0))
        want = llm.sparsity_stats.fractions
    assert act["mode"] == "predictor" and len(act["layers"]) == 2
    np.testing.assert_allclose(act["layers"], want, rtol=1e-9)
    assert 0 < act["active_fraction"] < 0.5
    out = subprocess.run([sys.executable, "-m", "powerinfer_cli", "info", str(dense), "-v"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "active neurons" in out.stdout and "mode off" in out.stdout
