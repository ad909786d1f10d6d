"""The sparse FFN engine (powerinfer_py/layers/ffn.py + the llama, bamboo, falcon and opt models) on tiny PWRI files
written by reference_sparse.py, against its independent numpy forward pass of docs/FORMATS.md section 2."""
from __future__ import annotations

import json

import numpy as np
import pytest
from powerinfer_cli.main import app
from reference_sparse import SparseReference, write_tiny_sparse
from typer.testing import CliRunner

import powerinfer_py
from powerinfer_py.config import ModelConfig
from powerinfer_py.errors import ModelFileError, UnsupportedError
from powerinfer_py.layers.ffn import PREDICTOR_AUTO, THRESHOLD_ENV, SparseSettings, resolve_sparse
from powerinfer_py.gguf import open_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.gguf.load import load_weights
from powerinfer_py.models import build_model, expected_tensors, read_config
from powerinfer_py.gguf.types import GGMLType, Tensor

PROMPT = [1, 332, 292, 263, 270, 270, 273, 455, 276, 270]
N_GEN = 6
TOL = 1e-4  # max |ours - reference| / std(reference logits): f32 vs f64 summation order and f16 K/V flips
# (arch, hidden_act, hidden_act_param) of every FFN variant with a predictor
VARIANTS = [("llama", None, None), ("llama", "fatrelu", 0.1), ("bamboo", None, None), ("falcon", None, None),
            ("opt", None, None)]


