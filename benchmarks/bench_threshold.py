"""Threshold sparsity on Gemma 3 270M (the demo model): what it costs in perplexity and what it buys in decode speed.

1. Calibrates the model on benchmarks/data/calibration.txt for --sparsity (default 0.4) into a temporary copy
   as `calibrate` does by default (two stages, half as many up rows skipped; neuron scales, threshold.py), and
   for comparison two one-stage copies: with the neuron scales (score |act_i| * c_i) and without (plain |act_i|).
2. Perplexity on benchmarks/data/evaluation.txt (a different text, never seen by the calibration), dense and
   in threshold mode at the target sparsity (plus --sweep sparsities from the same calibration's tables),
   with the skipped fraction measured on that text; the one-stage copies at the target. The issue's target:
   increase <= 5% at 40%.
3. Decode tok/s, in this one process, alternating rep by rep: --sparse off, and threshold mode with each
   down-projection choice (threshold.py: auto, dense ffn_down matmul, transposed Q8_0 copy + AXPY). Medians.

    PYTHONPATH=. python benchmarks/bench_threshold.py                 # ~2-4 minutes on 2 cores
    PYTHONPATH=. python benchmarks/bench_threshold.py --sweep 0.1 0.2 0.3 --reps 5 -n 64
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from powerinfer_py import load
from powerinfer_py.tools.calibrate import calibrate
from powerinfer_py.demo import demo_model_path
from powerinfer_py.layers.ffn import SparseSettings
from powerinfer_py.models import build_model
from powerinfer_py.tools.perplexity import perplexity

DATA = Path(__file__).parent / "data"
PROMPT = "The history of the printing press begins in the fifteenth century, when"


def measure_ppl(path: Path, text: str, ctx: int, threads: int, **mode) -> tuple[float, float | None]:
    with load(path, threads=threads, n_ctx=ctx, **mode) as llm:
        res = perplexity(llm, text, ctx=ctx)
        st = llm.sparsity_stats
        return res.perplexity, (st.skipped_fraction if st is not None and st.tokens.any() else None)


def decode_tok_s(llm, model, n_gen: int) -> float:
    ids = llm.tokenize(PROMPT)
    cache = model.new_cache(len(ids) + n_gen + 1)
    logits = model.forward(np.asarray(ids, dtype=np.int32), cache)
    step = np.empty(1, dtype=np.int32)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        step[0] = int(np.argmax(logits))
        logits = model.forward(step, cache)
    return n_gen / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, default=None, help="GGUF model (default: the demo model)")
    ap.add_argument("--sparsity", type=float, default=0.4)
    ap.add_argument("--sweep", type=float, nargs="*", default=[], help="more sparsities for the perplexity table")
    ap.add_argument("-c", "--ctx", type=int, default=512, help="perplexity window")
    ap.add_argument("-n", "--n-gen", type=int, default=48, help="decoded tokens per speed run")
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--speed-only", action="store_true", help="skip the perplexity table")
    ap.add_argument("--calibrated", type=Path, default=None,
                    help="an already calibrated copy (from calibration.txt) instead of calibrating again")
    a = ap.parse_args()
    model = a.model or demo_model_path()
    cal_text = (DATA / "calibration.txt").read_text(encoding="utf-8")
    eval_text = (DATA / "evaluation.txt").read_text(encoding="utf-8")

    with tempfile.TemporaryDirectory() as tmp:
        path = a.calibrated or Path(tmp) / "calibrated.gguf"
        others = {}
        if a.calibrated is None:
            t0 = time.perf_counter()
            res = calibrate(model, path, a.sparsity, text=cal_text, n_tokens=100_000, ctx=256, threads=a.threads)
            print(f"calibrated {model.name} on {res.n_tokens} tokens of calibration.txt for sparsity "
                  f"{a.sparsity:g} in {time.perf_counter() - t0:.1f} s"
                  + (f" (two stages, up rows skipped {res.up_sparsity:g})" if res.up_sparsity is not None else ""))
            if not a.speed_only:
                for name, scales in (("one stage", True), ("one stage, plain |act|", False)):
                    others[name] = Path(tmp) / f"{'scaled' if scales else 'plain'}.gguf"
                    calibrate(model, others[name], a.sparsity, text=cal_text, n_tokens=100_000, ctx=256,
                              threads=a.threads, scales=scales, one_stage=True)

        if not a.speed_only:
            ppl_table(path, eval_text, a, others)
        decode_table(path, a)


def ppl_table(path: Path, eval_text: str, a, others: dict[str, Path]) -> None:
    dense_ppl, _ = measure_ppl(path, eval_text, a.ctx, a.threads, sparse="off")
    print(f"\nperplexity on evaluation.txt (not used for calibration), windows of {a.ctx} tokens")
    print(f"{'mode':<30}{'skipped':>9}{'perplexity':>12}{'increase':>10}   (threshold: the calibrated file's rule)")
    print(f"{'off (dense)':<30}{'0.0%':>9}{dense_ppl:12.3f}{'':>10}")
    for s in sorted({a.sparsity, *a.sweep}):
        ppl, skipped = measure_ppl(path, eval_text, a.ctx, a.threads, sparse="threshold", sparsity=s)
        mark = "  <- target" if s == a.sparsity else ""
        print(f"{'threshold ' + format(s, 'g'):<30}{100 * skipped:8.1f}%{ppl:12.3f}"
              f"{100 * (ppl / dense_ppl - 1):9.1f}%{mark}")
    for name, other in others.items():
        ppl, skipped = measure_ppl(other, eval_text, a.ctx, a.threads, sparse="threshold", sparsity=a.sparsity)
        print(f"{name + ' ' + format(a.sparsity, 'g'):<30}{100 * skipped:8.1f}%{ppl:12.3f}"
              f"{100 * (ppl / dense_ppl - 1):9.1f}%")


def decode_table(path: Path, a) -> None:
    with load(path, threads=a.threads) as llm:  # one file map and kernel pool, four models over it
        from powerinfer_py.gguf.load import load_weights

        weights = load_weights(llm.file)
        cuts = llm.config.ffn_thresholds
        variants = {"off": SparseSettings("off", 0.0)}
        for down in ("auto", "dense", "transposed"):
            variants[f"threshold/{down}"] = SparseSettings("threshold", 0.0, a.sparsity, cuts, down,
                                                           llm.config.ffn_neuron_scales,
                                                           llm.config.ffn_up_thresholds)  # two-stage files
        models = {k: build_model(llm.config, weights.tensors, llm.kernels, v) for k, v in variants.items()}
        speeds: dict[str, list[float]] = {k: [] for k in models}
        for m in models.values():
            if m.sparsity is not None:
                m.sparsity.reset()
        for rep in range(a.reps):
            order = list(models) if rep % 2 == 0 else list(reversed(models))
            for k in order:
                speeds[k].append(decode_tok_s(llm, models[k], a.n_gen))
        skipped = {k: m.sparsity.skipped_fraction if m.sparsity is not None else 0.0 for k, m in models.items()}
    print(f"\ndecode tok/s, {a.n_gen} tokens, {a.threads} threads, median of {a.reps} (alternating, one process)")
    base = statistics.median(speeds["off"])
    for k, v in speeds.items():
        med = statistics.median(v)
        print(f"{k:<24}{med:8.2f} tok/s {med / base:6.3f}x  skipped {100 * skipped[k]:4.1f}%   "
              f"runs: {' '.join(f'{x:.2f}' for x in v)}")


if __name__ == "__main__":
    main()
