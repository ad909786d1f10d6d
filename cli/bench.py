"""`powerinfer bench`: our engine against llama.cpp on the same file (logic in powerinfer_py.tools.bench)."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from powerinfer_py.options import LoadOptions

from . import options as O
from .shell import model_path, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer bench -m demo
  powerinfer bench -m model.gguf -n 64 -p 256 -t 2 -r 5
  powerinfer bench -m model.gguf --json > bench.json
  powerinfer bench -m model.powerinfer.gguf --llamacpp-model model-dense.gguf --sparse predictor -t 2

Each engine runs in its own process per repetition, alternating; the table shows medians.
"""

_MIB = 1024 * 1024


def bench(
    ctx: typer.Context,
    model: str = typer.Option(..., "-m", "--model", help='GGUF file, or "demo" (Gemma 3 270M).'),
    n_predict: int = typer.Option(128, "-n", "--n-predict", min=1, help="Tokens to decode per run."),
    n_prompt: int = typer.Option(128, "-p", "--n-prompt", min=4, help="Prompt tokens per run."),
    threads: Optional[int] = O.flag("threads", help="Threads for both engines (default: every CPU this process may "
                                    "use)."),
    reps: int = typer.Option(3, "-r", "--reps", min=1, help="Repetitions per engine."),
    as_json: bool = typer.Option(False, "--json", help="Print the report (every run and the medians) as JSON."),
    sparse: Optional[str] = O.flag("sparse", help="Our FFN mode (default: predictor for PWRI files, threshold for "
                                   "calibrated files, off for other GGUF files)."),
    sparse_threshold: Optional[float] = O.flag("sparse_threshold",
                                               help="Our predictor threshold (default: the file's)."),
    sparsity: Optional[float] = O.flag("sparsity"),
    predictor_dtype: str = O.flag("predictor_dtype", help="Our predictor's storage (see `powerinfer run --help`)."),
    llamacpp_model: Optional[str] = typer.Option(None, "--llamacpp-model", help="The file llama.cpp runs (default: "
                                                 "MODEL; for a PWRI model, its dense GGUF twin)."),
    backend: str = O.flag("backend", help="Our backend (see `powerinfer run --help`)."),
    vram_budget: Optional[float] = O.flag("vram_budget", help="GiB of GPU memory for our hybrid backend."),
    no_mmap: bool = O.flag("use_mmap", help="Our engine reads the model into memory instead of mapping it (see "
                           "`powerinfer run --help`); llama.cpp keeps its default."),
) -> None:
    """Prompt and decode speed of powerinfer and llama.cpp on the same file, with their ratio and our peak RSS."""
    from powerinfer_py.tools.bench import run_bench

    def progress(r) -> None:
        active = f", active {100 * r.active_fraction:.1f}%" if r.active_fraction is not None else ""
        if r.predictor_share is not None:
            active += f", predictor {100 * r.predictor_share:.1f}% of decode"
        if r.wide_skipped is not None:  # wide mode: the share of projection bytes read, and per input skipped
            from powerinfer_py.layers.wide import INPUTS

            active += " of projection bytes; skipped " + ", ".join(
                f"{n} {100 * v:.1f}%" for n, v in zip(INPUTS, r.wide_skipped))
        stderr.print(f"  {r.engine:>8}: prompt {r.prompt_tok_s:8.1f} tok/s, decode {r.decode_tok_s:7.1f} tok/s, "
                     f"peak RSS {r.peak_rss / _MIB:.0f} MiB{active}", style="dim")

    with user_errors():
        report = run_bench(model_path(model), n_gen=n_predict, n_prompt=n_prompt, reps=reps, on_run=progress,
                           llamacpp_model=model_path(llamacpp_model) if llamacpp_model else None,
                           **O.values(LoadOptions, ctx.params))
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    Console(highlight=False).print(_table(report.summary()))


def _table(s: dict) -> Table:
    t = Table(title=f"{s['model']}: {s['n_prompt']} prompt + {s['n_gen']} decoded tokens, {s['threads']} threads, "
                    f"median of {s['reps']}", title_justify="left")
    for col in ("engine", "prompt tok/s", "decode tok/s", "load s", "peak RSS"):
        t.add_column(col, justify="left" if col == "engine" else "right")
    names = {"ours": "powerinfer", "llamacpp": "llama.cpp"}
    for eng, m in s["engines"].items():
        name = names[eng]
        if eng == "ours" and m.get("sparse"):
            frac, share = m.get("active_fraction"), m.get("predictor_share")
            name += f" ({m['sparse']}" + (f", {100 * frac:.1f}% active" if frac is not None else "")
            name += (f", predictor {100 * share:.1f}% of decode)" if share is not None else ")")
            if m.get("wide_layers") is not None:  # wide mode: "active" is the share of projection bytes read
                name += " per layer skipped % " + " ".join(f"{il}:{100 * v:.0f}" for il, v in enumerate(m["wide_layers"]))
        t.add_row(name, f"{m['prompt_tok_s']:.1f}", f"{m['decode_tok_s']:.1f}", f"{m['load_s']:.2f}",
                  f"{m['peak_rss'] / _MIB:.0f} MiB")
    if s["ratio"]:
        t.add_row("[bold]ratio[/] (ours / llama.cpp)", f"{s['ratio']['prompt_tok_s']:.2f}x",
                  f"{s['ratio']['decode_tok_s']:.2f}x", "", "")
    mem = s["memory"]
    if mem["budget"]:
        verdict = "[green]within[/]" if mem["within_budget"] else "[red]over[/]"
        t.caption = (f"our peak RSS {mem['peak_rss'] / _MIB:.0f} MiB {verdict} the budget "
                     f"{mem['budget'] / _MIB:.0f} MiB (file + KV cache + 200 MiB)")
    for w in s["warnings"]:
        t.caption = (t.caption or "") + f"\nwarning: {w}"
    return t
