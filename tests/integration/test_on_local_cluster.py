"""The Delta sink's executor-side tests again, on ``local-cluster`` (two executor JVMs,
other processes than the driver, each with its own Python workers): a path, a credential
or a state only the driver holds would fail there. They run in a pytest of their own
(one SparkSession per process), whose ``spark`` fixture starts the cluster because
``FANOUT_TEST_MASTER=cluster`` (conftest.py); any test can be run that way by hand."""

from __future__ import annotations

import os
import re
from pathlib import Path
from subprocess import CompletedProcess

from tests.nested_pytest import run_pytest

MODULES = [
    "plugins/fanout-delta/tests/test_delta_distributed.py",
    "plugins/fanout-delta/tests/test_delta_object_store.py",
]
SAME_ON_ANY_MASTER = [
    "--deselect",
    "plugins/fanout-delta/tests/test_delta_distributed.py::"
    "test_driver_killed_before_the_commit_then_restarted_writes_every_row_once",
]
"""Tests whose work runs in a driver subprocess on ``local[2]`` whatever the session's
master: on the cluster they would repeat the same run (~75 s of CI)."""


def _pytest(basetemp: Path, *args: str, master: str | None = None) -> CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FANOUT_TEST_MASTER"}
    if master is not None:
        env["FANOUT_TEST_MASTER"] = master
    return run_pytest(basetemp, *args, *SAME_ON_ANY_MASTER, *MODULES, env=env, timeout=1500)


def test_the_delta_executor_tests_pass_on_local_cluster(tmp_path: Path) -> None:
    """Every test selected passed: the run's own count of what it collected and selected
    (its header, not quiet) against its summary, so none skipped, none failed."""
    done = _pytest(tmp_path / "inner", "--durations=0", master="cluster")
    skipped = len(SAME_ON_ANY_MASTER) // 2
    found = re.search(
        r"^collected \d+ items / (\d+) deselected / (\d+) selected$", done.stdout, re.M
    )
    assert found, done.stdout[-6000:] + done.stderr[-3000:]
    assert int(found.group(1)) == skipped, found.group(0)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert re.fullmatch(rf"=* ?{found.group(2)} passed, {skipped} deselected in .* =*", summary), (
        summary
    )
