"""The ``fanout`` command run as an operator runs it: in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys


def fanout_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The real ``fanout`` command with ``args``, in a process of its own that imports the
    code this test process imports (its ``sys.path``); its exit code and output captured."""
    return subprocess.run(
        [sys.executable, "-m", "fanout", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
