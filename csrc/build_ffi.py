"""cffi build script: compiles every csrc/*.c into the extension `powerinfer_py._pi` (API mode, out of line).

pi.h is the whole boundary: its preprocessor lines are dropped and the rest is handed to cdef().
SIMD: by default the kernels are built for the build machine (-march=native) and pick AVX-512/AVX2 paths
with #if; every kernel has a scalar fallback. PI_NATIVE=0 builds a portable, scalar-only extension;
PI_MARCH=CPU builds for another CPU than this one (`PI_MARCH=haswell`: the AVX2 paths, to test them on an
AVX-512 machine).
"""
import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


def _cdef_text() -> str:
    lines = (HERE / "pi.h").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def _compile_args() -> list[str]:
    args = ["-O3", "-std=c11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function", "-pthread"]
    if os.environ.get("PI_NATIVE", "1") != "0":
        args.append(f"-march={os.environ.get('PI_MARCH') or 'native'}")
    if os.environ.get("PI_ASAN") == "1":
        args += ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
    return args


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "powerinfer_py._pi",
    '#include "pi.h"',
    sources=sorted(str(p.relative_to(HERE.parent)) for p in HERE.glob("*.c")),
    include_dirs=[str(HERE)],
    extra_compile_args=_compile_args(),
    extra_link_args=["-pthread"] + (["-fsanitize=address"] if os.environ.get("PI_ASAN") == "1" else []),
)

if __name__ == "__main__":
    # Development build in place: `python csrc/build_ffi.py` writes powerinfer_py/_pi*.so in the source tree.
    os.chdir(HERE.parent)
    built = Path(ffibuilder.compile(tmpdir=".", verbose=False)).resolve()
    # pip's build names the module _pi.abi3.so, this one _pi.<python tag>.so: keep one, so that the module
    # Python imports is always the one just built
    for other in (HERE.parent / "powerinfer_py").glob("_pi.*.so"):
        if other.resolve() != built:
            other.unlink()
