"""Predictor training speed and quality on a synthetic ReLU LLaMA layer (powerinfer_py.synth.sparse).

Writes a one-layer synthetic sparse model of the chosen shape (default LLaMA-7B's: n_embd 4096, n_ff 11008)
with its dense twin, runs the dense twin over random tokens to collect (predictor input, active) pairs, trains
the layer's predictor, and prints the training time and the recall / precision / predicted sparsity on
tokens the training never saw, next to those of the generator's own (designed) predictor at threshold 0 and at
the file's calibrated threshold.

    python benchmarks/bench_predictor_train.py                          # 7B layer shape, rank 1024
    python benchmarks/bench_predictor_train.py --shape tiny --rank auto --tokens 4096
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from powerinfer_py import load
from powerinfer_py.synth import sparse as S
from powerinfer_py.tools.predictor_fit import FitConfig, predictor_logits, score
from powerinfer_py.tools.predictor_train import LayerData, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="7b", choices=sorted(S.SHAPES))
    ap.add_argument("--rank", default="1024", help='predictor rank, or "auto"')
    ap.add_argument("--tokens", type=int, default=3072, help="training tokens (plus 25%% fresh ones for scoring)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--balance", type=float, default=1.5)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--n-embd", type=int, default=None, help="override the shape's n_embd")
    ap.add_argument("--n-ff", type=int, default=None, help="override the shape's n_ff")
    ap.add_argument("--n-vocab", type=int, default=None, help="override the shape's vocabulary (random tokens "
                    "repeat in a small one, which a predictor can memorise)")
    ap.add_argument("--design-rank", type=int, default=None,
                    help="override the rank of the generator's own predictor (its data subspace has rank/2 - 1 "
                         "dimensions)")
    ap.add_argument("--recall", type=float, default=0.95)
    ap.add_argument("--backend", default="auto", choices=["auto", "numpy", "torch"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--active", type=float, default=0.10, help="mean firing probability of the synthetic layer")
    args = ap.parse_args()

    shape = dict(S.SHAPES[args.shape])
    shape.update({k: v for k, v in (("n_embd", args.n_embd), ("n_ff", args.n_ff),
                                                  ("rank", args.design_rank), ("n_vocab", args.n_vocab)) if v})
    n_fresh = max(64, args.tokens // 4)
    with tempfile.TemporaryDirectory(prefix="pi-bench-pred-") as tmp:
        t0 = time.perf_counter()
        pwri, dense = S.write_sparse_model(Path(tmp) / "m.pwri", n_layer=1, dtype="f16", mean_active=args.active,
                                           dense_path=Path(tmp) / "m.gguf", recall=args.recall, **shape)
        t_write = time.perf_counter() - t0
        ids = np.random.default_rng(1).integers(3, shape["n_vocab"], size=args.tokens + n_fresh)
        data = LayerData(shape["n_ff"])
        t0 = time.perf_counter()
        with load(dense, threads=args.threads, sparse="off") as llm:
            from powerinfer_py.tools.observe import observe
            observe(llm, ids, lambda il, p, act: data.add(p, act), ctx=256, add_bos=False)
        t_collect = time.perf_counter() - t0
        p, y = data.arrays()
        with load(pwri, threads=args.threads) as llm:
            w = llm.model.ffns[0].w
            from powerinfer_py.kernels.ref import dequantize
            fc1, fc2, thr = dequantize(w.fc1), dequantize(w.fc2), llm.sparse.threshold
    train_data = LayerData(shape["n_ff"])
    train_data.add(p[:args.tokens], y[:args.tokens].astype(np.float32))
    rank = args.rank if args.rank == "auto" else int(args.rank)
    cfg = FitConfig(epochs=args.epochs, batch=args.batch, balance=args.balance, recall_target=args.recall,
                    backend=args.backend, threads=args.threads, lr=args.lr)
    t0 = time.perf_counter()
    res = train([train_data], rank, cfg)[0]
    t_train = time.perf_counter() - t0
    fresh_p, fresh_y = p[args.tokens:], y[args.tokens:]
    rows = [("trained (held-out tokens)", res.predictor.rank, res.metrics),
            ("trained (fresh tokens)", res.predictor.rank, score(predictor_logits(res.predictor.fc1,
                                                                                  res.predictor.fc2, fresh_p), fresh_y)),
            ("designed, threshold 0", fc1.shape[0], score(predictor_logits(fc1, fc2, fresh_p), fresh_y, 0.0)),
            (f"designed, threshold {thr:.3f}", fc1.shape[0], score(predictor_logits(fc1, fc2, fresh_p), fresh_y, thr))]
    print(f"shape {args.shape} (n_embd {shape['n_embd']}, n_ff {shape['n_ff']}), {args.tokens} training + "
          f"{len(fresh_p)} fresh tokens, backend {res.predictor.backend}, {args.epochs} epochs, batch {args.batch}, "
          f"balance {args.balance}, lr {args.lr:g}")
    print(f"write model {t_write:.1f} s, collect {t_collect:.1f} s, train {t_train:.1f} s "
          f"(chosen epoch {res.predictor.epoch}; ranks tried {[r for r, _ in res.tried]})")
    print(f"{'predictor':34s} {'rank':>5s} {'recall':>7s} {'precision':>9s} {'pred.sparsity':>13s} {'true sparsity':>13s}")
    for name, r, m in rows:
        print(f"{name:34s} {r:5d} {m.recall:7.3f} {m.precision:9.3f} {m.predicted_sparsity:13.3f} "
              f"{m.true_sparsity:13.3f}")


if __name__ == "__main__":
    main()
