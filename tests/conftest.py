"""Shared fixtures: tiny synthetic models written once per session, and the real demo model."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from powerinfer_py.demo import demo_model_path
from powerinfer_py.synth import write_synthetic_model

# A shell without job control starts a background job (`pytest ... &`) with SIGINT ignored, and every process it
# execs inherits that: the Ctrl-C tests' children would never see their SIGINT. Python's own handler here makes
# exec'd children start with the default action again, however the suite was launched.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def real_model() -> Path:
    """Gemma 3 270M (the demo model): $POWERINFER_TEST_MODEL if set, else assembled from the demo package into
    the cache on first use. Never skipped: `make test` installs the package, so a missing model is a failure."""
    override = os.environ.get("POWERINFER_TEST_MODEL")
    return Path(override) if override else demo_model_path()


@pytest.fixture(scope="session")
def synthetic_model(tmp_path_factory):
    """Factory: synthetic_model(arch="llama", dtype="f32", **kw) -> Path of a tiny random GGUF model that
    llama.cpp can load too (see powerinfer_py.synth). Each parameter set is written once per session; the
    file must be treated as read-only."""
    folder = tmp_path_factory.mktemp("synthetic")
    made: dict[tuple, Path] = {}

    def make(arch: str = "llama", dtype: str = "f32", **kw) -> Path:
        key = (arch, dtype, tuple(sorted(kw.items())))
        if key not in made:
            extra = "".join(f"-{k}{v}" for k, v in key[2])
            made[key] = write_synthetic_model(folder / f"{arch}-{dtype}{extra}.gguf", arch, dtype=dtype, **kw)
        return made[key]

    return make


@pytest.fixture(scope="module")
def cpu_kernels():
    """A 2-thread CpuKernels shared by the tests of one module (closed after them)."""
    from powerinfer_py.kernels.cpu import CpuKernels
    k = CpuKernels(n_threads=2)
    yield k
    k.close()
