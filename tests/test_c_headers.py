"""Every C header can be read alone: it includes what it uses, so a reader (or a compiler) needs no other file
first, and no code fragment is #included in the middle of a file that defines the names it uses.

Each csrc/*.h is compiled on its own (`gcc -fsyntax-only -include csrc/<name>.h` of an empty file; included
twice, so that its include guard is tested too), for the native ISA and, on x86-64, for an AVX2, an AVX-512 and
an AVX-512 + AMX CPU: the SIMD parts of a header (kquant_simd.h, matmul_iq.h, matmul_iq_tile.h, matmul_k_avx2.h,
matmul_k_amx.h) are compiled
only where the ISA has them, so each of those builds must find what it needs in the header's own includes
(and the SIMD headers must not come out empty there).
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
HEADERS = sorted(p.name for p in CSRC.glob("*.h"))
MARCHES = ["native"] + (["haswell", "skylake-avx512", "sapphirerapids"] if platform.machine().lower() in ("x86_64", "amd64") else [])


def test_the_headers_are_found():
    assert {"pi.h", "quants.h", "kquant_simd.h", "matmul_iq.h", "matmul_iq_tile.h", "matmul_k_avx2.h"} <= set(HEADERS)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to compile with")
@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("header", HEADERS)
def test_header_compiles_alone(header, march):
    # included twice: the first time alone, the second tests its include guard
    run = subprocess.run(["gcc", "-fsyntax-only", "-std=c11", "-fno-strict-aliasing", "-Wall", "-Werror",
                          f"-march={march}", "-I", str(CSRC), "-include", str(CSRC / header),
                          "-include", str(CSRC / header), "-x", "c", "/dev/null"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{header} alone for -march={march}:\n{run.stderr[-4000:]}"


# A SIMD header and, for the ISA it is written for, a name it must define when read alone (it is empty on
# other ISAs, so an include it lacks could otherwise go unseen)
SIMD_HEADERS = {"kquant_simd.h": ("skylake-avx512", "scale_words"), "matmul_iq.h": ("skylake-avx512", "unpack_iq"),
                "matmul_iq_tile.h": ("skylake-avx512", "mk_rows_iq"), "matmul_k_avx2.h": ("haswell", "k2_dot"),
                "matmul_k_amx.h": ("sapphirerapids", "amx_rows")}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to compile with")
@pytest.mark.skipif("skylake-avx512" not in MARCHES, reason="x86-64 ISAs only")
@pytest.mark.parametrize("header", sorted(SIMD_HEADERS))
def test_simd_header_alone_has_its_code(header):
    march, name = SIMD_HEADERS[header]
    run = subprocess.run(["gcc", "-E", "-P", "-std=c11", f"-march={march}", "-I", str(CSRC), "-include",
                          str(CSRC / header), "-x", "c", "/dev/null"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert re.search(rf"\b{name}\s*\(", run.stdout), f"{header} alone for -march={march} does not define {name}"


def _code_lines(text: str) -> list[str]:
    """The lines of a C file with its comments blanked out (line numbers kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [re.sub(r"//.*", "", line) for line in text.splitlines()]


@pytest.mark.parametrize("name", sorted(p.name for p in CSRC.glob("*.[ch]")))
def test_project_includes_come_first(name):
    """A file's own #include "..." lines come before its first line of code: a header included after code
    could lean on the names that code defined (as matmul_k.c's fragments once did)."""
    seen_code, continued = None, False
    for no, line in enumerate(_code_lines((CSRC / name).read_text()), 1):
        s = line.strip()
        was_continued, continued = continued, s.endswith("\\")
        if not s or was_continued:  # a macro's continuation lines belong to its #define
            continue
        if s.startswith("#"):
            if re.match(r'#\s*include\s*"', s):
                assert seen_code is None, f"{name}:{no}: {s} after code at line {seen_code}"
            continue
        seen_code = seen_code or no
