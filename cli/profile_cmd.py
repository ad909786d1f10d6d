"""`powerinfer profile`: per-layer FFN activation statistics over a calibration text (powerinfer_py.tools.profile).

Register with `app.command("profile", epilog=profile_cmd.EPILOG)(profile_cmd.profile)`."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from . import options as O
from .shell import model_path, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer profile -m demo --text calib.txt --tokens 4096 -o prof/ --plot prof/freq.png
  powerinfer profile -m relu.pwri -o prof/          # no --text: calibration text sampled from the model

Writes OUT/activation/activation_N.pt (PowerInfer's per-layer activation counts), OUT/profile.json (per-layer
active fraction and the |act| distribution: quantiles and a log-spaced histogram) and, for sampled text,
OUT/calibration.txt.
"""


def profile(
    model: str = typer.Option(..., "-m", "--model", help='GGUF or PWRI file, or "demo" (Gemma 3 270M).'),
    out: Path = typer.Option(..., "-o", "--out", help="Output folder (created if missing)."),
    text: Optional[Path] = typer.Option(None, "--text", help="Calibration text file (UTF-8). Default: text "
                                        "sampled from the model itself."),
    tokens: Optional[int] = typer.Option(None, "--tokens", min=1, help="Profile at most this many tokens "
                                         "[default: the whole text; 1024 when sampling]."),
    ctx: int = typer.Option(512, "--ctx", min=2, help="Tokens per chunk (each chunk starts a fresh context)."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="PNG",
                                        help="Also draw the sorted neuron-frequency curves per layer here."),
    count_sparsity: float = typer.Option(0.5, "--count-sparsity", min=0.0, max=0.99,
                                         help="Non-ReLU models: a neuron counts as active where |act| exceeds "
                                              "this quantile of the layer's |act| (measured on the first batch)."),
    seed: int = typer.Option(0, "--seed", help="Seed for sampling calibration text (no --text)."),
    threads: Optional[int] = O.flag("threads"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Record how often each FFN neuron fires per layer (and the |activation| distribution) over a text."""
    with user_errors(verbose):
        from powerinfer_py import load
        from powerinfer_py.layers.moe import require_dense_ffn
        from powerinfer_py.tools.plot import frequency_plot
        from powerinfer_py.tools.profile import profile_model, write_profile

        content = text.read_text(encoding="utf-8") if text is not None else None
        path = model_path(model)
        t0 = time.perf_counter()
        with load(path, threads=threads, sparse="off") as llm:
            require_dense_ffn(llm.config, "profile")
            if content is None:
                stderr.print(f"no --text: sampling {tokens or 1024} calibration tokens from the model itself "
                             f"(temperature 0.8, seed {seed})")
            result = profile_model(llm, content, tokens, ctx=ctx, count_sparsity=count_sparsity, seed=seed)
        folder = write_profile(out, result)
        s = result.summary
        _print_summary(s, time.perf_counter() - t0)
        sys.stdout.flush()
        if plot is not None:
            frequency_plot([result.profile.fractions(i) for i in range(result.profile.n_layer)], plot,
                           title=f"{s['arch'].upper()} {s['tokens']} TOKENS")
            stderr.print(f"plot: {escape(str(plot))}")
        stderr.print(f"wrote {escape(str(folder))}/activation/activation_0..{s['n_layer'] - 1}.pt and profile.json"
                     + (" and calibration.txt (the sampled text)" if s["source"] == "sampled" else ""))


def _print_summary(s: dict, seconds: float) -> None:
    source = "text sampled from the model" if s["source"] == "sampled" else "the given text"
    print(f"profiled {s['tokens']} tokens of {source} in {seconds:.1f} s: {s['arch']}, FFN {s['ffn_variant']}, "
          f"{s['n_layer']} layers x {s['n_ff']} neurons")
    if s["relu_family"]:
        print(f"active neurons (act != 0): {100 * s['mean_active_fraction']:.1f}% on average")
        print("layer  active%  dead%  hot80%")
        for e in s["layers"]:
            print(f"{e['layer']:5d}  {100 * e['active_fraction']:7.2f}  {100 * e['dead_fraction']:5.1f}  "
                  f"{100 * e['hot_fraction_80']:6.1f}")
    else:
        print(f"non-ReLU FFN: no exact zeros; |act| quantiles per layer (fraction of values below), counts use "
              f"|act| > the {s['count_sparsity']:g} quantile")
        qs = ("0.1", "0.3", "0.5", "0.7", "0.9")
        print("layer  " + "  ".join(f"q{q:<8}" for q in qs) + "  hot80%")
        for e in s["layers"]:
            print(f"{e['layer']:5d}  " + "  ".join(f"{e['abs_quantiles'][q]:<9.3g}" for q in qs)
                  + f"  {100 * e['hot_fraction_80']:6.1f}")
