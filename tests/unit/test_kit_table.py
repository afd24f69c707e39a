"""The README's table of the conformance kit's checks names every check of the kit."""

from __future__ import annotations

import re
from pathlib import Path

from fanout.testing.conformance import SinkConformance

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _kit_section() -> str:
    """The README's "The conformance kit" section, up to the next heading of its level or
    above."""
    start = README.index("### The conformance kit\n")
    end = re.compile(r"^#{1,3} ", re.M).search(README, start + 1)
    return README[start : end.start() if end else len(README)]


def _table_checks() -> list[str]:
    """The checks the section's table names: its rows' first cells (``name`` for
    ``SinkConformance.test_name``)."""
    return re.findall(r"^\| `([a-z0-9_]+)` \|", _kit_section(), re.M)


def test_the_readme_kit_table_names_every_check_of_the_kit() -> None:
    checks = sorted(n.removeprefix("test_") for n in dir(SinkConformance) if n.startswith("test_"))
    assert len(checks) >= 20  # the kit's checks were found (its classes' test_ methods)
    listed = _table_checks()
    missing = [name for name in checks if name not in listed]
    assert not missing, f"README's conformance kit table lacks these checks: {missing}"
    unknown = [name for name in listed if name not in checks]
    assert not unknown, f"README's conformance kit table names checks the kit lacks: {unknown}"
