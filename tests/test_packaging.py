"""The package list in pyproject.toml is explicit (cli/ installs as powerinfer_cli), so a new subpackage must
be added there or wheels silently lack it (an editable install would not show the gap)."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "powerinfer_py").rglob("__init__.py")}
    assert found - listed == set(), f"add these to [tool.setuptools] packages in pyproject.toml: {found - listed}"
    assert "powerinfer_cli" in listed


def test_every_listed_package_exists():
    """A moved or merged subpackage must leave the list too (setuptools fails the build on a missing one)."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    dirs = {"powerinfer_cli": ROOT / "cli"}
    missing = [p for p in listed if not (dirs.get(p) or ROOT.joinpath(*p.split("."))).joinpath("__init__.py").is_file()]
    assert missing == [], f"pyproject.toml lists packages that do not exist: {missing}"
