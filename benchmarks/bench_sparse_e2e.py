"""End-to-end sparse decode: our engine (--sparse predictor / exact / off) on a synthetic 7B-layer-shape PWRI
model against llama.cpp on its dense GGUF twin, same run, same threads, same tokens.

    python benchmarks/bench_sparse_e2e.py [--dir /tmp/powerinfer-sparse-e2e] [--layers 8] [--dtypes q4_0,f16]
        [--modes predictor,exact,off] [--reps 3] [-n 128] [-p 16] [-t 2] [--interleave 16] [--active 0.1] [--recall 0.9]
        [--rank 1024] [--predictor-dtype auto|exact|q8_0|q4_0] [--regen] [--json FILE]

The models (powerinfer_py.synth.sparse: d 4096, n_ff 11008, 32 heads, vocab 32000, rank-1024 predictors,
10% of neurons active on average, predictor recall 0.9) are written once into --dir and reused while their
parameters match (--regen rewrites them): 8 layers are ~3.8 GB per file in F16, ~1.1 GB in Q4_0.
By default every configuration (llama.cpp and our modes) lives in this one process and they take turns of
--interleave decode tokens (16), rotating the order every round, --reps rounds of ceil(-n / 16) turns each: the
shared development machine's bandwidth drifts by tens of percent within a minute, and turns of a second or
two let a drift hit every configuration alike. `--interleave 0` runs one child process of
powerinfer_py.tools.bench per configuration and rep instead (prompt tok/s too; medians over --reps).

Printed per dtype: decode (and prompt) tok/s, decode ratio against llama.cpp, the active fraction our engine
measured while decoding (predictor mode: neurons computed; exact: neurons with a non-zero ReLU), and the
bandwidth ceiling for that fraction: dense bytes per token / sparse bytes per token, where sparse bytes =
everything outside the FFN + the FFN's share for the active fraction (+ the predictor's fc1/fc2), printed
with and without the predictor's bytes (exact mode reads all of ffn_gate, then ffn_up and ffn_down_t rows of
the active neurons). One-token decodes of float, Q4_0 and Q8_0 predictors read only the fc2 rows of their
non-zero hidden units (about half here) while those are few enough: in interleaved runs, which measure that
share, the first ceiling counts the fc2 bytes so read (fc2_read); otherwise all of fc2.
Targets (issue 3): predictor >= 1.8x llama.cpp (stretch 2.2x), exact >= 1.4x, and the
predictor <= 10% of a token: in interleaved runs its share of the timed decode is printed, from the timers of
the one-token C step (pi_sparse_ffn.timing: fc1, fc2 and the selection, every layer), with the measured
non-zero share of its hidden units.
llama.cpp computes SiLU on the twin where the model means ReLU: the twin is a speed reference only.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py.synth import sparse as synth_sparse  # noqa: E402
from powerinfer_py.tools.bench import BENCH_TEXT, LlamaCppRef, _fit_tokens, llamacpp_amx_risk, run_child  # noqa: E402
from powerinfer_py.layers.ffn import FC2_AXPY_MAX_PERCENT, PREDICTOR_AUTO, step_timing_sums  # noqa: E402
from powerinfer_py.gguf.types import GGMLType, row_bytes  # noqa: E402
from powerinfer_py.gguf import open_gguf  # noqa: E402

FFN = ("ffn_gate", "ffn_up", "ffn_down_t", "ffn_down")
PREDICTOR = ("fc1", "fc2")


def ensure_model(folder: Path, dtype: str, a: argparse.Namespace) -> tuple[Path, Path]:
    """The (PWRI, dense twin) pair for these parameters: reused if both exist and match, else written."""
    stem = f"relu{a.shape}-{a.layers}l-r{a.rank}-a{a.active:g}-rc{a.recall:g}-{dtype}"
    pwri, dense = folder / f"{stem}.pwri", folder / f"{stem}.gguf"
    want = dict(mean_active=a.active, recall_target=a.recall, power=a.power, noise=a.noise, seed=a.seed)
    if not a.regen and pwri.is_file() and dense.is_file():
        info = synth_sparse.synth_info(pwri)
        if all(abs(float(info.get(k, -1)) - v) < 1e-6 for k, v in want.items()):
            return pwri, dense
    print(f"writing {pwri.name} and its dense twin ...", flush=True)
    t0 = time.perf_counter()
    synth_sparse.write_sparse_model(pwri, dense_path=dense, n_layer=a.layers, dtype=dtype, mean_active=a.active,
                                    recall=a.recall, power=a.power, noise=a.noise, seed=a.seed, force=True,
                                    **{**synth_sparse.SHAPES[a.shape], "rank": a.rank})
    print(f"  {time.perf_counter() - t0:.0f} s, {pwri.stat().st_size / 1e9:.2f} GB + "
          f"{dense.stat().st_size / 1e9:.2f} GB", flush=True)
    return pwri, dense


def byte_budget(pwri: Path, predictor_dtype: str = "auto") -> dict[str, int]:
    """Bytes read per decoded token by kind: other (attention, norms, output head, one embedding row),
    gate, up_down, predictor. The predictor counts as it runs: a float one in the type of its load-time copy
    when --predictor-dtype (auto: ffn.PREDICTOR_AUTO, these files being ReLU models) asks for one."""
    copy = {"q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}.get(PREDICTOR_AUTO if predictor_dtype == "auto"
                                                              else predictor_dtype)
    f = open_gguf(pwri)  # tensor views on a memory map: nothing is read
    out = dict(other=0, gate=0, up_down=0, predictor=0, fc1=0, fc2=0, fc2_type="")
    for name, t in f.tensors.items():
        kind = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        if kind == "token_embd":
            out["other"] += t.nbytes // t.shape[0]  # one row per token
        elif kind == "ffn_gate":
            out["gate"] += t.nbytes
        elif kind in FFN:
            out["up_down"] += t.nbytes
        elif kind in PREDICTOR:
            ty = copy if copy is not None and t.type.name in ("F32", "F16", "BF16") and t.shape[-1] % 32 == 0 \
                else t.type
            n = t.nbytes if ty == t.type else t.shape[0] * row_bytes(ty, t.shape[-1])
            out["predictor"] += n
            out[kind] += n
            if kind == "fc2":
                out["fc2_type"] = ty.name
        else:
            out["other"] += t.nbytes
    f.close()
    return out


def fc2_read(fc2_type: str, hidden: float) -> float:
    """The share of fc2's bytes a one-token decode reads when `hidden` of the predictor's hidden units are
    non-zero: only their rows (float types: a transposed copy; Q4_0 / Q8_0: a copy by hidden unit, whose scales
    are all read) while they are few enough for that (ffn.FC2_AXPY_MAX_PERCENT), else all."""
    if hidden != hidden or hidden * 100 > FC2_AXPY_MAX_PERCENT:  # not measured, or too many: the dense mat-vec
        return 1.0
    if fc2_type in ("F32", "F16", "BF16"):
        return hidden
    if fc2_type == "Q4_0":
        return hidden * 16 / 18 + 2 / 18
    if fc2_type == "Q8_0":
        return hidden * 32 / 34 + 2 / 34
    return 1.0


def ceilings(b: dict, mode: str, active: float, hidden: float = float("nan")) -> tuple[float, float]:
    """(ceiling speedup over dense with the predictor's bytes read, without them) for `mode` at `active`; the
    predictor's fc2 counts in full unless `hidden` (its hidden units' measured non-zero share) says less of it
    is read (fc2_read)."""
    dense = b["other"] + b["gate"] + b["up_down"]
    if mode == "off":
        return 1.0, 1.0
    ffn = (b["gate"] + active * b["up_down"]) if mode == "exact" else active * (b["gate"] + b["up_down"])
    pred = b["fc1"] + b["fc2"] * fc2_read(b["fc2_type"], hidden) if mode == "predictor" else 0
    return dense / (b["other"] + ffn + pred), dense / (b["other"] + ffn)


def _fraction(run) -> float:
    """The active fraction our engine reported for a run (NaN when it reported none)."""
    value = getattr(run, "active_fraction", None)
    return float("nan") if value is None else float(value)


def bench_dtype(dtype: str, a: argparse.Namespace) -> dict:
    pwri, dense = ensure_model(Path(a.dir), dtype, a)
    info, budget = synth_sparse.synth_info(pwri), byte_budget(pwri, a.predictor_dtype)
    configs = [("llamacpp", dense, None)] + [("ours", pwri, m) for m in a.modes]
    runs: dict[str, list] = {("llama.cpp" if e == "llamacpp" else m): [] for e, _, m in configs}
    for rep in range(a.reps):
        k = rep % len(configs)
        for engine, path, mode in configs[k:] + configs[:k]:  # rotate the order rep by rep
            r = run_child(engine, path, a.n_prompt, a.n_gen, a.threads, sparse=mode,
                          predictor_dtype=a.predictor_dtype if engine == "ours" and mode == "predictor" else "auto")
            runs["llama.cpp" if engine == "llamacpp" else mode].append(r)
            act = _fraction(r)
            print(f"  rep {rep + 1} {engine:8} {mode or 'dense':9} decode {r.decode_tok_s:6.2f} tok/s"
                  + (f"  active {act:.3f}" if act == act else ""), flush=True)
    ref = statistics.median(r.decode_tok_s for r in runs["llama.cpp"])
    rows = []
    for name, rs in runs.items():
        dec = [r.decode_tok_s for r in rs]
        active = statistics.median(_fraction(r) for r in rs) if name != "llama.cpp" else float("nan")
        with_pred, without = ceilings(budget, name, active) if name != "llama.cpp" else (1.0, 1.0)
        # the same rep's llama.cpp run was taken minutes apart at most: on a host whose bandwidth drifts, the
        # median of these paired ratios is steadier than the ratio of the two medians
        paired = statistics.median(d / r.decode_tok_s for d, r in zip(dec, runs["llama.cpp"]))
        rows.append(dict(config=name, decode_tok_s=statistics.median(dec), decode_min=min(dec), decode_max=max(dec),
                         prompt_tok_s=statistics.median(r.prompt_tok_s for r in rs),
                         ratio=statistics.median(dec) / ref, paired_ratio=paired, active=active, ceiling=with_pred,
                         ceiling_no_pred=without))
    return dict(dtype=dtype, pwri=str(pwri), dense=str(dense), calibration=info, bytes=budget, rows=rows)


class _Ours:
    """Our engine in one sparse mode, decoding greedily one token per step() (interleaved runs)."""

    def __init__(self, path: Path, mode: str, ids: list[int], a: argparse.Namespace, n_ctx: int):
        from powerinfer_py import load

        self.llm = load(path, threads=a.threads, n_ctx=n_ctx, sparse=mode, use_mmap=not a.no_mmap,
                        predictor_dtype=a.predictor_dtype if mode == "predictor" else "auto")
        self.net = self.llm.model
        self.cache = self.net.new_cache(n_ctx)
        self.logits = self.net.forward(np.asarray(ids, dtype=np.int32), self.cache)  # the prompt, untimed
        if self.net.sparsity is not None:
            self.net.sparsity.reset()  # count decode tokens only
        self.step_ids = np.empty(1, dtype=np.int32)

    def step(self) -> None:
        self.step_ids[0] = int(np.argmax(self.logits))
        self.logits = self.net.forward(self.step_ids, self.cache)

    def active(self) -> float:
        s = self.net.sparsity
        return float(s.mean_fraction) if s is not None else float("nan")

    def timing(self) -> np.ndarray | None:
        """The one-token C steps' sums over the layers (FFN.step_timing: calls, predictor s, step s, summed
        non-zero hidden share), or None when the layers have no such step."""
        return step_timing_sums(getattr(self.net, "ffns", ()))

    def close(self) -> None:
        self.llm.close()


class _LlamaCpp:
    """llama.cpp on the dense twin, decoding greedily one token per step()."""

    def __init__(self, path: Path, ids: list[int], a: argparse.Namespace, n_ctx: int):
        self.ref = LlamaCppRef(path, n_ctx=n_ctx, threads=a.threads, n_batch=max(len(ids), 32))
        self.logits = self.ref.decode(ids)

    def step(self) -> None:
        self.logits = self.ref.decode([int(np.argmax(self.logits))])

    def active(self) -> float:
        return float("nan")

    def timing(self) -> None:
        return None

    def close(self) -> None:
        self.ref.close()


def bench_dtype_interleaved(dtype: str, a: argparse.Namespace) -> dict:
    """Every configuration in this one process, taking turns of --interleave timed tokens (plus one untimed
    token after each switch, while the previous engine's threads wind down), --reps rounds of turns per
    configuration in rotated order. A drift of the machine lasting longer than a turn (a second or two) hits
    every configuration alike, where one process per configuration lets a minute of drift between runs skew
    the ratios."""
    pwri, dense = ensure_model(Path(a.dir), dtype, a)
    info, budget = synth_sparse.synth_info(pwri), byte_budget(pwri, a.predictor_dtype)
    n_turns = max(1, -(-a.n_gen // a.interleave)) * a.reps
    n_ctx = a.n_prompt + n_turns * (a.interleave + 1) + 8
    engines: dict[str, object] = {}
    ref = LlamaCppRef(dense, n_ctx=8, threads=a.threads)  # the prompt's tokens (the twin shares the vocab)
    ids = _fit_tokens(ref.tokenize(BENCH_TEXT, add_bos=False), a.n_prompt, ref.bos_id)
    ref.close()
    engines["llama.cpp"] = _LlamaCpp(dense, ids, a, n_ctx)
    for mode in a.modes:
        engines[mode] = _Ours(pwri, mode, ids, a, n_ctx)
    names = list(engines)
    rates: dict[str, list[float]] = {n: [] for n in names}  # tok/s per turn
    timed = {n: np.zeros(5) for n in names}  # C step sums over the timed turns (+ their wall seconds)
    for turn in range(n_turns):
        k = turn % len(names)
        for name in names[k:] + names[:k]:
            e = engines[name]
            e.step()  # untimed: the previous engine's pool may still be spinning
            before = e.timing()
            t0 = time.perf_counter()
            for _ in range(a.interleave):
                e.step()
            wall = time.perf_counter() - t0
            rates[name].append(a.interleave / wall)
            if before is not None:
                timed[name] += np.append(e.timing() - before, wall)
        if (turn + 1) % len(names) == 0:
            print(f"  turn {turn + 1}/{n_turns}: " + "  ".join(f"{n} {rates[n][-1]:.2f}" for n in names), flush=True)
    rows = []
    ref_rates = rates["llama.cpp"]
    for name in names:
        r = rates[name]
        total = len(r) * a.interleave / sum(a.interleave / x for x in r)  # tokens / seconds over all turns
        active = engines[name].active()
        with_pred, without = ceilings(budget, name, active) if name != "llama.cpp" else (1.0, 1.0)
        ref_total = len(ref_rates) * a.interleave / sum(a.interleave / x for x in ref_rates)
        calls, pred_s, _, hidden, wall = timed[name]
        if pred_s:  # the ceiling with the predictor bytes this run read
            with_pred, without = ceilings(budget, name, active, hidden / calls)
        rows.append(dict(config=name, decode_tok_s=total, decode_min=min(r), decode_max=max(r),
                         prompt_tok_s=float("nan"), ratio=total / ref_total,
                         paired_ratio=statistics.median(x / y for x, y in zip(r, ref_rates)),
                         active=active, ceiling=with_pred, ceiling_no_pred=without,
                         predictor_share=pred_s / wall if pred_s else float("nan"),
                         hidden_nonzero=hidden / calls if pred_s else float("nan")))
    for e in engines.values():
        e.close()
    return dict(dtype=dtype, pwri=str(pwri), dense=str(dense), calibration=info, bytes=budget, rows=rows)


def print_table(res: dict, a: argparse.Namespace) -> None:
    info, b = res["calibration"], res["bytes"]
    if a.interleave:
        how = (f"one process, turns of {a.interleave} tokens, {a.reps} x {max(1, -(-a.n_gen // a.interleave))} "
               f"turns per configuration ('decode tok/s': all turns, range over turns; 'paired': median over "
               f"rounds of the ratio to llama.cpp's turn in the same round)")
    else:
        how = (f"{a.n_gen} generated tokens, median of {a.reps} processes ('vs llama.cpp': ratio of the medians; "
               f"'paired': median over reps of the ratio to llama.cpp's run in the same rep)")
    print(f"\n{res['dtype'].upper()}: {a.layers} layers of shape {a.shape}, predictor rank {a.rank}, "
          f"{a.threads} threads, {how}")
    print(f"  calibration ({info['sample_tokens']} random tokens): active {info['measured_active']:.1%}, "
          f"predicted {info['measured_predicted']:.1%}, recall {info['measured_recall']:.3f}")
    mb = {k: v / 1e6 for k, v in b.items() if k != "fc2_type"}
    print(f"  MB per token (dense): other {mb['other']:.0f}, ffn_gate {mb['gate']:.0f}, ffn_up+down "
          f"{mb['up_down']:.0f}; predictor {mb['predictor']:.0f} (fc2 {mb['fc2']:.0f}, {b['fc2_type']}); 'ceiling': "
          f"the bandwidth bound with the predictor's bytes read (fc2: only the rows of non-zero hidden units where "
          f"the engine reads so and reported their share; else all of it)")
    print(f"  {'config':10} {'decode tok/s':>18} {'prompt tok/s':>13} {'vs llama.cpp':>13} {'paired':>7} "
          f"{'active':>7} {'ceiling':>8} {'(no pred)':>9}")
    for r in res["rows"]:
        act = f"{r['active']:.1%}" if r["active"] == r["active"] else "-"
        print(f"  {r['config']:10} {r['decode_tok_s']:7.2f} ({r['decode_min']:.2f}-{r['decode_max']:.2f}) "
              f"{'-' if math.isnan(r['prompt_tok_s']) else format(r['prompt_tok_s'], '.1f'):>13} "
              f"{r['ratio']:12.2f}x {r['paired_ratio']:6.2f}x {act:>7} {r['ceiling']:7.2f}x "
              f"{r['ceiling_no_pred']:8.2f}x")
    for r in res["rows"]:
        share = r.get("predictor_share", float("nan"))
        if share == share:
            print(f"  {r['config']}: the predictor (fc1, fc2, selection; timed in its C step) took {share:.1%} of "
                  f"the decode time; its hidden units were {r['hidden_nonzero']:.1%} non-zero")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/powerinfer-sparse-e2e", help="where the models are cached")
    ap.add_argument("--shape", default="7b", choices=sorted(synth_sparse.SHAPES), help="tiny: a smoke test")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtypes", default="q4_0,f16")
    ap.add_argument("--modes", default="predictor,exact,off")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--interleave", type=int, default=16, metavar="N",
                    help="all configurations in one process, taking turns of N decode tokens (default 16); "
                         "0: one process per configuration and rep (prompt tok/s too)")
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-p", "--n-prompt", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--active", type=float, default=0.10)
    ap.add_argument("--recall", type=float, default=0.90)
    ap.add_argument("--rank", type=int, help="predictor rank [default: the shape's, 1024 for 7b]")
    ap.add_argument("--power", type=float, default=1.0)
    ap.add_argument("--noise", type=float, default=synth_sparse.DEFAULT_NOISE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--regen", action="store_true", help="rewrite the models even if cached")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--predictor-dtype", default="auto", choices=("auto", "exact", "q8_0", "q4_0"),
                    help="our predictor mode's --predictor-dtype (auto: the engine's default for these ReLU files)")
    ap.add_argument("--no-mmap", action="store_true", help="our modes read the model into memory instead of "
                    "mapping it (powerinfer's --no-mmap; llama.cpp keeps its default)")
    a = ap.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    a.rank = a.rank or synth_sparse.SHAPES[a.shape]["rank"]
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    risk = llamacpp_amx_risk()
    if risk:
        print(f"warning: {risk}", flush=True)
    results = []
    for dtype in a.dtypes.split(","):
        results.append(bench_dtype_interleaved(dtype, a) if a.interleave else bench_dtype(dtype, a))
        print_table(results[-1], a)
    for res in results:  # all tables together at the end, as the README table wants them
        print_table(res, a)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
