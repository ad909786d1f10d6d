"""`powerinfer download` and `powerinfer models`: thin shells over powerinfer_py.tools.hub and
powerinfer_py.tools.catalog.

Register with `app.command("download", epilog=hub_cmds.DOWNLOAD_EPILOG)(hub_cmds.download)` and
`app.command("models")(hub_cmds.models)`."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .shell import stderr, user_errors

DOWNLOAD_EPILOG = """\
[bold]Examples[/]

  powerinfer download PowerInfer/ReluLLaMA-7B-PowerInfer-GGUF
  powerinfer download bamboo-7b --quant q4_0
  powerinfer download PowerInfer/Bamboo-base-v0.1-gguf --local-dir ./bamboo
  powerinfer download SparseLLM/ReluLLaMA-7B --include "*.json" --include "*.safetensors"

Honours HF_TOKEN (gated/private repos), HF_ENDPOINT (mirrors) and HF_HUB_OFFLINE=1 (cache only).
"""

stdout = Console(highlight=False, soft_wrap=True)


def download(
    repo_id: str = typer.Argument(..., metavar="REPO_ID",
                                  help="Hub repository (Org/Name) or a short name from `powerinfer models`."),
    files: Optional[List[str]] = typer.Argument(None, metavar="[FILES]...",
                                                help="Exact files to fetch (default: the model file for --quant "
                                                     "and its activation statistics; a repo without .gguf files "
                                                     "is fetched whole)."),
    include: Optional[List[str]] = typer.Option(None, "--include", metavar="GLOB",
                                                help="Also fetch files matching this glob (repeatable)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit (default: main)."),
    local_dir: Optional[Path] = typer.Option(None, "--local-dir", file_okay=False,
                                             help="Put the files in this folder instead of the HF cache."),
    quant: Optional[str] = typer.Option(None, "--quant", metavar="f16|q4_0",
                                        help="Which quantization of the model file (default: f16 where the "
                                             "repo has it)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Download a model from the Hugging Face Hub into the shared HF cache (or --local-dir) and print where."""
    from powerinfer_py.tools import hub

    with user_errors():
        result = hub.download(repo_id, files or (), include=include or (), revision=revision,
                              local_dir=local_dir, quant=quant, progress=not quiet)
    if result.from_cache:
        stderr.print("offline: served from the local cache, nothing downloaded")
    stdout.print(f"{len(result.files)} files of {escape(result.repo_id)} in {escape(str(result.root))}")
    if result.model_file is not None:
        stdout.print(f"model: {escape(str(result.model_file))}")
        stdout.print(f"run it: powerinfer run -m {escape(result.repo_id)} \"Once upon a time\"", style="dim")


def models() -> None:
    """List the known PowerInfer models (short names for -m) and which are in the local HF cache."""
    from powerinfer_py.tools import catalog, hub

    table = Table(title="PowerInfer models on the Hugging Face Hub", title_justify="left")
    table.add_column("short name", style="bold", no_wrap=True)
    table.add_column("repository", overflow="fold")
    table.add_column("size (GB)", justify="right")
    table.add_column("arch", no_wrap=True)
    table.add_column("what it is")
    table.add_column("cached")
    for e in catalog.CATALOG:
        sizes = ", ".join(f"{q} {gb:g}" for q, gb in e.sizes_gb.items())
        cached = ", ".join(hub.gguf_quant(n) for n in hub.cached_ggufs(e.repo_id)) or "-"
        table.add_row(e.name, e.repo_id, sizes, f"{e.arch} {e.params}", e.description, cached)
    stdout.print(table)
    stdout.print("Use a short name anywhere a model is expected, e.g. -m bamboo-7b:q4_0; "
                 "`powerinfer download NAME` fetches it first.", style="dim")
