"""The `powerinfer` Typer app: one command per module (run.py, info.py, bench.py), registered here."""
from __future__ import annotations

import typer

from . import bench, info, run

app = typer.Typer(
    name="powerinfer",
    help="Run GGUF language models on the CPU with hand-written C kernels, and compare them with llama.cpp.\n\n"
         'MODEL is a .gguf (or PowerInfer .pwri) file; "demo" is Gemma 3 270M from the demo package.',
    epilog='Start with: powerinfer run -m demo "The capital of France is" -n 32',
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # a bug keeps its plain traceback; user errors never reach Typer
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command("run", epilog=run.EPILOG)(run.run)
app.command("info", epilog=info.EPILOG)(info.info)
app.command("bench", epilog=bench.EPILOG)(bench.bench)


if __name__ == "__main__":
    app(prog_name="powerinfer")
