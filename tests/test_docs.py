"""The documentation stays true to the repository: the README's size, the .md files the code cites, the links
between the docs, and the commands the docs show.

No network, no model: these read files and the CLI's command table only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CODE_DIRS = ("powerinfer_py", "cli", "csrc", "tests", "benchmarks")
CODE_SUFFIXES = {".py", ".c", ".h", ".cu", ".cuh"}
SELF = Path(__file__).resolve()  # names bare .md files on purpose, to test the helpers
README_MAX_LINES = 250

MD_NAME = re.compile(r"(?<![\w./-])[\w][\w./-]*\.md\b")  # a path ending in .md (not a glob such as docs/*.md)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
COMMAND = re.compile(r"(?:^|[\s|;&(`])powerinfer\s+([a-z][\w-]*)")


def code_files():
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p.resolve() != SELF:
                yield p


def md_names(text: str) -> set[str]:
    return set(MD_NAME.findall(text))


def resolves(name: str, where: Path) -> bool:
    """A cited .md path exists relative to the repository root or to the citing file's folder."""
    return (ROOT / name).is_file() or (where.parent / name).is_file()


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def shown_commands(text: str) -> list[str]:
    """The subcommand of every `powerinfer <command>` inside a fenced block or an inline code span."""
    spans = FENCE.findall(text) + INLINE.findall(FENCE.sub("", text))
    return [m for span in spans for m in COMMAND.findall(span)]


def cli_commands() -> set[str]:
    from powerinfer_cli.main import app

    names = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    assert names, "the CLI registers no commands"
    return names


# ---- the checks ------------------------------------------------------------------------------------------------

def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; at most {README_MAX_LINES} (the rest goes to docs/)"


def test_docs_folder_has_the_topics():
    names = {p.name for p in DOCS}
    for topic in ("FORMATS.md", "DESIGN.md", "models.md", "usage.md", "internals.md", "performance.md",
                  "sparse.md", "testing.md"):
        assert topic in names, f"docs/{topic} is missing"


def test_every_md_file_named_in_code_exists():
    missing = []
    for p in code_files():
        text = p.read_text(encoding="utf-8", errors="replace")
        for name in md_names(text):
            if not resolves(name, p):
                missing.append(f"{p.relative_to(ROOT)}: {name}")
    assert not missing, "code cites .md files that are not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", [README] + DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc):
    bad = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...: not a file of ours
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.is_file():
            bad.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            bad.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)} has broken links:\n" + "\n".join(bad)


def test_readme_points_into_docs():
    linked = {t.partition("#")[0] for t in LINK.findall(README.read_text(encoding="utf-8"))}
    unlinked = [p.name for p in DOCS if f"docs/{p.name}" not in linked]
    assert not unlinked, f"README.md links none of: {', '.join(unlinked)}"


@pytest.mark.parametrize("doc", [README] + DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shown_commands_exist(doc):
    known = cli_commands()
    shown = shown_commands(doc.read_text(encoding="utf-8"))
    unknown = sorted(set(shown) - known)
    assert not unknown, (f"{doc.relative_to(ROOT)} shows `powerinfer` commands the CLI does not have: "
                         f"{', '.join(unknown)} (known: {', '.join(sorted(known))})")


def test_readme_shows_the_main_commands():
    shown = set(shown_commands(README.read_text(encoding="utf-8")))
    for cmd in ("run", "chat", "serve", "download", "convert"):
        assert cmd in shown, f"README.md shows no `powerinfer {cmd}` example"


# ---- the helpers above can fail ------------------------------------------------------------------------------

def test_helpers_catch_what_they_should(tmp_path):
    assert md_names("see FORMATS.md section 2 and docs/DESIGN.md; docs/*.md is a glob") == {"FORMATS.md",
                                                                                          "docs/DESIGN.md"}
    assert not resolves("FORMATS.md", ROOT / "powerinfer_py" / "ffn.py")
    assert resolves("docs/FORMATS.md", ROOT / "powerinfer_py" / "ffn.py")
    assert slug("place: hot neurons for a GPU") == "place-hot-neurons-for-a-gpu"
    assert slug("Hybrid CPU/GPU execution") == "hybrid-cpugpu-execution"
    text = "prose powerinfer runs\n```bash\npowerinfer run -m demo\necho x | powerinfer nosuch\n```\n`powerinfer info demo`"
    assert shown_commands(text) == ["run", "nosuch", "info"]
