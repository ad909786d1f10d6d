"""What a load-time quantized predictor (--predictor-dtype q8_0 / q4_0) changes against the file's float one
(--predictor-dtype exact), on held-out text, in three parts:

    python benchmarks/bench_predictor_quant.py --model FILE.pwri [--text benchmarks/data/evaluation.txt]
        [--kinds exact,q8_0,q4_0] [--tokens 256] [--forced 128] [--greedy 64] [-t 2]
        [--reps 3] [-n 64] [--interleave 16] [--skip-speed] [--predict-reps N] [--load-reps N] [--json OUT]
    python benchmarks/bench_predictor_quant.py --e2e-layers 4 ...   # the F16 7B-shape file of bench_sparse_e2e.py

1. Selection, per layer and over all layers: the text's first --tokens tokens go through the model densely (an
   FFN observer records each layer's predictor input p and its exact ReLU activations), then each kind's
   predictor (FFN.predict, one token at a time: the decode path's kernels) picks neurons on those same inputs.
   Printed: the fraction of neurons picked, recall of the truly active neurons (activation != 0), and recall
   of the neurons the exact predictor picks, with the picks the exact one does not make ("extra").
2. Output: --forced tokens of the text decoded one at a time (teacher forcing, predictor mode) by each kind:
   agreement of the argmax with the exact predictor's, mean KL(exact || kind) of the next-token distributions,
   the perplexity of the text; and --greedy tokens generated greedily from the text's first 16 tokens: how many
   differ from the exact predictor's run, and the first position that does.
3. Speed (unless --skip-speed): every kind loaded in this one process, taking turns of --interleave decode
   tokens, rotating the order every round, --reps rounds of ceil(-n / interleave) turns (the machine's
   bandwidth drifts: turns of a second or two let a drift hit every kind alike). Printed: decode tok/s over all
   turns, the median over rounds of the ratio to the exact predictor's turn, and the predictor's share of the
   timed decode (the one-token C step's timers: fc1, fc2 and the selection), with the load time of each kind.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py import load  # noqa: E402
from powerinfer_py.layers.ffn import FFN, step_timing_sums  # noqa: E402

HERE = Path(__file__).resolve().parent


def parse_kind(kind: str, threads: int) -> tuple[str, str, int]:
    """(sparse mode, predictor dtype, threads) of a --kinds entry: a predictor dtype (exact, q8_0, q4_0), or
    "dense" (the FFN without predictor: --sparse off), optionally ":T" for T threads instead of -t (exact:1 shows
    what a change of thread count alone does to the output)."""
    name, _, t = kind.partition(":")
    return ("off", "exact", int(t or threads)) if name == "dense" else ("predictor", name, int(t or threads))


def _load(path: Path, kind: str, threads: int, n_ctx: int):
    mode, dtype, n_threads = parse_kind(kind, threads)
    t0 = time.perf_counter()
    llm = load(path, threads=n_threads, n_ctx=n_ctx, sparse=mode, predictor_dtype=dtype)
    return llm, time.perf_counter() - t0


# ---- 1. selection ----------------------------------------------------------------------------------------

def capture(llm, ids: list[int], chunk: int = 64) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (p f32 [N, n_embd], truly active bool [N, n_ff]) of the dense forward over ids."""
    net = llm.model
    seen: list[list] = [[] for _ in net.ffns]

    def observer(layer, x, p, act):
        seen[layer].append((np.array(p, np.float32), np.asarray(act) != 0))

    for f in net.ffns:
        f.observer = observer
    cache = net.new_cache(len(ids) + 1)
    try:
        for i in range(0, len(ids), chunk):
            net.forward(np.asarray(ids[i:i + chunk], np.int32), cache)
    finally:
        for f in net.ffns:
            f.observer = None
    return [(np.concatenate([s[0] for s in parts]), np.concatenate([s[1] for s in parts])) for parts in seen]


def picks(ffn: FFN, p: np.ndarray) -> np.ndarray:
    """bool [N, n_ff]: the neurons ffn's predictor picks for each token, one token at a time."""
    return np.concatenate([ffn.predict(p[t:t + 1]) >= ffn.threshold for t in range(p.shape[0])])


