"""`powerinfer synth` (hidden): write a synthetic sparse ReLU LLaMA (PWRI) and optionally its dense twin (GGUF),
for benchmarks and tests of the sparse engine. A thin shell over powerinfer_py.synth.sparse.write_sparse_model.

Register with `app.command("synth", hidden=True, epilog=synth_cmd.EPILOG)(synth_cmd.synth)`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .shell import fail, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer synth /tmp/relu7b-8l.q4_0.pwri --layers 8 --dtype q4_0 --dense /tmp/relu7b-8l.q4_0.gguf
  powerinfer synth /tmp/tiny.pwri --shape tiny --layers 2 --dtype f16 --active 0.05 --recall 0.95

The dense twin holds the same weights as a standard GGUF (ffn_down instead of ffn_down_t, no predictor) for
llama.cpp; llama.cpp applies SiLU where the model means ReLU, so the twin is a speed reference for it.
"""


def synth(
    out: Path = typer.Argument(..., metavar="OUT", help="Output PowerInfer file (.pwri / .gguf)."),
    layers: int = typer.Option(8, "--layers", "-l", min=1, help="Number of layers."),
    dtype: str = typer.Option("q4_0", "--dtype", help="f32, f16, q8_0 or q4_0 (2-D weights)."),
    dense: Optional[Path] = typer.Option(None, "--dense", metavar="OUT_DENSE",
                                         help="Also write the dense twin (standard GGUF) here."),
    active: float = typer.Option(0.10, "--active", help="Mean fraction of active FFN neurons."),
    recall: float = typer.Option(0.90, "--recall", help="Predictor recall the threshold is calibrated for."),
    rank: Optional[int] = typer.Option(None, "--rank", min=4, help="Predictor rank [default: the shape's]."),
    shape: str = typer.Option("7b", "--shape", help="7b (d 4096, n_ff 11008, 32 heads, vocab 32000, rank 1024) "
                                                    "or tiny (d 128, n_ff 512, 4 heads, vocab 512, rank 64)."),
    n_embd: Optional[int] = typer.Option(None, "--n-embd", min=32, help="Override the shape's n_embd."),
    n_ff: Optional[int] = typer.Option(None, "--n-ff", min=32, help="Override the shape's n_ff."),
    n_head: Optional[int] = typer.Option(None, "--n-head", min=1, help="Override the shape's head count."),
    n_head_kv: Optional[int] = typer.Option(None, "--n-head-kv", min=1, help="KV heads [default: n_head]."),
    power: float = typer.Option(1.0, "--power", min=0.0, help="Exponent of the per-neuron firing law."),
    noise: float = typer.Option(0.35, "--noise", min=0.0,
                                help="Part of the gate the predictor cannot see (more: lower precision)."),
    seed: int = typer.Option(0, "--seed", help="Random seed (the output is a function of all options)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Write a synthetic sparse ReLU LLaMA with predictors (and its dense twin) with real, data-dependent sparsity."""
    from powerinfer_py.synth import sparse as synth_sparse

    if shape not in synth_sparse.SHAPES:
        raise fail(f"unknown shape {shape!r}; one of {', '.join(synth_sparse.SHAPES)}")
    dims = dict(synth_sparse.SHAPES[shape])
    overrides = dict(n_embd=n_embd, n_ff=n_ff, n_head=n_head, rank=rank)
    dims.update({k: v for k, v in overrides.items() if v is not None})
    t0 = time.perf_counter()
    with user_errors(verbose), Progress(TextColumn("{task.description}"), BarColumn(),
                                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                        console=stderr, transient=True) as bar:
        task = bar.add_task("writing", total=None)

        def progress(name: str, i: int, n: int) -> None:
            bar.update(task, total=n, completed=i, description=f"{name:<12}")

        try:
            path, dense_path = synth_sparse.write_sparse_model(
                out, n_layer=layers, dtype=dtype.lower(), dense_path=dense, mean_active=active, recall=recall,
                power=power, noise=noise, n_head_kv=n_head_kv, seed=seed, force=force, progress=progress, **dims)
        except ValueError as e:
            raise fail(str(e)) from None
    dt = time.perf_counter() - t0
    for p in (path, dense_path):
        if p is not None:
            stderr.print(f"wrote {escape(str(p))} ({p.stat().st_size / 1e6:.1f} MB)")
    info = synth_sparse.synth_info(path)
    stderr.print(f"in {dt:.1f} s; on {info['sample_tokens']} sample tokens: active {info['measured_active']:.2%}, "
                 f"predicted active {info['measured_predicted']:.2%}, recall {info['measured_recall']:.3f} "
                 f"(threshold {info['threshold']:.4f})")
