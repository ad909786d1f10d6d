"""`powerinfer convert` and `powerinfer quantize`: thin shells over powerinfer_py.convert.

Register with `app.command("convert", epilog=convert_cmds.CONVERT_EPILOG)(convert_cmds.convert)` and
`app.command("quantize", epilog=convert_cmds.QUANTIZE_EPILOG)(convert_cmds.quantize)`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .shell import stderr, user_errors

CONVERT_EPILOG = """\
[bold]Examples[/]

  powerinfer convert ./ReluLLaMA-7B --predictor ./ReluLLaMA-7B-Predictor -o relu-7b.powerinfer.gguf
  powerinfer convert SparseLLM/ReluLLaMA-7B --predictor PowerInfer/ReluLLaMA-7B-Predictor -o relu-7b.gguf --outtype q4_0
  powerinfer convert ./Mistral-7B -o mistral-7b.q8_0.gguf --outtype q8_0

With --predictor the output is a PowerInfer (PWRI) file; without, a standard GGUF that llama.cpp loads.
"""

QUANTIZE_EPILOG = """\
[bold]Examples[/]

  powerinfer quantize relu-7b.powerinfer.gguf relu-7b.q4_0.powerinfer.gguf q4_0
  powerinfer quantize model-f32.gguf model-f16.gguf f16 --force
"""


def _folder(text: str, what: str) -> Path:
    """A local folder, or a Hub repo id fetched (whole) into the Hugging Face cache."""
    path = Path(text).expanduser()
    if path.exists():
        return path
    from powerinfer_py.tools import hub

    if hub.is_repo_id(text):
        stderr.print(f"fetching {what} {escape(text)} from the Hub")
        return hub.download(text).root
    return path  # the converter reports the missing folder


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=stderr, transient=True,
                    disable=not stderr.is_terminal)  # piped or logged: no bar, no stray blank line


def _run(fn, src_bytes: int | None, **kwargs) -> None:
    """Call fn(**kwargs, progress=...) under a progress bar; print what was written and how fast."""
    t0 = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task("writing", total=None)

        def progress(name: str, i: int, n: int) -> None:
            bar.update(task, total=n, completed=i, description=f"{name:<28}")

        path = fn(progress=progress, **kwargs)
    dt = time.perf_counter() - t0
    size = path.stat().st_size
    rate = f", {src_bytes / dt / 1e6:.0f} MB/s of input" if src_bytes else ""
    stderr.print(f"wrote {escape(str(path))} ({size / 1e6:.1f} MB) in {dt:.1f} s{rate}")


def convert(
    hf_dir: str = typer.Argument(..., metavar="HF_DIR",
                                 help="Hugging Face checkpoint folder (config.json, weights, tokenizer) or repo id."),
    output: Path = typer.Option(..., "-o", "--output", help="Output file (.gguf)."),
    predictor: Optional[str] = typer.Option(None, "--predictor", metavar="DIR_OR_REPO",
                                            help="PowerInfer predictor folder (model_N.pt) or repo id: "
                                                 "writes a sparse PWRI file."),
    outtype: str = typer.Option("f16", "--outtype", help="f32, f16, bf16, q8_0 or q4_0 (2-D weights)."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", min=1, help="Encoding threads."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Convert an original checkpoint (+ predictor) into a GGUF or PowerInfer file, tensor by tensor."""
    from powerinfer_py.convert import Checkpoint
    from powerinfer_py.convert import convert as do_convert

    with user_errors(verbose):
        folder = _folder(hf_dir, "checkpoint")
        pred = _folder(predictor, "predictor") if predictor else None
        src_bytes = Checkpoint(folder).nbytes if folder.is_dir() else None
        _run(do_convert, src_bytes, hf_dir=folder, out=output, predictor=pred, outtype=outtype.lower(),
             force=force, n_threads=threads)


def quantize(
    src: Path = typer.Argument(..., metavar="IN", help="GGUF or PWRI file."),
    out: Path = typer.Argument(..., metavar="OUT", help="Output file."),
    qtype: str = typer.Argument(..., metavar="TYPE", help="f16, q8_0 or q4_0."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", min=1, help="Encoding threads."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks."),
) -> None:
    """Re-encode the weights of a GGUF or PWRI file (keeps the magic, metadata and predictor)."""
    from powerinfer_py.convert import quantize as do_quantize

    with user_errors(verbose):
        _run(do_quantize, src.stat().st_size if src.is_file() else None, src=src, out=out,
             outtype=qtype.lower(), force=force, n_threads=threads)
