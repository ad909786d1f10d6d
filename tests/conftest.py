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


def _reference_llama_cpp_without_amx() -> None:
    """On hosts with AMX (Intel Sapphire Rapids and later) llama.cpp moves Q8_0 / Q4_0 / K-quant weights into its
    AMX buffers, and on a 2-core VM of that kind that path segfaulted in llama_decode (the demo model, an
    8-expert Q8_0 MoE file), killing the whole pytest process. The references only need llama.cpp's arithmetic,
    not its fastest buffers, so there every llama.cpp the tests open, in this process or in a child, loads with
    use_extra_bufts off (llama.cpp's --no-repack: its plain CPU kernels). Elsewhere nothing changes."""
    try:
        import llama_cpp  # noqa: F401  (only: is it installed)
    except ImportError:  # the tests that need it fail on their own import
        return
    from powerinfer_py.tools.bench import LLAMACPP_REPACK_ENV, llamacpp_reports_amx

    if not llamacpp_reports_amx():
        return

    os.environ[LLAMACPP_REPACK_ENV] = "0"  # LlamaCppRef, here and in the CLI children the tests start
    import llama_cpp.llama_cpp as lib  # the module Llama() reads its default model parameters from
    default = lib.llama_model_default_params
    if getattr(default, "_no_extra_bufts", False):
        return

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    params._no_extra_bufts = True
    lib.llama_model_default_params = params


_reference_llama_cpp_without_amx()


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


@pytest.fixture(scope="module")
def pools():
    """CpuKernels with 1, 2 and 3 threads, {n: kernels}, shared by one module's tests: the sparse kernels' thread
    splits (and so their bits) depend on the thread count, so their tests run each count."""
    from powerinfer_py.kernels.cpu import CpuKernels
    ks = {n: CpuKernels(n) for n in (1, 2, 3)}
    yield ks
    for k in ks.values():
        k.close()
