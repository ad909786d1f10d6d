"""One architecture, one module: every supported arch is found by name in models/ and described by its ArchSpec,
and no code outside models/, synth, convert/ and tests/ tests an architecture's name (it reads a spec field).

The list of supported archs is derived (models.supported_archs: the specs of the modules of models/); these
tests hold that the derivation, the dispatch (models.module_for + ALIASES) and the error messages agree.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from powerinfer_py import models
from powerinfer_py.errors import UnsupportedError
from powerinfer_py.gguf import open_gguf
from powerinfer_py.gguf.writer import write_gguf
from powerinfer_py.tools.info import model_info
from powerinfer_py.models import ALIASES, find_spec, module_for, read_config, supported_archs
from powerinfer_py.models.spec import ArchSpec

ROOT = Path(__file__).resolve().parent.parent
# where architecture names belong: the arch modules, the test-model writers, the HF converter, the tests
ARCH_DIRS = ("powerinfer_py/models/", "powerinfer_py/synth", "powerinfer_py/convert/", "tests/")
# sites outside ARCH_DIRS that may still name an arch, with the reason; keep it empty (or shrinking)
ALLOWED: dict[tuple[str, int], str] = {
    # keyed by tokenizer.ggml.model values (kinds of tokenizer), which happen to share names with archs
    ("powerinfer_py/tokenizer.py", 95): "TOKENIZER_MODELS: tokenizer kinds, not architectures",
}


def _specs_of(mod) -> list[ArchSpec]:
    return [s for s in (getattr(mod, "SPEC", None), *getattr(mod, "VARIANTS", ())) if s is not None]


def test_every_supported_arch_resolves_to_its_module_and_spec():
    archs = supported_archs()
    assert len(archs) == len(set(archs)) >= 55
    for arch in archs:
        mod = module_for(arch)
        spec = find_spec(arch)
        assert mod is not None and spec is not None and spec.name == arch, arch
        assert spec in _specs_of(mod), f"{arch}: its spec is not in {mod.__name__}'s SPEC / VARIANTS"
        assert spec.model is not None and spec.expected is not None, arch
        if spec.text_of:  # a vision-language file's text model: runs as an arch of the same module
            assert find_spec(spec.text_of).model is spec.model, arch


def test_module_stems_are_gguf_names_or_one_alias():
    """models/<arch>.py is the arch's module ("-" written "_"); ALIASES names the shared ones, and every alias
    points at a module that runs the arch. No spec sits where dispatch cannot find it."""
    for alias, stem in ALIASES.items():
        assert alias in supported_archs() and module_for(alias).__name__ == f"powerinfer_py.models.{stem}"
    found = []
    for info in pkgutil.iter_modules(models.__path__):
        mod = importlib.import_module(f"powerinfer_py.models.{info.name}")
        for spec in _specs_of(mod):
            assert find_spec(spec.name) is spec, f"{spec.name} in {info.name} is not reached by module_for"
            found.append(spec.name)
        if getattr(mod, "SPEC", None) is not None:  # a module's own spec is the arch it is named after
            assert mod.SPEC.name.replace("-", "_") == info.name, info.name
    assert sorted(found) == sorted(supported_archs())


@pytest.mark.parametrize("name", ["nosucharch", "base", "spec", "ln_decoder", "__init__", "gemma2.x", "../config", ""])
def test_unknown_arch_error_lists_the_supported_ones(tmp_path, name):
    """Not an arch: a helper module's name, a module running other archs only, odd strings. The error (and
    `powerinfer info`'s problem line) lists exactly supported_archs()."""
    path = write_gguf(tmp_path / "u.gguf", {"general.architecture": name}, [])
    with pytest.raises(UnsupportedError) as exc:
        read_config(open_gguf(path))
    message = str(exc.value)
    assert f"architecture {name!r} is not supported" in message
    assert message.split("supported: ", 1)[1].split(", ") == list(supported_archs())
    assert model_info(path)["problem"] == message


def test_spec_for_refuses_what_no_model_runs():
    with pytest.raises(UnsupportedError, match=r"no model for architecture 'qwen3vl'; runnable: .*qwen3moe"):
        models.spec_for("qwen3vl")  # a file's name only: its config runs as qwen3
    assert "qwen3vl" not in models.archs_with(lambda s: True)


def _arch_like(node: ast.AST) -> bool:
    """An expression that holds an architecture name: arch, config.arch, c["arch"], self.key_arch, ..."""
    return re.search(r"arch", ast.unparse(node)) is not None


def _literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _literals(e)]
    return []


def arch_name_sites(root: Path, archs) -> list[tuple[str, int, str]]:
    """(file, line, what) of each place outside ARCH_DIRS that tests an arch name: a comparison of an arch-like
    value with arch-name literals, a startswith/endswith of one, or a table (dict keys, or a tuple/list/set
    bound to a name) of two or more arch names."""
    names = set(archs)
    sites = []
    for path in sorted([*root.glob("powerinfer_py/**/*.py"), *root.glob("cli/**/*.py")]):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(ARCH_DIRS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                hits = [s for p in parts for s in _literals(p) if s in names]
                if hits and any(_arch_like(p) for p in parts if not _literals(p)):
                    sites.append((rel, node.lineno, f"compares {', '.join(hits)}"))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("startswith", "endswith") and _arch_like(node.func.value)
                  and any(s in names for a in node.args for s in _literals(a))):
                sites.append((rel, node.lineno, f"{node.func.attr} of an arch name"))
            elif isinstance(node, ast.Dict):
                keys = [s for k in node.keys if k is not None for s in _literals(k) if s in names]
                if len(keys) >= 2:
                    sites.append((rel, node.lineno, f"table keyed by {', '.join(keys[:3])}, ..."))
            elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List, ast.Set)):
                listed = [s for s in _literals(node.value) if s in names]
                if len(listed) >= 2:
                    sites.append((rel, node.lineno, f"list of {', '.join(listed[:3])}, ..."))
    return sites


def test_no_arch_names_outside_the_arch_modules():
    sites = [s for s in arch_name_sites(ROOT, supported_archs()) if s[:2] not in ALLOWED]
    assert sites == [], "read an ArchSpec field instead of testing the arch name:\n" + "\n".join(map(str, sites))


def test_the_scan_finds_what_it_is_for(tmp_path):
    """The scan itself: each kind of site in a module outside the arch dirs is found, a chat format or a
    single data field is not."""
    (tmp_path / "powerinfer_py").mkdir()
    (tmp_path / "powerinfer_py" / "m.py").write_text(
        'def f(config, c, hint):\n'
        '    if config.arch == "gemma2" or c["arch"] in ("qwen2", "llama"):\n'
        '        return c["arch"].startswith("granite")\n'
        '    return hint == "gemma"\n'
        'TABLE = {"phi3": 1, "opt": 2}\n'
        'NAMES = ("falcon", "bamboo")\n'
        'ONE = "llama"\n')
    found = sorted((line, what.split()[0]) for _, line, what in arch_name_sites(tmp_path, supported_archs()))
    assert found == [(2, "compares"), (2, "compares"), (3, "startswith"), (5, "table"), (6, "list")]