@pytest.fixture(scope="module")
def kernels():
    from powerinfer_py.kernels.cpu import CpuKernels
    k = CpuKernels(n_threads=2)
    yield k
    k.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(arch, **kw) -> path of a tiny PWRI (or dense=True GGUF) model, written once per parameter set."""
    folder = tmp_path_factory.mktemp("sparse")
    made = {}

    def make(arch="llama", **kw):
        key = (arch, tuple(sorted(kw.items())))
        if key not in made:
            name = "-".join([arch] + [f"{k}{v}" for k, v in key[1]])
            made[key] = write_tiny_sparse(folder / f"{name}.gguf", arch, **kw)
        return made[key]

    return make


def load(path, kernels, mode=None, threshold=None):
    """The model of a file in a sparse mode, with its predictors as stored (predictor "exact": the reference
    computes with the file's values; the quantized copies have tests of their own, test_predictor_quant.py)."""
    w = load_weights(open_gguf(path), expected_tensors)
    settings = resolve_sparse(w.config, mode, threshold, predictor="exact")
    return build_model(w.config, w.tensors, kernels, settings)


def greedy(model, prompt=PROMPT, n_gen=N_GEN, batch=None):
    """(n_gen greedy tokens, logits f32 [len(prompt) + n_gen, n_vocab]): the logits of every prompt position
    (prefilled in chunks of `batch` tokens, default all at once), then of every decode step."""
    cache = model.new_cache(64)
    batch = batch or len(prompt)
    rows = [model.forward(np.asarray(prompt[i:i + batch], np.int32), cache, all_logits=True)
            for i in range(0, len(prompt), batch)]
    logits = list(np.concatenate(rows))
    tokens = []
    for _ in range(n_gen):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(model.forward(np.asarray(tokens[-1:], np.int32), cache))
    return tokens, np.stack(logits)


def reference_greedy(path, threshold, n_gen=N_GEN, **kw):
    r = SparseReference(path, threshold, **kw)
    logits = [r.step(t) for t in PROMPT]
    tokens = []
    for _ in range(n_gen):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(r.step(tokens[-1]))
    return tokens, np.stack(logits), r


def rel_err(ours, want) -> float:
    return float(np.abs(ours - want).max() / want.std())


# ---- predictor mode against the reference -----------------------------------------------------------------

@pytest.mark.parametrize("arch,act,param", VARIANTS)
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_predictor_matches_reference(tiny, kernels, arch, act, param, dtype):
    path = tiny(arch, dtype=dtype, hidden_act=act, hidden_act_param=param)
    model = load(path, kernels)
    assert model.sparse == SparseSettings("predictor", 0.5)
    want_tokens, want, r = reference_greedy(path, 0.5)
    # prefill all at once (union over 10 tokens > 50%: the dense fallback), in pairs (the sparse union path)
    # and one token at a time (the decode path): every token gets exactly its own active set
    for batch in (None, 2, 1):
        model.sparsity.reset()
        tokens, ours = greedy(model, batch=batch)
        assert tokens == want_tokens
        assert rel_err(ours, want) < TOL, batch
        # the engine's per-layer active counts are the reference's (same predictor decisions)
        assert model.sparsity.tokens.tolist() == [r.n_tokens] * r.n_layer
        assert model.sparsity.active.tolist() == r.active.tolist()
    fractions = model.sparsity.fractions
    assert all(0.05 < f < 0.8 for f in fractions), fractions  # really sparse, really data-dependent


def test_falcon_40b_layout(tiny, kernels):
    """Falcon-40B: grouped KV heads in attn_qkv and a separate attn_norm_2 feeding the MLP."""
    path = tiny("falcon", norm_2=True, n_head_kv=2)
    model = load(path, kernels)
    want_tokens, want, _ = reference_greedy(path, 0.5)
    for batch in (None, 1):
        tokens, ours = greedy(model, batch=batch)
        assert tokens == want_tokens and rel_err(ours, want) < TOL


def test_predictor_on_ref_backend(tiny):
    """The numpy reference kernels run the same engine code (every backend runs every model)."""
    path = tiny("bamboo")
    tokens, ours = greedy(load(path, ref.RefKernels()), n_gen=3)
    want_tokens, want, _ = reference_greedy(path, 0.5, n_gen=3)
    assert tokens == want_tokens and rel_err(ours, want) < TOL


@pytest.mark.parametrize("arch", ["llama", "bamboo", "falcon", "opt"])
def test_predictor_input_is_the_formats_residual(tiny, kernels, arch):
    """Ours matches the reference fed the residual docs/FORMATS.md names (pre-ffn_norm; falcon: layer input), and
    clearly differs from references fed the FFN input or the other residual: the check can fail."""
    path = tiny(arch)
    _, ours = greedy(load(path, kernels), n_gen=2)
    _, right, _ = reference_greedy(path, 0.5, n_gen=2)
    assert rel_err(ours, right) < TOL
    for wrong in ("normed", "other"):
        _, bad, _ = reference_greedy(path, 0.5, n_gen=2, predictor_input=wrong)
        assert rel_err(ours, bad) > 0.1, wrong


# ---- all-active predictor, exact and off -----------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "bamboo", "falcon", "opt"])
def test_all_active_predictor_equals_dense(tiny, kernels, arch):
    sparse_path, dense_path = tiny(arch), tiny(arch, dense=True)
    every = load(sparse_path, kernels, "predictor", threshold=-np.inf)
    tokens, ours = greedy(every, batch=3)
    assert every.sparsity.fractions == [1.0, 1.0]
    # the same file in dense mode: the same kernels on the same rows, so the same bits
    off_tokens, off = greedy(load(sparse_path, kernels, "off"), batch=3)
    assert tokens == off_tokens and np.array_equal(ours, off)
    # the dense GGUF twin (ffn_down instead of ffn_down_t: matmul instead of AXPY, another summation order)
    dense_tokens, dense = greedy(load(dense_path, kernels), batch=3)
    assert tokens == dense_tokens and rel_err(ours, dense) < TOL
    _, want, _ = reference_greedy(dense_path, None)
    assert rel_err(dense, want) < TOL


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("arch,act", [("llama", None), ("llama", "fatrelu"), ("bamboo", None), ("falcon", None),
                                      ("opt", None)])
@pytest.mark.parametrize("dense", [False, True])
def test_exact_equals_off_bit_for_bit(tiny, kernels, arch, act, dtype, dense):
    path = tiny(arch, dtype=dtype, dense=dense, hidden_act=act, hidden_act_param=0.05 if act == "fatrelu" else None)
    exact = load(path, kernels, "exact")
    off = load(path, kernels, "off")
    for batch in (None, 3, 1):
        exact_tokens, ours = greedy(exact, batch=batch)
        off_tokens, want = greedy(off, batch=batch)
        assert exact_tokens == off_tokens and np.array_equal(ours, want), batch
    # exact really skipped neurons, and counted the same activations as the dense pass
    assert all(f < 0.7 for f in exact.sparsity.fractions)
    assert exact.sparsity.active.tolist() == off.sparsity.active.tolist()


def test_exact_on_dense_relu_llama_matches_reference(tiny, kernels):
    path = tiny("llama", dense=True, hidden_act="relu")
    tokens, ours = greedy(load(path, kernels, "exact"))
    want_tokens, want, _ = reference_greedy(path, None)
    assert tokens == want_tokens and rel_err(ours, want) < TOL


# ---- modes, threshold, statistics --------------------------------------------------------------------------

def _config(path) -> ModelConfig:
    return read_config(open_gguf(path))


def test_mode_defaults_and_refusals(tiny, synthetic_model):
    sparse_cfg = _config(tiny("llama"))
    assert resolve_sparse(sparse_cfg) == SparseSettings("predictor", 0.5, predictor=PREDICTOR_AUTO)
    dense_relu = _config(tiny("llama", dense=True, hidden_act="relu"))
    assert resolve_sparse(dense_relu).mode == "off"
    assert resolve_sparse(dense_relu, "exact").mode == "exact"
    with pytest.raises(UnsupportedError, match="PWRI"):
        resolve_sparse(dense_relu, "predictor")
    swiglu = _config(synthetic_model("llama"))  # an ordinary GGUF llama: SwiGLU
    with pytest.raises(UnsupportedError, match="ReLU"):
        resolve_sparse(swiglu, "exact")
    with pytest.raises(UnsupportedError, match="unknown sparse mode"):
        resolve_sparse(sparse_cfg, "sometimes")


def test_threshold_precedence(tiny):
    cfg = _config(tiny("llama"))
    assert resolve_sparse(cfg, environ={}).threshold == 0.5  # the file's
    assert resolve_sparse(cfg, environ={THRESHOLD_ENV: "1.25"}).threshold == 1.25  # env over file
    assert resolve_sparse(cfg, threshold=-2.0, environ={THRESHOLD_ENV: "1.25"}).threshold == -2.0  # arg first
    with pytest.raises(powerinfer_py.PowerInferError, match=THRESHOLD_ENV):
        resolve_sparse(cfg, environ={THRESHOLD_ENV: "high"})


def _active_counts(llm) -> list[int]:
    list(llm.generate_tokens(PROMPT, max_tokens=4, temperature=0))
    return llm.sparsity_stats.active.tolist()


def test_threshold_override_changes_the_active_set(tiny, monkeypatch):
    path = tiny("llama")
    monkeypatch.delenv(THRESHOLD_ENV, raising=False)
    with powerinfer_py.load(path, threads=1) as llm:
        base = _active_counts(llm)
        assert llm.sparse == SparseSettings("predictor", 0.5, predictor=PREDICTOR_AUTO)
        assert base == _active_counts(llm)  # stats are per generation, not cumulative
    with powerinfer_py.load(path, threads=1, sparse_threshold=1.0) as llm:
        higher = _active_counts(llm)
    monkeypatch.setenv(THRESHOLD_ENV, "1.0")
    with powerinfer_py.load(path, threads=1) as llm:
        assert llm.sparse.threshold == 1.0
        from_env = _active_counts(llm)
    with powerinfer_py.load(path, threads=1, sparse_threshold=0.5) as llm:  # the argument beats the env
        assert _active_counts(llm) == base
    assert from_env == higher and all(h < b for h, b in zip(higher, base))


def test_llm_sparsity_stats_and_modes(tiny):
    path = tiny("opt")
    with powerinfer_py.load(path, threads=1, sparse="exact") as llm:
        list(llm.generate_tokens(PROMPT, max_tokens=3, temperature=0))
        stats = llm.sparsity_stats
        assert stats.mode == "exact" and stats.tokens.tolist() == [len(PROMPT) + 2] * 2
        assert all(0 < f < 1 for f in stats.fractions)
    with powerinfer_py.load(tiny("llama", dense=True, hidden_act="silu")) as llm:  # no ReLU statistics
        assert llm.sparsity_stats is None and llm.sparse.mode == "off"


def test_opt_context_limited_by_learned_positions(tiny, kernels):
    model = load(tiny("opt"), kernels)
    with pytest.raises(powerinfer_py.ContextFullError, match="learned positions"):
        model.new_cache(65)


# ---- malformed files ----------------------------------------------------------------------------------------

def _replace(name: str, shape: tuple[int, ...]):
    """Breakage: tensor `name` replaced by a zero F32 tensor of `shape`."""
    def edit(tensors):
        return [Tensor(name, GGMLType.F32, shape, np.zeros(shape, np.float32))
                if t.name == name else t for t in tensors]
    return edit


def _drop(*names: str):
    return lambda tensors: [t for t in tensors if t.name not in names]


MALFORMED = {
    "fc1 n_embd": (_replace("blk.1.fc1.weight", (64, 48)), r"'blk\.1\.fc1\.weight'.*shape"),
    "fc2 n_ff": (_replace("blk.0.fc2.weight", (96, 32)), r"'blk\.0\.fc2\.weight'.*shape"),
    "fc2 rank": (_replace("blk.1.fc2.weight", (128, 32)), r"'blk\.1\.fc2\.weight'.*shape"),
    "rank 0": (_replace("blk.0.fc1.weight", (0, 64)), r"'blk\.0\.fc1\.weight'.*(zero|rank)"),
    "no ffn_down_t": (_drop("blk.1.ffn_down_t.weight"), r"'blk\.1\.ffn_down_t\.weight'"),
    "layer without fc1": (_drop("blk.1.fc1.weight"), r"'blk\.1\.fc1\.weight'"),
    "layer without predictor": (_drop("blk.0.fc1.weight", "blk.0.fc2.weight"), r"'blk\.0\.fc1\.weight'"),
    "layer without fc2": (_drop("blk.1.fc2.weight"), r"'blk\.1\.fc2\.weight'"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("arch", ["llama", "falcon"])
def test_malformed_pwri_files_are_named(tmp_path, arch, case):
    breakage, pattern = MALFORMED[case]
    path = write_tiny_sparse(tmp_path / "bad.gguf", arch, breakage=breakage)
    with pytest.raises(ModelFileError, match=pattern):
        load_weights(open_gguf(path), expected_tensors)


def test_opt_pwri_without_ffn_down_t_bias(tmp_path):
    path = write_tiny_sparse(tmp_path / "bad.gguf", "opt", breakage=_drop("blk.0.ffn_down_t.bias"))
    with pytest.raises(ModelFileError, match=r"'blk\.0\.ffn_down_t\.bias'"):
        load_weights(open_gguf(path), expected_tensors)


# ---- command line -------------------------------------------------------------------------------------------

def test_cli_run_sparse_options(tiny):
    runner = CliRunner()
    path = str(tiny("llama"))
    res = runner.invoke(app, ["run", "-m", path, "Hello world", "-n", "4", "--temp", "0", "-t", "1", "-v",
                              "--sparse-threshold", "0.25"])
    assert res.exit_code == 0, res.stderr
    assert "sparse mode: predictor, threshold 0.25" in res.stderr and "active % per layer: 0:" in res.stderr
    assert f"predictor dtype {PREDICTOR_AUTO}" in res.stderr
    res = runner.invoke(app, ["run", "-m", path, "Hello world", "-n", "4", "--temp", "0", "-t", "1", "--json",
                              "--sparse", "exact"])
    assert res.exit_code == 0, res.stderr
    sparse = json.loads(res.stdout)["sparse"]
    assert sparse["mode"] == "exact" and len(sparse["layers"]) == 2 and 0 < sparse["active_fraction"] < 1
    res = runner.invoke(app, ["run", "-m", str(tiny("llama", dense=True, hidden_act="silu")), "Hi", "-n", "2",
                              "--sparse", "exact"])
    assert res.exit_code == 1 and "ReLU" in res.stderr
