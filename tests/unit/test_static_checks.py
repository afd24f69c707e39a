"""The code's own standards, held by CI: ruff's lint rules over the repository, and mypy's
types over the core, the built-in plugins, the benchmark scripts and the examples, which
plugin authors copy (``pyproject.toml`` configures both)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TYPED = (
    "fanout",
    "plugins/fanout-delta/fanout_delta",
    "plugins/fanout-postgres/fanout_postgres",
    "plugins/fanout-kafka/fanout_kafka",
    "bench",
    "examples",
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    done = _run("mypy", "--cache-dir", str(tmp_path / "mypy"), *TYPED)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert done.stdout.startswith("Success: no issues found"), done.stdout
