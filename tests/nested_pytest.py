"""A pytest run inside a test (a session of its own, e.g. on ``local-cluster``).

It is given a ``--basetemp`` of its own: without one, pytest resets the shared
``/tmp/pytest-of-<user>`` to mode 0700 when it starts, and an embedded PostgreSQL server
starting at that moment in another test (as root it runs as a system user of its own,
which must traverse that directory) fails with ``Permission denied``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
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


OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
SUMMARY = re.compile(r"^=+ .* in [\d.]+s( \(.*\))? =+$")


@dataclass(frozen=True)
class NestedRun:
    """A nested pytest run with ``-rfEsxXp``: its short summary names each test's outcome."""

    done: subprocess.CompletedProcess[str]

    def tail(self) -> str:
        """The end of its output, for an assertion's message."""
        return self.done.stdout[-6000:] + self.done.stderr[-3000:]

    def finished(self) -> bool:
        """It ran to its end (its last line the summary's), not cut short by a crash."""
        lines = self.done.stdout.strip().splitlines()
        return self.done.returncode in (0, 1) and bool(lines) and bool(SUMMARY.match(lines[-1]))

    def selected(self) -> tuple[int, int]:
        """``(deselected, selected)``, from its header (not quiet)."""
        header = re.search(
            r"^collected (\d+) items?(?: / (\d+) deselected / (\d+) selected)?$",
            self.done.stdout,
            re.M,
        )
        assert header, self.tail()
        if header.group(2) is None:
            return 0, int(header.group(1))
        return int(header.group(2)), int(header.group(3))

    def outcomes(self, paths: Sequence[str] = ("",)) -> list[tuple[str, str]]:
        """``(outcome, test or location)`` of every summary line naming one of ``paths``
        (file paths or node ids; the default, every line): PASSED, FAILED, ERROR (a
        module's collection too), SKIPPED (its location), XFAIL or XPASS."""
        found = []
        summary = self.done.stdout.split(" short test summary info ", 1)[-1]
        for line in summary.splitlines():
            outcome, _, rest = line.partition(" ")
            if outcome not in OUTCOMES:
                continue
            where = rest.split(" ", 1)[1] if outcome == "SKIPPED" else rest
            where = where.split(" - ", 1)[0]
            if any(where.startswith(path) for path in paths):
                found.append((outcome, where))
        return found


def run_on_local_cluster(basetemp: Path, targets: Sequence[str]) -> NestedRun:
    """One nested pytest of ``targets`` (paths, node ids, ``--deselect`` options) on
    ``local-cluster`` (``FANOUT_TEST_MASTER=cluster``: two executor JVMs), so several
    tests that need a cluster share its start. The executors' Python workers unpickle
    functions of ``tests.*``: the checkout goes on their path, before the caller's."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "FANOUT_TEST_MASTER": "cluster", "PYTHONPATH": path}
    done = run_pytest(
        basetemp, "-rfEsxXp", "-p", "no:rerunfailures", "--durations=0", *targets, env=env,
        timeout=1500,
    )  # fmt: skip
    return NestedRun(done)
