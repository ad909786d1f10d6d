"""benchmarks/bench_prefill_ab.py: its workers start, take turns and report matching output hashes for one tree
against itself (the timings themselves are not checked: benchmarks, not timed tests)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_prefill_ab.py"


def _run(*args: str) -> str:
    out = subprocess.run([sys.executable, str(SCRIPT), str(ROOT), str(ROOT), *args], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_matmul_turns_same_tree():
    out = _run("--types", "F16,Q8_0", "--shapes", "48x96,33x64", "--threads", "1,2", "--n-tok", "7",
               "--rounds", "2", "--reps", "1", "--pause", "0")
    rows = [line for line in out.splitlines() if re.match(r"(F16|Q8_0) \d+x\d+ [12] ", line)]
    assert len(rows) == 8, out  # 2 types x 2 shapes x 2 thread counts
    for line in rows:
        assert line.endswith("bits: same"), line
        assert re.search(r"\d+\.\d+ -> +\d+\.\d+ \(\d+\.\d{3}x\)", line), line


def test_model_turns_same_tree(tmp_path):
    from powerinfer_py.synth import write_synthetic_model

    path = write_synthetic_model(tmp_path / "tiny.gguf", "llama", dtype="f16")
    out = _run("--model", str(path), "-p", "12", "--rounds", "2", "--pause", "0")
    line = next(line for line in out.splitlines() if line.startswith("prompt 12"))
    assert line.endswith("bits: same"), out


def test_tree_without_extension_is_refused(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), str(ROOT), "--types", "F16", "--shapes",
                          "16x32", "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "holds no built extension" in out.stderr, out.stderr
