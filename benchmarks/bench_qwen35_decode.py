"""Qwen3.5 decode speed: the delta-net layers' one-token C step (kernels.steps.delta_net_decode) against the numpy path,
in one process, alternating, on the same model and cache shape; also how far apart their logits are.

    PYTHONPATH=. python benchmarks/bench_qwen35_decode.py [-m FILE] [-t THREADS] [--reps 5] [--steps 32]

Without -m a synthetic q8_0 file of a small real shape is written to a temporary folder (24 layers, every 4th
attends, n_embd 1024, 16 key / 16 value heads of 128, FFN 3584, vocabulary 32000; about 570 MB, so it takes a
while). Each repetition prefills 64 tokens and times `steps` decode tokens in each mode (C step, its value heads
split over the threads; C step on the calling thread alone; numpy); prints the median ms per token of each (wall
time, and the process's CPU time); then runs each delta-net layer once by both paths from the same states and
prints their largest differences.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from powerinfer_py import load
from powerinfer_py.models.qwen35 import delta_dims
from powerinfer_py.synth import write_synthetic_model

SHAPE = dict(dtype="q8_0", n_layer=24, n_embd=1024, n_ff=3584, n_head=8, n_head_kv=2, n_vocab=32000, head_dim=256,
             n_rot=64, d_state=128, n_k_heads=16, n_v_heads=16, full_attention_interval=4, rope_sections=[11, 11, 10, 0])


def run(path: str, threads: int, reps: int, steps: int) -> None:
    with load(path, threads=threads, n_ctx=256) as llm:
        m = llm.model
        delta = [L for il, L in enumerate(m.layers) if m.config.delta_layers[il]]
        plans = [m._delta_plan(L) for L in delta]
        if any(p is None for p in plans):
            raise SystemExit("these kernels have no delta-net step (the C kernels are needed)")
        d, hk, hv, _ = delta_dims(m.config)
        one = [m.kernels.steps.delta_net_plan(d, hk, hv, L.conv_w, L.ssm_a, L.dt_bias, L.ssm_norm,
                                              m.config.norm_eps, split_heads=False) for L in delta]
        modes = {"C step": plans, "C step, heads on one thread": one, "numpy": [None] * len(delta)}
        ms: dict[str, list[float]] = {mode: [] for mode in modes}
        cpu: dict[str, list[float]] = {mode: [] for mode in modes}
        prompt = np.arange(10, 74, dtype=np.int32)
        for _ in range(reps):
            for mode, mode_plans in modes.items():
                for L, p in zip(delta, mode_plans):
                    L.delta_plan = p
                cache = m.new_cache(256)
                m.forward(prompt, cache)
                t0, c0 = time.perf_counter(), time.process_time()
                for i in range(steps):
                    m.forward(np.array([5 + 7 * i], np.int32), cache)
                ms[mode].append((time.perf_counter() - t0) / steps * 1e3)
                cpu[mode].append((time.process_time() - c0) / steps * 1e3)
        diffs = layer_agreement(m, delta, plans, cache)
    med = {k: statistics.median(v) for k, v in ms.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"{Path(path).name}, {threads} threads, median of {reps} x {steps} decode tokens, ms/token: "
          + ", ".join(f"{mode} {v:.2f}" for mode, v in med.items())
          + f"; numpy / C step {med['numpy'] / med['C step']:.3f}")
    print("  CPU time of the process, ms/token: " + ", ".join(f"{mode} {v:.2f}" for mode, v in med_cpu.items())
          + f"; numpy / C step {med_cpu['numpy'] / med_cpu['C step']:.3f} (with one thread the work done, robust to a "
          "busy host; with more it counts the pool's spinning too)")
    print("one token from the same states, C step vs numpy, max |diff| over the delta-net layers: output "
          f"{diffs[0]:.3g} (values up to {diffs[1]:.3g}), state {diffs[2]:.3g} (up to {diffs[3]:.3g})")


def layer_agreement(m, delta, plans, cache) -> tuple[float, float, float, float]:
    """Each delta-net layer run once by each path on the same input and from the same states (the cache after
    the last timed run): the largest |output difference|, |output|, |state difference| and |state|. (Whole-model
    logits are no measure here: on a random q8_0 file a 1e-6 change of the states can flip activation rounding.)"""
    out = [0.0] * 4
    h = np.random.default_rng(0).standard_normal((1, m.config.n_embd)).astype(np.float32)
    p0 = cache.n_past
    delta_ids = [il for il in range(len(m.layers)) if m.config.delta_layers[il]]
    for il, L, plan in zip(delta_ids, delta, plans):
        conv0, s0 = cache.conv[il].copy(), cache.delta[il].copy()
        res = []
        for p in (None, plan):
            cache.conv[il][...], cache.delta[il][...] = conv0, s0
            L.delta_plan = p
            res.append((m._delta_net(il, L, h, cache, p0), cache.delta[il].copy()))
        (a, sa), (b, sb) = res
        for i, v in enumerate((np.abs(a - b).max(), np.abs(a).max(), np.abs(sa - sb).max(), np.abs(sa).max())):
            out[i] = max(out[i], float(v))
    return tuple(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="a qwen35 GGUF file (default: a synthetic one, written first)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    if args.model:
        run(args.model, args.threads, args.reps, args.steps)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_model(Path(tmp) / "qwen35-small.gguf", "qwen35", **SHAPE)
        run(str(path), args.threads, args.reps, args.steps)


if __name__ == "__main__":
    main()
