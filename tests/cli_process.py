"""The ``fanout`` command run as an operator runs it: in a process of its own."""

from __future__ import annotations

import os
import re
import shlex
import signal
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


def printed_command(text: str, command: str) -> list[str]:
    """The arguments (after ``fanout``) of the first command in backticks in ``text`` that
    starts with ``command`` (``"fanout ledger skip"``), as a shell splits it: a message's
    way on, to run as printed with :func:`fanout_process`."""
    found = re.search(f"`({re.escape(command)}[^`]*)`", text)
    assert found is not None, f"no `{command} ...` in: {text}"
    return shlex.split(found.group(1))[1:]


def driver_process(
    script: str, *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """The Python ``script`` with ``args`` in a process group of its own, importing what
    this test process imports (its ``sys.path``): a kill of its group takes its JVM with
    it, and what is left of the group once it ended is killed too."""
    process = subprocess.Popen(
        [sys.executable, script, *args],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)
