"""Output files, for everything this package writes (GGUF/PWRI files, predictor and profile files, plots, saved
chats): the free space is checked against the output's size before any work is written, and the bytes go to
a temporary file in the target folder that is renamed into place only once complete, so an interrupted or
failed write never leaves a partial file under the target name and an existing target survives."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import PowerInferError

SPACE_MARGIN = 16 << 20  # bytes kept free beyond the output size (file system metadata, other writers)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def check_free_space(path: Path, n_bytes: int, margin: int = SPACE_MARGIN) -> None:
    """Refuse, before anything is written, an output of n_bytes that the folder of `path` cannot hold with
    `margin` bytes to spare."""
    free = shutil.disk_usage(path.parent).free
    if free < n_bytes + margin:
        raise PowerInferError(f"{path}: not enough free disk space in {path.parent}: the output needs "
                              f"{n_bytes / 1e6:.1f} MB, {free / 1e6:.1f} MB are free")


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it to `path` if the block completes, else delete it.
    A disk that fills up meanwhile (the free space was checked first, but other writers share the disk)
    becomes a PowerInferError naming the file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
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
            raise PowerInferError(f"{path}: the disk holding {path.parent} is full ({e.strerror}); nothing was "
                                  "written, free some space and try again") from e
        raise
