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