def selection(llm, kinds: list[str], inputs) -> dict:
    """Per kind: per-layer and overall picked fraction, recall of the truly active, recall of the exact picks
    and extra picks (relative to the exact picks' count)."""
    net = llm.model
    out: dict[str, dict] = {}
    exact_picks = None
    for kind in kinds:
        if ":" in kind or kind == "dense":  # the picks of another thread count or of no predictor: not measured here
            continue
        settings = dataclasses.replace(net.sparse, predictor=kind)
        per_layer, layer_picks = [], []
        for il, (f, (p, true)) in enumerate(zip(net.ffns, inputs)):
            ffn = FFN(net.kernels, f.w, f.variant, settings, layer=il, act_param=float(f.act_param))
            sel = picks(ffn, p)
            layer_picks.append(sel)
            ref = exact_picks[il] if exact_picks is not None else sel
            per_layer.append(dict(picked=sel.mean(), recall_true=(sel & true).sum() / true.sum(),
                                  recall_exact=(sel & ref).sum() / ref.sum(), extra=(sel & ~ref).sum() / ref.sum()))
        if exact_picks is None:
            exact_picks = layer_picks
        tot = np.sum([[s.sum(), s.size, (s & t).sum(), t.sum(), (s & r).sum(), r.sum(), (s & ~r).sum()]
                      for s, (_, t), r in zip(layer_picks, inputs, exact_picks)], axis=0, dtype=np.float64)
        out[kind] = dict(layers=per_layer, picked=tot[0] / tot[1], recall_true=tot[2] / tot[3],
                         recall_exact=tot[4] / tot[5], extra=tot[6] / tot[5],
                         true_active=tot[3] / tot[1])
    return out


# ---- 2. output ----------------------------------------------------------------------------------------------

def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max()
    return z - math.log(np.exp(z).sum())


def forced(llms: dict, ids: list[int]) -> dict:
    """Teacher-forced decode of ids by every kind, in step (one position for every kind, then the next): per
    kind argmax agreement with the first kind, mean KL(first || kind), perplexity of ids[1:]."""
    kinds = list(llms)
    caches = {k: llm.model.new_cache(len(ids) + 1) for k, llm in llms.items()}
    agree, kl, nll = ({k: 0.0 for k in kinds} for _ in range(3))
    for pos, t in enumerate(ids[:-1]):
        rows = {k: _log_softmax(llm.model.forward(np.asarray([t], np.int32), caches[k])) for k, llm in llms.items()}
        ref = rows[kinds[0]]
        for k, row in rows.items():
            agree[k] += int(np.argmax(ref)) == int(np.argmax(row))
            kl[k] += float(np.sum(np.exp(ref) * (ref - row)))
            nll[k] -= row[ids[pos + 1]]
    n = len(ids) - 1
    return {k: dict(argmax_agree=agree[k] / n, kl=kl[k] / n, ppl=float(math.exp(nll[k] / n)), n=n) for k in kinds}


def greedy(llms: dict, prompt: list[int], n: int) -> dict:
    """n greedy tokens from prompt by every kind: per kind the tokens, how many differ from the first kind's and
    the first index that differs (None: none)."""
    runs = {}
    for kind, llm in llms.items():
        net = llm.model
        cache = net.new_cache(len(prompt) + n + 1)
        logits = net.forward(np.asarray(prompt, np.int32), cache)
        toks = []
        for _ in range(n):
            toks.append(int(np.argmax(logits)))
            logits = net.forward(np.asarray(toks[-1:], np.int32), cache)
        runs[kind] = toks
    first = runs[next(iter(runs))]
    out = {}
    for kind, toks in runs.items():
        diff = [i for i, (a, b) in enumerate(zip(first, toks)) if a != b]
        out[kind] = dict(tokens=toks, n_differ=len(diff), first_differ=diff[0] if diff else None)
    return out


# ---- 3. speed -------------------------------------------------------------------------------------------------

