"""The README's quick start and CI install the versions tested together (constraints.txt)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def pinned() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            found[name.lower()] = version
    return found


def test_quick_start_is_two_commands_both_constrained() -> None:
    commands = quick_start_commands()
    assert len(commands) == 2
    assert commands[0].endswith("&& .venv/bin/fanout demo")
    assert commands[1].endswith("&& .venv/bin/python -m pytest -n 2 --dist loadgroup")
    for command in commands:
        assert ".venv/bin/pip install -c constraints.txt " in command


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert quick_start_commands()[1] in ci


def test_constraints_pin_the_core_dependencies_exactly() -> None:
    versions = pinned()
    for name in (
        "pyspark",
        "pyarrow",
        "deltalake",
        "pluggy",
        "confluent-kafka",
        "psycopg2-binary",
        "sqlalchemy",
        "alembic",
        "pytest",
        "pytest-xdist",
    ):
        assert re.fullmatch(r"\d+(\.\d+)*", versions[name]), name
    assert not any(name.startswith("fanout") for name in versions)


def test_the_serial_heavy_and_long_tests_exist() -> None:
    """The suite's workers keep the driver-killing tests in one group (conftest.py): a
    renamed file would silently leave the group and run beside another chaos test (or,
    renamed out of ``LONG``, be queued late and end the suite alone)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for prefix in (*module.SERIAL_HEAVY, *module.LONG):
        assert (ROOT / prefix).exists(), prefix
    assert "tests/chaos/" in module.SERIAL_HEAVY
