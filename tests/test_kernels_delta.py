"""The one-token delta-net step (csrc/step_delta_net.c, kernels.steps.delta_net_decode) against a numpy reference built from
qwen35.py's own steps (l2norm, sigmoid, softplus, Qwen35Model._recur) over several tokens in a row, each token
continuing the states the kernel left in place; 1 and 2 threads bit-identical; and its use in Qwen35Model.

Shapes: odd head counts, value heads 1x and 3x the key heads, widths whose rows end in a vector tail (20, 48) or
not (64), a 4-tap conv.
"""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py.kernels.cpu import CpuKernels
from powerinfer_py.kernels.delta_step import delta_net_plan
from powerinfer_py.models.qwen35 import Qwen35Model, l2norm, sigmoid, softplus

EPS = 1e-6
K = 4
N_TOKENS = 5
SHAPES = [(3, 9, 20), (3, 9, 48), (5, 5, 64), (1, 3, 16)]  # (Hk, Hv, d)


def layer(hk: int, hv: int, d: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    conv_dim = (2 * hk + hv) * d
    f = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    return dict(conv_w=f(conv_dim, K, scale=0.5), ssm_a=-np.exp(f(hv, scale=0.5)), dt_bias=f(hv),
                ssm_norm=1 + f(d, scale=0.1),
                tokens=[dict(qkv=f(conv_dim), z=f(hv * d), beta_raw=f(hv), alpha_raw=f(hv)) for _ in range(N_TOKENS)],
                conv_state=f(K - 1, conv_dim), state=f(hv, d, d, scale=0.1))


def reference(hk: int, hv: int, d: int, p: dict) -> list[np.ndarray]:
    """The numpy path of qwen35.py for one token at a time, from p's states (copies); the outputs per token."""
    conv, S, outs = p["conv_state"].copy(), p["state"].copy(), []
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    for t in p["tokens"]:
        s = np.concatenate([conv, t["qkv"][None]])
        y = s[0] * p["conv_w"][:, 0]
        for j in range(1, K):
            y = y + s[j] * p["conv_w"][:, j]
        conv = s[1:]
        y = silu(y)
        q = l2norm(y[:hk * d].reshape(1, hk, d), EPS) * np.float32(1 / np.sqrt(d))
        k = l2norm(y[hk * d:2 * hk * d].reshape(1, hk, d), EPS)
        q, k = np.tile(q, (1, hv // hk, 1)), np.tile(k, (1, hv // hk, 1))  # value head h reads key head h mod Hk
        beta = sigmoid(t["beta_raw"][None])
        g = p["ssm_a"] * softplus(t["alpha_raw"][None] + p["dt_bias"])
        o = Qwen35Model._recur(S, q, k, y[2 * hk * d:].reshape(1, hv, d), beta, g)[0]
        normed = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + EPS) * p["ssm_norm"]
        outs.append((normed * silu(t["z"].reshape(hv, d))).reshape(-1))
    return outs


def run_kernel(kern: CpuKernels, hk: int, hv: int, d: int, p: dict, split: bool = False):
    plan = delta_net_plan(d, hk, hv, p["conv_w"], p["ssm_a"], p["dt_bias"], p["ssm_norm"], EPS, split_heads=split)
    conv, S = p["conv_state"].copy(), p["state"].copy()
    outs = [kern.steps.delta_net_decode(plan, t["qkv"], t["z"], t["beta_raw"], t["alpha_raw"], conv, S)
            for t in p["tokens"]]
    return outs, conv, S


@pytest.fixture(scope="module")
def k12():
    k1, k2 = CpuKernels(1), CpuKernels(2)
    yield k1, k2
    k1.close()
    k2.close()


@pytest.mark.parametrize("hk,hv,d", SHAPES)
def test_matches_numpy_over_tokens(k12, hk, hv, d):
    """Five tokens in a row, each continuing the conv state and S the kernel updated in place: every output within
    float rounding of the numpy path (measured: max abs diff <= 1.4e-6 on outputs up to 8, <= 2.4e-7 on states up
    to 1.3), the final states too; 1 and 2 threads, the heads split over the 2 threads or not, and a second run,
    bit-identical."""
    p = layer(hk, hv, d, seed=hk * 100 + d)
    ref = reference(hk, hv, d, p)
    runs = [run_kernel(k, hk, hv, d, p, split) for k, split in
            ((k12[0], False), (k12[1], False), (k12[1], True), (k12[1], True), (k12[0], True))]
    outs, conv, S = runs[0]
    for t, (a, b) in enumerate(zip(outs, ref)):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6 * np.abs(b).max(), err_msg=f"token {t}")
    np.testing.assert_array_equal(conv, np.concatenate([p["conv_state"], [t["qkv"] for t in p["tokens"]]])[-(K - 1):])
    ref_S = _reference_state(hk, hv, d, p)
    np.testing.assert_allclose(S, ref_S, rtol=0, atol=2e-6 * np.abs(ref_S).max())
    assert not np.array_equal(S, p["state"])  # the kernel wrote the state it was handed
    for other in runs[1:]:
        for a, b in zip(outs, other[0]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(S, other[2])


def _reference_state(hk: int, hv: int, d: int, p: dict) -> np.ndarray:
    """S after reference()'s tokens: the reference run again with a hook on the state (_recur updates it in place)."""
    held = {}
    orig = Qwen35Model._recur

    def keep(S, *a):
        held["S"] = S
        return orig(S, *a)

    Qwen35Model._recur = staticmethod(keep)
    try:
        reference(hk, hv, d, p)
    finally:
        Qwen35Model._recur = staticmethod(orig)
    return held["S"]


def test_bad_arguments_are_refused(k12):
    hk, hv, d = 1, 3, 16
    p = layer(hk, hv, d)
    with pytest.raises(ValueError, match="cannot share"):
        delta_net_plan(d, 2, 3, p["conv_w"], p["ssm_a"], p["dt_bias"], p["ssm_norm"], EPS)
    with pytest.raises(ValueError, match="conv_w must be"):
        delta_net_plan(d, hk, hv, p["conv_w"][:, :1], p["ssm_a"], p["dt_bias"], p["ssm_norm"], EPS)
    plan = delta_net_plan(d, hk, hv, p["conv_w"], p["ssm_a"], p["dt_bias"], p["ssm_norm"], EPS)
    t = p["tokens"][0]
    with pytest.raises(ValueError, match="state must be a writable"):
        k12[0].steps.delta_net_decode(plan, t["qkv"], t["z"], t["beta_raw"], t["alpha_raw"], p["conv_state"],
                                      p["state"][:, :, :8].copy())
    frozen = p["conv_state"].copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="conv_state must be a writable"):
        k12[0].steps.delta_net_decode(plan, t["qkv"], t["z"], t["beta_raw"], t["alpha_raw"], frozen, p["state"].copy())
    with pytest.raises(ValueError, match="qkv must be"):
        k12[0].steps.delta_net_decode(plan, t["qkv"][:-1], t["z"], t["beta_raw"], t["alpha_raw"],
                                      p["conv_state"].copy(), p["state"].copy())


class OtherRecurrence(Qwen35Model):
    """A subclass that changes a numpy step the C step implements."""

    @staticmethod
    def _recur(S, q, k, v, beta, g):
        return Qwen35Model._recur(S, q, k, v, beta, g)


def test_model_uses_the_step_only_where_it_applies(synthetic_model, cpu_kernels):
    """Qwen35Model on the C kernels plans the step for each delta-net layer; a subclass that overrides one of the
    numpy steps keeps the numpy path; the reference kernels have no step."""
    from model_checks import load_model
    from powerinfer_py.kernels.ref import RefKernels

    path = synthetic_model("qwen35", "f32")
    m = load_model(path, cpu_kernels)
    delta = [L for il, L in enumerate(m.layers) if m.config.delta_layers[il]]
    assert delta and all(m._delta_plan(L) is not None for L in delta)
    sub = load_model(path, cpu_kernels, OtherRecurrence)
    assert all(sub._delta_plan(L) is None for il, L in enumerate(sub.layers) if sub.config.delta_layers[il])
    ref = load_model(path, RefKernels())
    assert all(ref._delta_plan(L) is None for il, L in enumerate(ref.layers) if ref.config.delta_layers[il])