def speed(llms: dict, prompt: list[int], a: argparse.Namespace) -> dict:
    n_turns = max(1, -(-a.n_gen // a.interleave)) * a.reps
    state = {}
    for kind, llm in llms.items():
        net = llm.model
        cache = net.new_cache(len(prompt) + n_turns * (a.interleave + 1) + 8)
        state[kind] = [net, cache, net.forward(np.asarray(prompt, np.int32), cache)]
    names = list(llms)
    rates: dict[str, list[float]] = {n: [] for n in names}
    timed = {n: np.zeros(5) for n in names}
    step_ids = np.empty(1, np.int32)

    def step(kind):
        net, cache, logits = state[kind]
        step_ids[0] = int(np.argmax(logits))
        state[kind][2] = net.forward(step_ids, cache)

    for turn in range(n_turns):
        k = turn % len(names)
        for name in names[k:] + names[:k]:
            step(name)  # untimed: the previous kind's threads may still be spinning
            before = step_timing_sums(state[name][0].ffns)
            t0 = time.perf_counter()
            for _ in range(a.interleave):
                step(name)
            wall = time.perf_counter() - t0
            rates[name].append(a.interleave / wall)
            if before is not None:  # layers with the one-token C step (its timers): the predictor's share
                timed[name] += np.append(step_timing_sums(state[name][0].ffns) - before, wall)
        print(f"  round {turn + 1}/{n_turns}: " + "  ".join(f"{n} {rates[n][-1]:.2f}" for n in names), flush=True)
    first = names[0]
    out = {}
    for name in names:
        r = rates[name]
        calls, pred_s, _, hidden, wall = timed[name]
        out[name] = dict(decode_tok_s=len(r) / sum(1 / x for x in r), turn_min=min(r), turn_max=max(r),
                         paired=statistics.median(x / y for x, y in zip(r, rates[first])),
                         predictor_share=pred_s / wall if wall else float("nan"),
                         hidden_nonzero=hidden / calls if calls else float("nan"),
                         predictor_us=1e6 * pred_s / calls if calls else float("nan"))
    return out


def predictor_bytes(llm) -> dict:
    """MB of the predictor tensors that run (fc1, fc2) and of fc2's one-token copy, summed over the layers."""
    fc1 = sum(np.asarray(f.fc1.data).nbytes for f in llm.model.ffns)
    fc2 = sum(np.asarray(f.fc2.data).nbytes for f in llm.model.ffns)
    copy = sum(np.asarray(f.fc2_t.data).nbytes for f in llm.model.ffns if f.fc2_t is not None)
    return dict(fc1_mb=fc1 / 1e6, fc2_mb=fc2 / 1e6, fc2_copy_mb=copy / 1e6,
                type=llm.model.ffns[0].fc1.type.name)


def predict_time(llms: dict, inputs, reps: int) -> dict[str, float]:
    """Median over `reps` alternating rounds of the time of one FFN.predict (one token: the decode path's
    kernels) on the middle layer, over the first 8 captured predictor inputs, per predictor kind."""
    il = len(inputs) // 2
    ps = [np.ascontiguousarray(inputs[il][0][t:t + 1]) for t in range(min(8, len(inputs[il][0])))]
    kinds = [k for k in llms if k != "dense"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(reps):
        for k in kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]:
            f = llms[k].model.ffns[il]
            t0 = time.perf_counter()
            for p in ps:
                f.predict(p)
            times[k].append((time.perf_counter() - t0) / len(ps))
    return {k: 1e6 * statistics.median(v) for k, v in times.items()}


def selection_table(res: dict, first, kinds: list[str], ids: list[int], a: argparse.Namespace,
                    llms: dict | None = None) -> None:
    """Part 1: measure and print the selection figures (into res["selection"]); with --predict-reps also the
    time of the predictor alone (res["predict_us"])."""
    inputs = capture(first, ids[:a.tokens])
    sel = selection(first, kinds, inputs)
    res["selection"] = sel
    print(f"\n1. selection on the dense model's states over {min(a.tokens, len(ids))} held-out tokens "
          f"(truly active: {sel[kinds[0]]['true_active']:.2%} of the neurons)")
    print(f"  {'kind':6} {'picked':>8} {'recall(true)':>13} {'recall(exact)':>14} {'extra':>8}   per layer "
          f"recall(exact)")
    for k in sel:
        s = sel[k]
        lay = " ".join(f"{x['recall_exact']:.4f}" for x in s["layers"])
        print(f"  {k:6} {s['picked']:8.2%} {s['recall_true']:13.4f} {s['recall_exact']:14.4f} {s['extra']:8.2%}   {lay}")
    if a.predict_reps and llms:
        us = predict_time(llms, inputs, a.predict_reps)
        res["predict_us"] = us
        print(f"  the predictor alone (FFN.predict, one token, layer {len(inputs) // 2}, median of {a.predict_reps} "
              "alternating rounds): " + ", ".join(f"{k} {v:.1f} us" for k, v in us.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="a PWRI file with float predictors")
    src.add_argument("--e2e-layers", type=int, metavar="N",
                     help="bench_sparse_e2e.py's F16 7B-shape model with N layers (written into --dir if missing)")
    ap.add_argument("--dir", default="/tmp/powerinfer-sparse-e2e")
    ap.add_argument("--text", type=Path, default=HERE / "data" / "evaluation.txt")
    ap.add_argument("--kinds", default="exact,q8_0,q4_0")
    ap.add_argument("--tokens", type=int, default=256, help="held-out tokens for the selection measurement")
    ap.add_argument("--forced", type=int, default=128, help="held-out tokens decoded with teacher forcing")
    ap.add_argument("--greedy", type=int, default=64, help="greedy tokens generated per kind")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--interleave", type=int, default=16)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--predict-reps", type=int, default=0, metavar="N",
                    help="with --tokens: also time the predictor alone, N alternating rounds (median)")
    ap.add_argument("--load-reps", type=int, default=0, metavar="N",
                    help="also load the file N more times per kind, alternating kinds, and print the median load time")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    if not kinds or kinds[0] != "exact":
        ap.error("--kinds must start with exact: every other kind is compared with it")
    if a.model is None:
        import bench_sparse_e2e as e2e
        from powerinfer_py.synth import sparse as synth_sparse

        ns = argparse.Namespace(shape="7b", layers=a.e2e_layers, rank=1024, active=0.10, recall=0.90, power=1.0,
                                noise=synth_sparse.DEFAULT_NOISE, seed=0, regen=False)
        Path(a.dir).mkdir(parents=True, exist_ok=True)
        a.model, _ = e2e.ensure_model(Path(a.dir), "f16", ns)
    text = a.text.read_text(encoding="utf-8")
    n_ctx = max(a.tokens, a.forced, 16 + a.greedy) + 8
    n_ctx = max(n_ctx, 16 + max(1, -(-a.n_gen // a.interleave)) * a.reps * (a.interleave + 1) + 16)
    llms, load_s = {}, {}
    for kind in kinds:
        llms[kind], load_s[kind] = _load(a.model, kind, a.threads, n_ctx)
    first = llms[kinds[0]]
    ids = first.tokenize(text)
    res: dict = dict(model=str(a.model), text=str(a.text), kinds=kinds, threads=a.threads,
                     n_text_tokens=len(ids), load_s=load_s, threshold=float(first.sparse.threshold),
                     bytes={k: predictor_bytes(llm) for k, llm in llms.items()})
    print(f"{a.model.name}: {first.config.n_layer} layers, n_ff {first.config.n_ff}, text {a.text.name} "
          f"({len(ids)} tokens), threshold {res['threshold']:g}, {a.threads} threads")
    for k in kinds:
        b = res["bytes"][k]
        print(f"  {k:6} load {load_s[k]:.2f} s; predictor {b['type']}: fc1 {b['fc1_mb']:.1f} MB, fc2 "
              f"{b['fc2_mb']:.1f} MB, fc2 copy {b['fc2_copy_mb']:.1f} MB")

    if a.tokens:
        selection_table(res, first, kinds, ids, a, llms)
    if a.forced:
        f = forced(llms, ids[:a.forced + 1])
        res["forced"] = f
        print(f"\n2. {f[kinds[0]]['n']} held-out tokens, teacher-forced decode")
        for k in kinds:
            print(f"  {k:6} argmax agrees with {kinds[0]}: {f[k]['argmax_agree']:.2%}, KL {f[k]['kl']:.2e} nats, "
                  f"perplexity {f[k]['ppl']:.3f}")
    if a.greedy:
        g = greedy(llms, ids[:16], a.greedy)
        res["greedy"] = g
        print(f"  greedy, {a.greedy} tokens after the text's first 16:")
        for k in kinds:
            print(f"  {k:6} {g[k]['n_differ']} of {a.greedy} differ from {kinds[0]}'s (first at "
                  f"{g[k]['first_differ']})")

    if not a.skip_speed:
        print(f"\n3. decode speed: turns of {a.interleave} tokens, {a.reps} x "
              f"{max(1, -(-a.n_gen // a.interleave))} turns per kind")
        sp = speed(llms, ids[:16], a)
        res["speed"] = sp
        for k in kinds:
            s = sp[k]
            print(f"  {k:6} decode {s['decode_tok_s']:6.2f} tok/s ({s['turn_min']:.2f}-{s['turn_max']:.2f}), "
                  f"paired vs {kinds[0]} {s['paired']:.3f}x, predictor {s['predictor_share']:.1%} of the decode "
                  f"({s['predictor_us']:.0f} us per layer and token; hidden units {s['hidden_nonzero']:.1%} non-zero)")
    for llm in llms.values():
        llm.close()
    if a.load_reps:
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for rep in range(a.load_reps):
            for kind in kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]:
                llm, t = _load(a.model, kind, a.threads, 64)
                llm.close()
                times[kind].append(t)
        res["load_median_s"] = {k: statistics.median(v) for k, v in times.items()}
        print(f"\nload time, median of {a.load_reps} alternating loads: "
              + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in times.items()))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
