"""Output files, for everything this package writes (GGUF/PWRI files, predictor and profile files, plots, saved
chats): the free space is checked against the output's size before any work is written, and the bytes go to
a temporary file in the target folder that is renamed into place only once complete, so an interrupted or
failed write never leaves a partial file under the target name and an existing target survives. While a
temporary file exists, a SIGTERM or SIGHUP (or a SIGINT whose handler was reset to the default) removes it
before the process ends of that signal as it would have anyway; only SIGKILL can leave one behind."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from .errors import PowerInferError

SPACE_MARGIN = 16 << 20  # bytes kept free beyond the output size (file system metadata, other writers)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: signals whose default action ends the process without running any Python code (SIGINT's usual handler
#: raises KeyboardInterrupt, which the except block below handles)
_FATAL_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, n))
_live: set[str] = set()  # temporary files of the atomic_output blocks now open, in any thread


def check_free_space(path: Path, n_bytes: int, margin: int = SPACE_MARGIN) -> None:
    """Refuse, before anything is written, an output of n_bytes that the folder of `path` cannot hold with
    `margin` bytes to spare."""
    free = shutil.disk_usage(path.parent).free
    if free < n_bytes + margin:
        raise PowerInferError(f"{path}: not enough free disk space in {path.parent}: the output needs "
                              f"{n_bytes / 1e6:.1f} MB, {free / 1e6:.1f} MB are free")


def _remove_and_die(signum: int, frame) -> None:
    """Remove the temporary files being written, then end the process of `signum` with the default action.
    (Raising instead would depend on every frame on the stack letting the exception through: one raised
    inside compile() or a broad `except` would be lost, and the signal with it.)"""
    for tmp in list(_live):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def _removed_on_signal() -> Iterator[None]:
    """While the block runs, the _FATAL_SIGNALS still at their default action go through _remove_and_die; the
    previous handlers come back afterwards. Handlers belong to the main thread: elsewhere this does nothing
    (the temporary files are in _live all the same, for a signal that arrives while the main thread writes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _remove_and_die) for sig in _FATAL_SIGNALS
                if signal.getsignal(sig) == signal.SIG_DFL}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it to `path` if the block completes, else delete it.
    A disk that fills up meanwhile (the free space was checked first, but other writers share the disk)
    becomes a PowerInferError naming the file."""
    path = Path(path)
    with _removed_on_signal():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
        os.close(fd)
        _live.add(tmp)
        try:
            yield Path(tmp)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions of a new file
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError) and e.errno in DISK_FULL:
                raise PowerInferError(f"{path}: the disk holding {path.parent} is full ({e.strerror}); nothing "
                                      "was written, free some space and try again") from e
            raise
        finally:
            _live.discard(tmp)
