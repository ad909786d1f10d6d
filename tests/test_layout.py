"""The layout rules of issue 34, held by reading the source (ast; nothing is imported):

- no import cycles in powerinfer_py/ and cli/, counting every import, the ones inside functions too (a
  function-level import only postpones a cycle; `if TYPE_CHECKING:` blocks do not run and are skipped);
- the runtime (powerinfer_py/ but synth/, tools/ and convert/) never imports powerinfer_py.synth or
  powerinfer_py.tools, and inside the package only synth/ imports synth/ (cli/, tests/ and benchmarks/ may);
- the top level of powerinfer_py/ stays small: at most 16 modules besides __init__.py, 20 entries in all
  (.py files and subpackages; build outputs such as _pi*.so are not counted).

Edges of the import graph: `import a.b` and `from a import b` (b a submodule) go to a.b itself; `from a.b
import name` goes to a.b. An import from outside a package also runs that package's __init__ first, so it is an
edge to the __init__ too (`from ..models.base import x` in layers/ runs models/__init__.py, which imports every
model); from inside the package it is not (that __init__ has already started).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"powerinfer_py": ROOT / "powerinfer_py", "powerinfer_cli": ROOT / "cli"}
MAX_TOP_MODULES = 16  # .py files at powerinfer_py/'s top level besides __init__.py
MAX_TOP_ENTRIES = 20  # .py files (with __init__.py) and subpackages
NOT_RUNTIME = ("powerinfer_py.synth", "powerinfer_py.tools", "powerinfer_py.convert")


def find_modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted name -> file of every module under the package roots (a package is its __init__.py)."""
    out = {}
    for name, root in packages.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((name, *parts))] = path
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, except under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _type_checking(child):
            for node in child.orelse:
                yield from _imports(ast.Module(body=[node], type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _imports(child)


def _targets(node, module: str, is_package: bool, modules) -> list[str]:
    """The modules one import statement names (resolved to submodules where a name is one)."""
    def known(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    if isinstance(node, ast.Import):
        return [t for t in (known(a.name) for a in node.names) if t]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        full = ".".join(base + ([node.module] if node.module else []))
    else:
        full = node.module or ""
    out = []
    for a in node.names:
        sub = f"{full}.{a.name}"
        target = sub if sub in modules else known(full)
        if target:
            out.append(target)
    return out


def import_graph(packages: dict[str, Path] = PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import}, for the modules under `packages`."""
    modules = find_modules(packages)
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _imports(tree):
            for target in _targets(node, module, path.name == "__init__.py", modules):
                parts = target.split(".")
                # the target's packages whose __init__ this import runs: those the importer is not inside
                inits = [".".join(parts[:i]) for i in range(2, len(parts))]
                for t in [target] + [p for p in inits if not (module == p or module.startswith(p + "."))]:
                    if t != module:
                        graph[module].setdefault(t, node.lineno)
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a closed path of modules) per strongly connected component of more than one module."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []

    def visit(v):  # Tarjan; the graph has a few hundred nodes, recursion depth stays small
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:  # shortest way back from the component's first module to itself, inside the component
        start = min(comp)
        prev, frontier = {start: None}, [start]
        while frontier and start not in [w for v in frontier for w in graph[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in comp and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        path = [last]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        cycles.append(path[::-1] + [start])
    return cycles


@functools.lru_cache(maxsize=None)
def repo_graph() -> dict[str, dict[str, int]]:
    return import_graph(PACKAGES)


def _describe(cycle: list[str], graph) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_no_import_cycles():
    graph = repo_graph()
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles (break each one; a function-level import does not):\n" + "\n".join(
        _describe(c, graph) for c in cycles)


def test_the_cycle_finder_sees_function_level_imports_and_skips_type_checking(tmp_path):
    """The checker itself, on a small tree: a cycle held open by an import inside a function is found, one
    through `if TYPE_CHECKING:` is not, `from pkg import sub` resolves to the submodule, and an import from
    outside a package runs its __init__."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import y\n")
    (pkg / "d.py").write_text("from pkg import c\n")
    (pkg / "sub" / "__init__.py").write_text("from . import m\n")
    (pkg / "sub" / "m.py").write_text("from ..e import z\n")
    (pkg / "e.py").write_text("from .sub.n import w\n")
    (pkg / "sub" / "n.py").write_text("")
    graph = import_graph({"pkg": pkg})
    assert graph["pkg.c"] == {} and graph["pkg.d"] == {"pkg.c": 1}
    assert graph["pkg.e"] == {"pkg.sub.n": 1, "pkg.sub": 1}  # pkg/sub/__init__.py runs first
    assert graph["pkg.sub.m"] == {"pkg.e": 1}
    assert {tuple(c) for c in find_cycles(graph)} == {("pkg.a", "pkg.b", "pkg.a"),
                                                      ("pkg.e", "pkg.sub", "pkg.sub.m", "pkg.e")}


def _importers_of(graph, prefixes: tuple[str, ...]) -> dict[str, list[str]]:
    out = {}
    for module, targets in graph.items():
        hits = sorted(t for t in targets if t.startswith(prefixes))
        if hits:
            out[module] = hits
    return out


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_runtime_never_imports_synth_or_tools():
    """Test-model writers and offline tools stay out of what `load` and `generate` run."""
    graph = {m: t for m, t in repo_graph().items() if m.startswith("powerinfer_py") and not _in(m, NOT_RUNTIME)}
    bad = _importers_of(graph, ("powerinfer_py.synth", "powerinfer_py.tools"))
    assert bad == {}, f"runtime modules importing synth/ or tools/: {bad}"


def test_synth_is_imported_only_by_synth_inside_the_package():
    """Inside powerinfer_py only synth/ itself imports synth/ (cli/, tests/ and benchmarks/ may)."""
    graph = {m: t for m, t in repo_graph().items()
             if m.startswith("powerinfer_py") and not _in(m, ("powerinfer_py.synth",))}
    bad = _importers_of(graph, ("powerinfer_py.synth",))
    assert bad == {}, f"modules outside synth/ importing it: {bad}"


def test_top_level_stays_small():
    top = ROOT / "powerinfer_py"
    modules = sorted(p.name for p in top.glob("*.py"))
    packages = sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file())
    besides_init = [m for m in modules if m != "__init__.py"]
    assert len(besides_init) <= MAX_TOP_MODULES, (
        f"{len(besides_init)} modules at the top of powerinfer_py/ (at most {MAX_TOP_MODULES}): {besides_init}; "
        f"put the new one in the subpackage of its concept")
    assert len(modules) + len(packages) <= MAX_TOP_ENTRIES, (
        f"{len(modules) + len(packages)} entries at the top of powerinfer_py/ (at most {MAX_TOP_ENTRIES}): "
        f"{modules + packages}")
