"""Every package of ``fanout`` is in the distribution: ``pyproject.toml`` lists them by
hand, and an editable install (the tests') imports a missing one anyway, while the README's
``pip install .`` (the demo's) fails on it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_fanout_package_is_listed_in_pyproject() -> None:
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    on_disk = sorted(
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "fanout").rglob("__init__.py")
    )
    assert sorted(listed) == on_disk
