"""The kernels' other instruction-set paths, built and tested on this machine.

The extension is built with -march=native, so one test run exercises only one of each kernel's AVX-512, AVX2
and scalar paths: an AVX-512 development or CI host never runs the AVX2 code that most consumer CPUs take,
and no host runs the scalar fallback. Here the extension is built again into a copy of the source tree for
each other path this CPU can execute (scalar always: PI_NATIVE=0; AVX2 too where the native build is AVX-512:
PI_MARCH=haswell), and the kernel test modules run against that copy in a child process. The AVX-512 path can
only be tested on a machine that has it (the native build there); elsewhere each C file is at least compiled for
two AVX-512 CPUs, so that an edit cannot break an AVX-512 host's build unseen.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL_TESTS = ("tests/test_kernels_matmul.py", "tests/test_kernels_sparse.py", "tests/test_kernels_ops.py",
                "tests/test_kernels_iq.py", "tests/test_kernels_iq_tile.py", "tests/test_kernels_delta.py",
                "tests/test_kernels_ssm_scan.py", "tests/test_sparse_ffn_fused.py", "tests/test_fc2_qt.py")
AVX2_FLAGS = {"avx2", "fma", "f16c", "bmi2", "movbe", "popcnt"}  # what gcc's -march=haswell assumes
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512vl"}                 # what the kernels' AVX-512 paths need


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def other_builds() -> list:
    flags = cpu_flags()
    builds = [pytest.param({"PI_NATIVE": "0"}, id="scalar")]
    if AVX512_FLAGS <= flags and AVX2_FLAGS <= flags:  # native is AVX-512: the AVX2 paths need their own build
        builds.append(pytest.param({"PI_MARCH": "haswell"}, id="avx2"))
    return builds


@pytest.mark.slow
@pytest.mark.parametrize("build_env", other_builds())
def test_kernel_tests_pass_on_another_isa_build(tmp_path, build_env):
    skip = shutil.ignore_patterns("_pi.*", "__pycache__", ".pytest_cache", "*.gguf", "libpi_cuda.so")
    for name in ("csrc", "powerinfer_py", "tests", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=skip)
    env = {k: v for k, v in os.environ.items() if k not in ("PI_NATIVE", "PI_MARCH")} | build_env
    build = subprocess.run([sys.executable, "csrc/build_ffi.py"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=1200)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-4000:]
    # the child processes must import the copy, not the installed package
    where = subprocess.run([sys.executable, "-c", "import powerinfer_py._pi as m; print(m.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert Path(where.stdout.strip()).resolve().is_relative_to(tmp_path.resolve()), where.stdout + where.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *KERNEL_TESTS],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]


def native_is_avx512() -> bool:
    return AVX512_FLAGS <= cpu_flags()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to compile with")
@pytest.mark.skipif(native_is_avx512(), reason="the native build compiles (and the tests run) the AVX-512 paths")
@pytest.mark.parametrize("march", ["skylake-avx512", "icelake-server"])  # AVX-512 F/BW/VL; then with VNNI
def test_avx512_paths_compile(march):
    """Where the CPU has no AVX-512, nothing here builds those paths (the native build leaves them out), so an
    edit could break the build of an AVX-512 host unseen: each C file is compiled for such a CPU (no linking, no
    running: what they compute is tested only on a machine that has AVX-512)."""
    for src in sorted((ROOT / "csrc").glob("*.c")):
        run = subprocess.run(["gcc", "-fsyntax-only", "-std=c11", "-fno-strict-aliasing", "-Wall",
                              "-Werror=implicit-function-declaration", "-Werror=incompatible-pointer-types",
                              f"-march={march}", "-I", str(ROOT / "csrc"), str(src)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{src.name} for -march={march}:\n{run.stderr[-4000:]}"
