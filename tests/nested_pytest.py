"""A pytest run inside a test (a session of its own, e.g. on ``local-cluster``).

It is given a ``--basetemp`` of its own: without one, pytest resets the shared
``/tmp/pytest-of-<user>`` to mode 0700 when it starts, and an embedded PostgreSQL server
starting at that moment in another test (as root it runs as a system user of its own,
which must traverse that directory) fails with ``Permission denied``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_pytest(
    basetemp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pytest ARGS`` from the checkout, its temporary files under
    ``basetemp`` (which it empties first), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={basetemp}", *args],
        cwd=REPO, env=os.environ if env is None else env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
