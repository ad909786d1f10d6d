"""What every command shares: the stderr console and the error boundary that turns a PowerInferError (or a
file the OS cannot open, a full disk, a read-only file system) into one `error: <message>` line and exit
code 1, without a traceback."""
from __future__ import annotations

import contextlib
import errno
import sys
import traceback
from pathlib import Path
from typing import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from powerinfer_py.kernels.cpus import usable_cpus
from powerinfer_py.errors import PowerInferError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
#: OS errors that describe the user's machine, not a bug: a full disk or quota, a read-only file system
USER_OS_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str) -> typer.Exit:
    """Print `error: message` on stderr; return the Exit to raise."""
    sys.stdout.flush()
    stderr.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(EXIT_ERROR)


@contextlib.contextmanager
def user_errors(verbose: bool = False) -> Iterator[None]:
    """Errors the user can fix become a one-line message; anything else is a bug and keeps its traceback."""
    try:
        yield
    except PowerInferError as e:
        if verbose:
            traceback.print_exc(file=sys.stderr)
        raise fail(str(e)) from None
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None
    except OSError as e:
        if e.errno not in USER_OS_ERRORS:
            raise
        if verbose:
            traceback.print_exc(file=sys.stderr)
        raise fail(f"{e.strerror}: {e.filename}" if e.filename else f"{e.strerror or e}") from None
    except ImportError as e:  # an incomplete installation (C kernels not built, llama-cpp-python missing)
        if verbose:
            traceback.print_exc(file=sys.stderr)
        raise fail(str(e)) from None


def model_path(name: str) -> Path:
    """The -m/MODEL argument as a file path: a path, "demo" (Gemma 3 270M), a short name from
    `powerinfer models`, or a Hugging Face repo id (from the cache, downloaded if needed)."""
    from powerinfer_py.tools.hub import resolve_model

    return resolve_model(name)


def print_load_notes(llm, verbose: bool = False) -> None:
    """After loading: where the model runs when it is not where it was asked to (always; with verbose, in any
    case), a context longer than the model was trained for, and more threads than CPUs."""
    if llm.backend is not None and (verbose or llm.backend.warn):
        stderr.print(llm.backend.lines()[0], style="dim" if not llm.backend.warn else "yellow")
    if llm.context_note:
        stderr.print(f"warning: {llm.context_note}", style="yellow")
    n_cpu, n_threads = usable_cpus(), llm.kernels.n_threads  # kernels.Ops: both kernels classes have it
    if n_threads > n_cpu:
        cpus = "1 CPU" if n_cpu == 1 else f"{n_cpu} CPUs"
        stderr.print(f"warning: {n_threads} threads on {cpus}: the threads wait for each other; "
                     f"-t {n_cpu} or fewer runs faster", style="yellow")
