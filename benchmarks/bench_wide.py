"""Model-wide sparse decode (--sparse wide) on a synthetic LLaMA-7B-layer-shape SwiGLU model: our engine at
--sparse off and --sparse wide (several model-wide sparsities) on the calibrated file, and llama.cpp on the
source file, same process, same threads, same prompt, taking turns.

    python benchmarks/bench_wide.py [--dir /tmp/powerinfer-wide] [--layers 8] [--dtypes f16,q8_0]
        [--sparsities 0.4,0.5] [--calib-sparsity 0.5] [--criterion plain] [--calib-tokens 512]
        [--reps 3] [-n 64] [-p 16] [-t 2] [--interleave 16] [--no-wide] [--regen] [--json FILE]

The source models (llama arch, d 4096, n_ff 11008, 32 heads, vocab 32000, --layers layers, F16 and Q8_0;
8 layers are ~3.5 GB in F16, ~1.9 GB in Q8_0) are written once into --dir, tensor by tensor (about one
matrix of memory), and reused while their parameters match (--regen rewrites them). Their weights are random,
chosen so that the inputs the wide mode thresholds have heavy-tailed magnitudes, as in trained models:
  - the norm gains (attn_norm, ffn_norm) are log-normal per channel (sigma NORM_SIGMA) with a few outlier
    channels (OUTLIER_SHARE of them, OUTLIER_GAIN times larger): the normed hidden state that q/k/v and
    gate/up read is then a scale mixture of Gaussians;
  - the rows of attn_v have log-normal scales (V_SIGMA), so the attention output (the input of attn_output)
    has channels of very different sizes;
  - the FFN intermediate silu(gate) * up is a product of two Gaussians: heavy-tailed by construction;
  - attention and FFN outputs are kept small against the residual (ATTN_REL, FFN_REL), as in sparse.py's
    models, so every layer sees the same picture.
Then `powerinfer calibrate --wide --sparsity S --criterion C` (default: plain |x|, which needs only the dense
pass; S = --calib-sparsity) writes the calibrated copy once per source, and the run modes ask for each
--sparsities value with --sparsity (the file's tables interpolate any S). With --no-wide (or when this tree has
no wide mode yet) only llama.cpp and --sparse off on the source file run.

Each configuration lives in this one process and they take turns of --interleave decode tokens (plus one
untimed token after each switch), rotating the order every round, --reps rounds of ceil(-n / interleave) turns:
a drift of the shared machine's bandwidth then hits every configuration alike. Printed per dtype: decode tok/s
over all turns (and the range over turns), the median over rounds of each turn's ratio to our `off` turn and to
llama.cpp's turn of the same round. Targets (issue 36): wide at 40% >= 1.35x and at 50% >= 1.6x, both against
our off and against llama.cpp.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the source tree, unless installed

from powerinfer_py.convert.output import check_free_space, quantize_rows  # noqa: E402
from powerinfer_py.gguf import read_metadata_only  # noqa: E402
from powerinfer_py.gguf.types import GGMLType  # noqa: E402
from powerinfer_py.synth.generic import _Spec  # noqa: E402
from powerinfer_py.synth.sparse import CHUNK, _StreamedFile  # noqa: E402
from powerinfer_py.tools.bench import BENCH_TEXT, LlamaCppRef, _fit_tokens, llamacpp_amx_risk  # noqa: E402

SHAPE = dict(n_embd=4096, n_ff=11008, n_head=32, n_vocab=32000)
DTYPES = {"f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "f32": GGMLType.F32, "bf16": GGMLType.BF16}
NORM_SIGMA, OUTLIER_SHARE, OUTLIER_GAIN = 0.5, 0.004, 8.0
V_SIGMA = 0.5
ATTN_REL, FFN_REL = 0.3, 0.3
WRITER_VERSION = 1  # bump when the weights' recipe changes: cached files of another version are rewritten
CALIBRATION_TEXT = ROOT / "benchmarks" / "data" / "calibration.txt"


# ---- the source model ---------------------------------------------------------------------------------------

def _gains(rng: np.random.Generator, d: int) -> np.ndarray:
    """Norm gains: log-normal per channel, OUTLIER_SHARE of the channels OUTLIER_GAIN times larger."""
    g = np.exp(rng.normal(0.0, NORM_SIGMA, d)).astype(np.float32)
    out = rng.choice(d, max(1, int(round(OUTLIER_SHARE * d))), replace=False)
    g[out] *= OUTLIER_GAIN
    return g


def write_model(path: Path, dtype: str, n_layer: int, seed: int = 0) -> Path:
    """A dense llama (SwiGLU) GGUF of SHAPE's dimensions, weights as the module docstring says, written
    CHUNK rows at a time (atomically: the file appears only once complete)."""
    d, F, H, V = SHAPE["n_embd"], SHAPE["n_ff"], SHAPE["n_head"], SHAPE["n_vocab"]
    t = DTYPES[dtype]
    spec = _Spec("llama", n_layer, d, F, H, H, V, dict(n_ctx_train=2048, norm_eps=1e-5, tied=False))
    meta, types = spec.metadata(dtype)
    meta["general.name"] = f"synthetic-wide-llama-{dtype}"
    meta["synthetic.wide_version"] = WRITER_VERSION
    meta["synthetic.seed"] = seed
    specs = [("token_embd.weight", t, (V, d))]
    for il in range(n_layer):
        p = f"blk.{il}."
        specs += [(p + "attn_norm.weight", GGMLType.F32, (d,)), (p + "attn_q.weight", t, (d, d)),
                  (p + "attn_k.weight", t, (d, d)), (p + "attn_v.weight", t, (d, d)),
                  (p + "attn_output.weight", t, (d, d)), (p + "ffn_norm.weight", GGMLType.F32, (d,)),
                  (p + "ffn_gate.weight", t, (F, d)), (p + "ffn_up.weight", t, (F, d)),
                  (p + "ffn_down.weight", t, (d, F))]
    specs += [("output_norm.weight", GGMLType.F32, (d,)), ("output.weight", t, (V, d))]
    f = _StreamedFile(path, meta, types, specs, "GGUF")
    check_free_space(path, f.total)
    rng = np.random.default_rng(seed)

    def matrix(name: str, n_rows: int, n_cols: int, std: float, row_scale: np.ndarray | None = None) -> None:
        for r0 in range(0, n_rows, CHUNK):
            r1 = min(n_rows, r0 + CHUNK)
            x = rng.standard_normal((r1 - r0, n_cols), dtype=np.float32)
            x *= np.float32(std)
            if row_scale is not None:
                x *= row_scale[r0:r1, None]
            f.write(name, x if t == GGMLType.F32 else quantize_rows(x, t))

    with contextlib.ExitStack() as stack:
        f.open(stack)
        matrix("token_embd.weight", V, d, 1.0)
        for il in range(n_layer):
            p = f"blk.{il}."
            # the norm gains scale the inputs; the matrices reading them are scaled down by the gains' rms so
            # that q, k, gate and up stay O(1)
            ga = _gains(rng, d)
            f.write(p + "attn_norm.weight", ga)
            rms_a = float(np.sqrt(np.mean(ga.astype(np.float64) ** 2)))
            for name in ("attn_q", "attn_k"):
                matrix(p + name + ".weight", d, d, 1.0 / np.sqrt(d) / rms_a)
            v_scale = np.exp(rng.normal(0.0, V_SIGMA, d)).astype(np.float32)
            matrix(p + "attn_v.weight", d, d, 1.0 / np.sqrt(d) / rms_a, v_scale)
            rms_v = float(np.sqrt(np.mean(v_scale.astype(np.float64) ** 2)))
            matrix(p + "attn_output.weight", d, d, ATTN_REL / np.sqrt(d) / rms_v)
            gf = _gains(rng, d)
            f.write(p + "ffn_norm.weight", gf)
            rms_f = float(np.sqrt(np.mean(gf.astype(np.float64) ** 2)))
            matrix(p + "ffn_gate.weight", F, d, 1.0 / np.sqrt(d) / rms_f)
            matrix(p + "ffn_up.weight", F, d, 1.0 / np.sqrt(d) / rms_f)
            # silu(g) * u of unit Gaussians has rms ~0.6
            matrix(p + "ffn_down.weight", d, F, FFN_REL / 0.6 / np.sqrt(F))
        f.write("output_norm.weight", np.ones(d, np.float32))
        matrix("output.weight", V, d, 1.0 / np.sqrt(d))
        f.close()
    return path


def ensure_source(folder: Path, dtype: str, a: argparse.Namespace) -> Path:
    path = folder / f"llama7bshape-{a.layers}l-s{a.seed}-{dtype}.gguf"
    if not a.regen and path.is_file():
        try:
            m = read_metadata_only(path)
            ok = int(m.metadata.get("synthetic.wide_version", -1)) == WRITER_VERSION
            m.close()
            if ok:
                return path
        except Exception:  # a damaged or foreign file: written again
            pass
    print(f"writing {path.name} ...", flush=True)
    t0 = time.perf_counter()
    write_model(path, dtype, a.layers, a.seed)
    print(f"  {time.perf_counter() - t0:.0f} s, {path.stat().st_size / 1e9:.2f} GB", flush=True)
    return path


def has_wide_mode() -> bool:
    try:
        import powerinfer_py.layers.wide  # noqa: F401
        import powerinfer_py.tools.wide_calibrate  # noqa: F401
    except ImportError:
        return False
    return True


def ensure_calibrated(src: Path, a: argparse.Namespace) -> Path:
    """`powerinfer calibrate --wide` on src (once: reused while the file exists and src is older)."""
    out = src.with_name(f"{src.stem}.wide{round(100 * a.calib_sparsity)}-{a.criterion}.gguf")
    if not a.regen and out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    cmd = [sys.executable, "-m", "powerinfer_cli", "calibrate", "-m", str(src), "--wide", "--sparsity",
           f"{a.calib_sparsity:g}", "--criterion", a.criterion, "--text", str(CALIBRATION_TEXT), "--tokens",
           str(a.calib_tokens), "-t", str(a.threads), "-o", str(out)]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    print(f"  calibrated in {time.perf_counter() - t0:.0f} s: {out.stat().st_size / 1e9:.2f} GB", flush=True)
    return out


# ---- the engines ------------------------------------------------------------------------------------------

class Ours:
    """Our engine in one sparse mode, greedy, one token per step()."""

    def __init__(self, path: Path, mode: str, sparsity: float | None, ids: list[int], threads: int, n_ctx: int):
        from powerinfer_py import load

        kw = {} if sparsity is None else {"sparsity": sparsity}
        self.llm = load(path, threads=threads, n_ctx=n_ctx, sparse=mode, **kw)
        self.net = self.llm.model
        self.cache = self.net.new_cache(n_ctx)
        self.logits = self.net.forward(np.asarray(ids, dtype=np.int32), self.cache)  # the prompt, untimed
        self.step_ids = np.empty(1, dtype=np.int32)

    def step(self) -> None:
        self.step_ids[0] = int(np.argmax(self.logits))
        self.logits = self.net.forward(self.step_ids, self.cache)

    def close(self) -> None:
        self.llm.close()


class LlamaCpp:
    def __init__(self, path: Path, ids: list[int], threads: int, n_ctx: int):
        self.ref = LlamaCppRef(path, n_ctx=n_ctx, threads=threads, n_batch=max(len(ids), 32))
        self.logits = self.ref.decode(ids)

    def step(self) -> None:
        self.logits = self.ref.decode([int(np.argmax(self.logits))])

    def close(self) -> None:
        self.ref.close()


def bench_dtype(dtype: str, a: argparse.Namespace) -> dict:
    folder = Path(a.dir)
    src = ensure_source(folder, dtype, a)
    wide = a.wide and has_wide_mode()
    if a.wide and not wide:
        print("  this tree has no --sparse wide yet: llama.cpp and --sparse off only", flush=True)
    calibrated = ensure_calibrated(src, a) if wide else None
    n_turns = max(1, -(-a.n_gen // a.interleave)) * a.reps
    n_ctx = a.n_prompt + n_turns * (a.interleave + 1) + 8
    ref = LlamaCppRef(src, n_ctx=8, threads=a.threads)  # the prompt's tokens, in the file's vocabulary
    ids = _fit_tokens(ref.tokenize(BENCH_TEXT, add_bos=False), a.n_prompt, ref.bos_id)
    ref.close()
    engines: dict[str, object] = {"llama.cpp": LlamaCpp(src, ids, a.threads, n_ctx)}
    if wide:  # off on the calibrated file: the dense product through the stored transposes
        engines["off"] = Ours(calibrated, "off", None, ids, a.threads, n_ctx)
        for s in a.sparsities:
            engines[f"wide {s:g}"] = Ours(calibrated, "wide", s, ids, a.threads, n_ctx)
    else:
        engines["off"] = Ours(src, "off", None, ids, a.threads, n_ctx)
    names = list(engines)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for turn in range(n_turns):
        k = turn % len(names)
        for name in names[k:] + names[:k]:
            e = engines[name]
            e.step()  # untimed: the previous engine's threads may still be spinning
            t0 = time.perf_counter()
            for _ in range(a.interleave):
                e.step()
            rates[name].append(a.interleave / (time.perf_counter() - t0))
        print(f"  turn {turn + 1}/{n_turns}: " + "  ".join(f"{n} {rates[n][-1]:.2f}" for n in names), flush=True)
    for e in engines.values():
        e.close()
    rows = []
    for name in names:
        r = rates[name]
        rows.append(dict(config=name, decode_tok_s=len(r) / sum(1.0 / x for x in r), median=statistics.median(r),
                         lo=min(r), hi=max(r),
                         vs_off=statistics.median(x / y for x, y in zip(r, rates["off"])),
                         vs_llama=statistics.median(x / y for x, y in zip(r, rates["llama.cpp"]))))
    return dict(dtype=dtype, source=str(src), calibrated=str(calibrated) if calibrated else None,
                off_file="calibrated" if wide else "source", rows=rows)


def print_table(res: dict, a: argparse.Namespace) -> None:
    print(f"\n{res['dtype'].upper()}: {a.layers} layers of LLaMA-7B shape, {a.threads} threads, turns of "
          f"{a.interleave} tokens, {a.reps} x {max(1, -(-a.n_gen // a.interleave))} turns per configuration; "
          f"off on the {res['off_file']} file, llama.cpp on the source")
    print(f"  {'config':10} {'tok/s':>7} {'median':>7} {'range':>13} {'vs off':>7} {'vs llama.cpp':>12}")
    for r in res["rows"]:
        print(f"  {r['config']:10} {r['decode_tok_s']:7.2f} {r['median']:7.2f} {r['lo']:6.2f}-{r['hi']:<6.2f} "
              f"{r['vs_off']:6.2f}x {r['vs_llama']:11.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/powerinfer-wide", help="where the models are cached")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtypes", default="f16,q8_0")
    ap.add_argument("--sparsities", default="0.4,0.5", help="model-wide sparsities to run (--sparse wide --sparsity)")
    ap.add_argument("--calib-sparsity", type=float, default=0.5, help="the S given to calibrate --wide")
    ap.add_argument("--criterion", default="plain", help="calibrate --wide --criterion (plain, wina, greedy, auto)")
    ap.add_argument("--calib-tokens", type=int, default=512, help="calibrate --tokens")
    ap.add_argument("--no-wide", dest="wide", action="store_false", help="llama.cpp and --sparse off only")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--interleave", type=int, default=16, metavar="N", help="decode tokens per turn")
    ap.add_argument("-n", "--n-gen", type=int, default=64, help="timed decode tokens per configuration and rep")
    ap.add_argument("-p", "--n-prompt", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--regen", action="store_true", help="rewrite the models (and calibrated copies) even if cached")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args(argv)
    a.sparsities = [float(v) for v in a.sparsities.split(",") if v]
    a.interleave = max(1, a.interleave)
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    risk = llamacpp_amx_risk()
    if risk:
        print(f"warning: {risk}", flush=True)
    results = []
    for dtype in a.dtypes.split(","):
        results.append(bench_dtype(dtype, a))
        print_table(results[-1], a)
    if len(results) > 1:
        for res in results:
            print_table(res, a)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
