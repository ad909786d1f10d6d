"""Placement (powerinfer_py.hybrid.placement): the exact solver against brute force, the VRAM accounting against the
tensors' own byte counts, activation statistics readers, and the .gpuidx sidecar round trip."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from powerinfer_py.hybrid import placement as P
from powerinfer_py.hybrid.activations import load_activations, profile_activations
from powerinfer_py.convert.torch_pt import save_pt
from powerinfer_py.errors import ModelFileError, PowerInferError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.hybrid.gpuidx import read_gpuidx, write_gpuidx
from powerinfer_py.synth.sparse import SHAPES, write_sparse_model

TINY = SHAPES["tiny"]


def _brute(values, costs, cap):
    best = 0.0
    for ms in itertools.product(*[range(len(v) + 1) for v in values]):
        if sum(m * c for m, c in zip(ms, costs)) <= cap:
            best = max(best, sum(float(np.sum(v[:m])) for v, m in zip(values, ms)))
    return best


def _instance(rng, n_layer, costs_from):
    values = [np.sort(rng.choice([0.0, 1.0, 2.0, 3.0, 5.0, 8.0], size=rng.integers(1, 5)))[::-1]
              for _ in range(n_layer)]
    costs = [int(rng.choice(costs_from)) for _ in range(n_layer)]
    return values, costs


@pytest.mark.parametrize("costs_from", [[7], [3, 5], [2, 3, 7]])
def test_solver_is_optimal_and_feasible_vs_brute_force(costs_from):
    if len(costs_from) > 2:
        pytest.importorskip("scipy.optimize", reason="three cost classes use scipy's milp")
    rng = np.random.default_rng(len(costs_from))
    for _ in range(60):
        values, costs = _instance(rng, int(rng.integers(1, 5)), costs_from)
        cap = int(rng.integers(0, sum(len(v) * c for v, c in zip(values, costs)) + 2))
        m = P.solve_groups(values, costs, cap)
        assert all(0 <= k <= len(v) for k, v in zip(m, values))
        assert sum(k * c for k, c in zip(m, costs)) <= cap
        got = sum(float(np.sum(v[:k])) for v, k in zip(values, m))
        assert got == pytest.approx(_brute(values, costs, cap))


def test_greedy_tie_breaking_takes_prefixes():
    # equal values in two layers: any split is optimal, but each layer must get a prefix of its groups
    m = P.solve_groups([np.array([4.0, 4.0, 4.0]), np.array([4.0, 4.0])], [1, 1], 3)
    assert sum(m) == 3 and m[0] <= 3 and m[1] <= 2


def test_group_values_sort_counts_and_pad():
    counts = np.arange(70, dtype=float)  # 70 neurons: groups of 32, 32, 6 (+ 26 padding zeros)
    order, values = P.group_values(counts)
    assert list(order[:3]) == [69, 68, 67]
    assert values.tolist() == [float(sum(range(38, 70))), float(sum(range(6, 38))), float(sum(range(6)))]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("placement")
    path, _ = write_sparse_model(folder / "m.pwri", n_layer=3, dtype="q4_0", n_sample=256, **TINY)
    return path


def _fp(path, n_ctx=64):
    from powerinfer_py.models import read_config
    f = open_gguf(path)
    return read_config(f), f.tensors, P.footprint(read_config(f), f.tensors, n_ctx)


def test_footprint_counts_every_byte(model):
    c, tensors, fp = _fp(model)
    ffn = sum(t.nbytes for n, t in tensors.items() if n.endswith(P.NEURON_TENSORS))
    assert sum(fp.neuron_bytes) * c.n_ff == ffn
    per_neuron = 3 * (c.n_embd // 32) * 18  # Q4_0: 18 bytes per 32 weights, three rows per neuron
    assert fp.neuron_bytes == [per_neuron] * c.n_layer
    rest = sum(P.aligned(t.nbytes) for n, t in tensors.items()
               if not n.endswith(P.NEURON_TENSORS) and n != "token_embd.weight")
    kv = c.n_layer * 2 * 2 * c.n_head_kv * 64 * c.head_dim
    maps = c.n_layer * 4 * c.n_ff
    scratch = sum(P.aligned(b) for b in P.scratch_buffers(c, 64).values())
    assert fp.fixed_bytes == rest + kv + maps + scratch


def test_budget_is_never_exceeded_and_more_budget_never_hurts(model):
    c, _, fp = _fp(model)
    rng = np.random.default_rng(0)
    counts = [rng.pareto(1.5, c.n_ff) for _ in range(c.n_layer)]
    prev = -1.0
    for extra in np.linspace(0, 1.1 * sum(fp.neuron_bytes) * c.n_ff, 12).astype(int):
        budget = fp.fixed_bytes + int(extra)
        plan = P.plan_placement(fp, counts, budget)
        assert plan.device_bytes <= budget
        assert all(k % P.GROUP == 0 or k == c.n_ff for k in plan.n_hot)
        for il, hot in enumerate(plan.hot):  # the hot set is the layer's top-k by count
            cold = np.setdiff1d(np.arange(c.n_ff), hot)
            if len(hot) and len(cold):
                assert counts[il][hot].min() >= counts[il][cold].max()
        assert plan.gpu_share >= prev - 1e-12
        prev = plan.gpu_share
    assert prev == pytest.approx(1.0)
    with pytest.raises(PowerInferError, match="below"):
        P.plan_placement(fp, counts, fp.fixed_bytes - 1)


def test_gpuidx_round_trip_and_numeric_layer_order(tmp_path, model):
    c, _, fp = _fp(model)
    counts = [np.arange(c.n_ff, dtype=float) * (il + 1) for il in range(c.n_layer)]
    counts[1][:] = 0  # a layer with no activations gets no device neuron: an empty bucket
    plan = P.plan_placement(fp, counts, fp.fixed_bytes + 40 * P.GROUP * fp.neuron_bytes[0] // 3)
    assert plan.n_hot[1] == 0 and plan.n_hot[0] > 0
    out = write_gpuidx(tmp_path / "m.gpuidx", plan)
    f = open_gguf(out, allow_empty=True)
    assert f.magic == "PWRI" and f.metadata["general.architecture"] == "generic.gpu_index"
    assert f.metadata["split.vram_capacity"] == plan.budget
    assert list(f.tensors) == [f"blk.{il}.{k}" for il in range(c.n_layer) for k in ("gpu_idx", "gpu_bucket")]
    f.close()
    back = read_gpuidx(out, n_layer=c.n_layer, n_ff=c.n_ff)
    assert back.budget == plan.budget
    for a, b in zip(plan.hot, back.hot):
        assert np.array_equal(a, b)
    with pytest.raises(ModelFileError, match="layers"):
        read_gpuidx(out, n_layer=c.n_layer + 1)
    with pytest.raises(ModelFileError, match="not a placement sidecar"):
        read_gpuidx(model)


def test_activation_readers_agree(tmp_path):
    rng = np.random.default_rng(1)
    counts = [rng.integers(0, 100, 64).astype(np.float32) for _ in range(12)]
    folder = tmp_path / "activation"
    folder.mkdir()
    for il, cnt in enumerate(counts):  # activation_10 must become layer 10, not layer 2
        save_pt(folder / f"activation_{il}.pt", cnt)
    np.savez(tmp_path / "a.npz", **{f"activation_{il}": c for il, c in enumerate(counts)})
    (tmp_path / "a.json").write_text(json.dumps({"layers": [c.tolist() for c in counts]}))
    for src in (folder, tmp_path / "a.npz", tmp_path / "a.json"):
        got = load_activations(src, 12, 64)
        assert all(np.array_equal(g, c) for g, c in zip(got, counts)), src
    with pytest.raises(PowerInferError, match="64 counts, the model.s FFN has 65"):
        load_activations(tmp_path / "a.json", 12, 65)
    (folder / "activation_3.pt").unlink()
    with pytest.raises(PowerInferError, match=r"layer\(s\) \[3\]"):
        load_activations(folder, 12, 64)


def test_profile_counts_match_dense_relu(model):
    import powerinfer_py
    llm = powerinfer_py.load(model, threads=1, n_ctx=64)
    try:
        toks = list(range(1, 40))
        counts = profile_activations(llm.model, llm.cache, toks, batch=16)
        assert len(counts) == llm.config.n_layer and counts[0].max() <= len(toks)
        assert 0 < counts[0].sum() < len(toks) * llm.config.n_ff  # sparse: some but not all fire
    finally:
        llm.close()
