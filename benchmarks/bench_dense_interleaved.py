"""Dense prompt and decode speed, our engine against llama.cpp on the same GGUF file, both in this one process,
taking turns.

    python benchmarks/bench_dense_interleaved.py FILE [FILE ...] [-p 128] [-n 16] [--rounds 9] [-t 2]

`powerinfer bench` runs each engine in a process of its own per repetition, one after the other; on a shared
machine whose read bandwidth drifts by tens of percent within a minute, its decode ratios then move by as much
from run to run. Here both engines live in one process and take turns: each round, in alternating order, each
engine runs the -p token prompt from an empty context (timed), one untimed decode token (the other engine's
threads wind down meanwhile) and -n timed decode tokens (greedy). A drift longer than a turn (a second or two)
hits both alike. Printed per file: the medians over rounds of each engine's prompt and decode tok/s and of the
per-round ratios (ours / llama.cpp in the same round), which are the figures to quote.

Our engine runs with --sparse off; llama.cpp with its defaults (POWERINFER_LLAMACPP_REPACK=0 turns its repacked
buffers off, for hosts where they crash it). Use the PYTHONPATH of another build of either (an AVX2 build of ours,
an AVX2 llama-cpp-python) to compare those.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, unless installed

from powerinfer_py import load  # noqa: E402
from powerinfer_py.errors import PowerInferError  # noqa: E402
from powerinfer_py.tools.bench import BENCH_TEXT, LlamaCppRef, _fit_tokens  # noqa: E402


class _Ours:
    name = "powerinfer"

    def __init__(self, path: str, n_ctx: int, threads: int):
        self.llm = load(path, threads=threads, n_ctx=n_ctx, sparse="off")
        self.net, self.n_ctx = self.llm.model, n_ctx

    def prompt(self, ids: list[int]) -> np.ndarray:
        self.cache = self.net.new_cache(self.n_ctx)
        return self.net.forward(np.asarray(ids, dtype=np.int32), self.cache)

    def step(self, logits: np.ndarray) -> np.ndarray:
        return self.net.forward(np.array([int(np.argmax(logits))], dtype=np.int32), self.cache)

    def close(self) -> None:
        self.llm.close()


class _LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path: str, n_ctx: int, threads: int, n_prompt: int):
        self.ref = LlamaCppRef(path, n_ctx=n_ctx, threads=threads, n_batch=max(n_prompt, 32))

    def prompt(self, ids: list[int]) -> np.ndarray:
        self.ref.reset()
        return self.ref.decode(ids)

    def step(self, logits: np.ndarray) -> np.ndarray:
        return self.ref.decode([int(np.argmax(logits))])

    def close(self) -> None:
        self.ref.close()


def bench_file(path: str, a: argparse.Namespace) -> dict:
    n_ctx = a.n_prompt + a.n_gen + 8
    ours = _Ours(path, n_ctx, a.threads)  # first: our loader names what is wrong with a bad file
    try:
        ref = _LlamaCpp(path, n_ctx, a.threads, a.n_prompt)
    except BaseException:
        ours.close()
        raise
    ids = _fit_tokens(ref.ref.tokenize(BENCH_TEXT, add_bos=False), a.n_prompt, ref.ref.bos_id)
    engines = [ref, ours]
    rates = {e.name: {"prompt": [], "decode": []} for e in engines}
    try:
        for r in range(a.rounds):
            for e in (engines if r % 2 == 0 else engines[::-1]):
                t = time.perf_counter()
                logits = e.prompt(ids)
                rates[e.name]["prompt"].append(len(ids) / (time.perf_counter() - t))
                logits = e.step(logits)  # untimed: the other engine's threads wind down
                t = time.perf_counter()
                for _ in range(a.n_gen):
                    logits = e.step(logits)
                rates[e.name]["decode"].append(a.n_gen / (time.perf_counter() - t))
    finally:
        for e in engines:
            e.close()
    out = {}
    for phase in ("prompt", "decode"):
        ours, theirs = np.array(rates["powerinfer"][phase]), np.array(rates["llama.cpp"][phase])
        out[phase] = (statistics.median(ours), statistics.median(theirs), float(np.median(ours / theirs)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="GGUF files (each run by both engines)")
    p.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens per turn (default 128)")
    p.add_argument("-n", "--n-gen", type=int, default=16, help="timed decode tokens per turn (default 16)")
    p.add_argument("--rounds", type=int, default=9, help="turns per engine (default 9)")
    p.add_argument("-t", "--threads", type=int, default=2, help="threads for both engines (default 2)")
    a = p.parse_args(argv)
    if a.n_prompt < 4 or a.n_gen < 1 or a.rounds < 1 or a.threads < 1:
        p.error("-p must be >= 4 and -n, --rounds, -t >= 1")
    for f in a.files:
        if not Path(f).is_file():
            p.error(f"no such file: {f}")
    print(f"{a.rounds} rounds, prompt {a.n_prompt} tokens, {a.n_gen} decode tokens per turn, {a.threads} threads")
    print(f"{'file':32} {'prompt ours / llama.cpp':>26} {'paired':>7} {'decode ours / llama.cpp':>26} {'paired':>7}")
    for f in a.files:
        try:
            r = bench_file(f, a)
        except PowerInferError as e:
            print(f"bench_dense_interleaved.py: {e}", file=sys.stderr)
            return 1
        (po, pl, pr), (do, dl, dr) = r["prompt"], r["decode"]
        print(f"{Path(f).name:32} {po:12.1f} / {pl:11.1f} {pr:6.2f}x {do:12.2f} / {dl:11.2f} {dr:6.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
