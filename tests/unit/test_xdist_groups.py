"""The suite's ``pytest -n 2 --dist loadgroup`` keeps each test file's tests in one worker
and the serial-heavy files (:data:`conftest.SERIAL_HEAVY`) all in one worker: the root
conftest's scheduler (``pytest_xdist_make_scheduler``, groups read from a test's path).

With pytest 9, pytest-xdist's own ``loadgroup`` grouped nothing (its ``@group`` suffix no
longer reaches the test's id) and no test said so for many sessions: every test was a group
of its own, a file's tests ran in both workers at once, the serial-heavy files side by side.
This runs the scheduler on a few generated files that only record their worker."""

from __future__ import annotations

import pytest

from tests.nested_pytest import REPO

pytest_plugins = ("pytester",)

SERIAL_HEAVY_FILES = (
    "tests/integration/test_on_local_cluster.py",
    "tests/chaos/test_kills.py",
    "tests/connect/test_remote.py",
    "tests/integration/test_demo.py",
)
OTHER_FILES = (
    "tests/integration/test_a.py",
    "tests/integration/test_b.py",
    "tests/unit/test_c.py",
    "plugins/fanout-delta/tests/test_d.py",
)
TESTS_PER_FILE = 3

RECORDING_CONFTEST = """
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _record_worker(request, worker_id):
    with (Path(__file__).parent / "ran.txt").open("a") as ran:
        ran.write(f"{request.node.nodeid} {worker_id}\\n")
"""


def test_each_file_runs_in_one_worker_and_the_serial_heavy_files_in_the_same(
    pytester: pytest.Pytester, request: pytest.FixtureRequest
) -> None:
    root = request.config.pluginmanager.get_plugin(str(REPO / "conftest.py"))
    assert root is not None, "the root conftest.py is not loaded"

    class Scheduler:
        """The root conftest's scheduler hook alone (its other hooks start no JVM here)."""

    scheduler = getattr(root, "pytest_xdist_make_scheduler", None)
    if scheduler is not None:  # removed: the run shows what is lost
        Scheduler.pytest_xdist_make_scheduler = staticmethod(scheduler)  # type: ignore[attr-defined]
    pytester.makeconftest(RECORDING_CONFTEST)
    body = "".join(f"def test_{n}():\n    pass\n\n\n" for n in range(TESTS_PER_FILE))
    for path in (*SERIAL_HEAVY_FILES, *OTHER_FILES):
        (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / path).write_text(body)

    run = pytester.inline_run(
        "-p", "no:cacheprovider", "--import-mode=importlib", "-n", "2", "--dist", "loadgroup",
        plugins=[Scheduler()],
    )  # fmt: skip

    run.assertoutcome(passed=TESTS_PER_FILE * (len(SERIAL_HEAVY_FILES) + len(OTHER_FILES)))
    workers: dict[str, set[str]] = {}
    for line in (pytester.path / "ran.txt").read_text().splitlines():
        nodeid, worker = line.split()
        workers.setdefault(nodeid.split("::")[0], set()).add(worker)
    assert sorted(workers) == sorted((*SERIAL_HEAVY_FILES, *OTHER_FILES))
    split = {path: sorted(ran) for path, ran in workers.items() if len(ran) > 1}
    assert split == {}, f"files whose tests ran in both workers: {split}"
    heavy = {path: workers[path] for path in SERIAL_HEAVY_FILES}
    assert len(set().union(*heavy.values())) == 1, f"serial-heavy files in both workers: {heavy}"
    assert set().union(*workers.values()) == {"gw0", "gw1"}
