"""Shared fixtures of the whole suite (the core's tests and each plugin's, beside it): one
local SparkSession per test process, started on first use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MASTER_ENV = "FANOUT_TEST_MASTER"
"""Names the master of the tests' session: ``local[2]`` when unset; ``cluster`` for
``local-cluster[2,1,1024]`` (two executor JVMs), or any master string."""

SHORT_LIVED_JVM = (
    "-XX:TieredStopAtLevel=1 -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
)
"""Java options of every Spark driver the tests start, the test process's own session and
those of the drivers it starts in subprocesses (Spark's launcher adds ``SPARK_SUBMIT_OPTS``
to a driver's JVM, and subprocesses inherit it). A Spark start loads thousands of classes
from the class path, each verified by default; unverified (the pinned pyspark wheel's jars
and fanout's javac-compiled classes: no fanout behaviour a test proves), a session start
and one job took 8.7 CPU s against 10.4 (seven runs each, alternated; 6.5 s against 8.2
of wall time in the least loaded pairs). On the tests' small data the JIT's
optimizing compiler costs more CPU than it saves: measured with both runs at once,
tests/integration/test_hard_kill.py (driver subprocesses) took 66.3 CPU s with it off
against 93.0, and three files run in the test process's session 43.6 against 63.3. Executor
JVMs (``local-cluster``) are given them too: tests/chaos/test_executor_kills.py (ten executor
starts) took 107.7 CPU s against 147.9, the nested local-cluster run 68.9 against 101.8."""
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)

# ``fanout ARGS...`` in the test's process, for the core's tests and each plugin's
from tests.in_process_cli import fanout_cli  # noqa: E402, F401


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession shared by every integration test of this process, on the
    master :data:`MASTER_ENV` names (``local[2]`` by default)."""
    from fanout.spark import JVM_GC, cluster_master, local_session

    master = os.environ.get(MASTER_ENV, "local[2]")
    conf: dict[str, str] = {}
    if master == "cluster":  # executor JVMs, which SPARK_SUBMIT_OPTS does not reach
        conf["spark.executor.extraJavaOptions"] = f"{JVM_GC} {SHORT_LIVED_JVM}"
    session = local_session(
        "fanout-tests", master=cluster_master() if master == "cluster" else master, conf=conf
    )
    yield session
    session.stop()


ON_LOCAL_CLUSTER = "ON_LOCAL_CLUSTER"
"""The module attribute listing what a test of that module, asking for the
:func:`local_cluster_run` fixture, needs run on ``local-cluster`` (paths, node ids,
``--deselect`` options)."""


@pytest.fixture(scope="session")
def local_cluster_run(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Any:
    """One nested pytest on ``local-cluster`` (:func:`tests.nested_pytest.run_on_local_cluster`)
    of what every selected test asking for this fixture needs run there (its module's
    :data:`ON_LOCAL_CLUSTER`), in the order of the tests: one cluster start (~30 s of CI)
    for all of them."""
    from tests.nested_pytest import run_on_local_cluster

    targets: dict[str, list[str]] = {}
    for item in request.session.items:
        module = getattr(item, "module", None)
        if "local_cluster_run" in getattr(item, "fixturenames", ()) and module is not None:
            targets.setdefault(module.__name__, list(getattr(module, ON_LOCAL_CLUSTER)))
    args = [arg for module_targets in targets.values() for arg in module_targets]
    return run_on_local_cluster(tmp_path_factory.mktemp("on-local-cluster"), args)


SERIAL_HEAVY = (
    "tests/integration/test_on_local_cluster.py",
    "tests/chaos/",
    "tests/connect/",
    "tests/integration/test_demo.py",
)
"""Tests that each drive Spark drivers or clusters in subprocesses of their own, for
minutes: under ``pytest -n 2 --dist loadgroup`` they run one after another in one worker,
never two at once, while the other worker takes the rest of the suite. They run in this
order, the short demo tests last (a worker takes its next file while its last two tests run)."""

LONG = (
    "plugins/fanout-kafka/tests/test_partition_membership.py",
    "tests/integration/test_hard_kill.py",
    "tests/integration/test_checkpoint_reset.py",
    "tests/integration/test_run_pipeline.py",
    "plugins/fanout-delta/tests/test_delta_distributed.py",
    "tests/integration/test_available_now_catch_up.py",
)
"""Files that each take a minute or more (kill-and-restart driver subprocesses): queued
right after :data:`SERIAL_HEAVY`, so the suite never ends on one of them running alone."""


SLOW_UNIT = (
    "tests/unit/test_exit_codes.py",
    "tests/unit/test_static_checks.py",
)
"""Unit test files of half a minute or more (fresh interpreters, mypy over the code): first
of the unit tests, so the suite ends on small files that fill both workers to the end,
never on one of these running alone."""


def pytest_configure(config: pytest.Config) -> None:
    """Keep the order :func:`pytest_collection_modifyitems` gives the groups under
    ``--dist loadgroup``: pytest-xdist would otherwise queue them by their number of tests,
    which put the one-test kill-and-restart files last and the serial-heavy group (11
    tests, a third of the suite's time) in the middle."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    _with_class_data_sharing(config)


def _with_class_data_sharing(config: pytest.Config) -> None:
    """Start the Spark drivers of this run from a class-data-sharing archive
    (:mod:`tests.cds`): ~3 CPU s less per driver start. In the controller (or the one
    process), before the xdist workers start, which inherit ``SPARK_SUBMIT_OPTS``; the
    archive is dumped when missing unless the run names only unit tests (a one-time ~25 s);
    nothing changes when ``SPARK_SUBMIT_OPTS`` is not :data:`SHORT_LIVED_JVM` (set by the
    user, or already given the archive by a parent pytest)."""
    if hasattr(config, "workerinput"):
        return
    from tests.cds import with_archive

    with_archive(os.environ, SHORT_LIVED_JVM, list(config.args))


def _rank(relative: str, integration: bool) -> tuple[int, int]:
    """Where a test file's group goes in the queue: longest first (the longest-processing-
    time rule), the unit tests last (small groups that fill both workers to the end)."""
    for n, prefix in enumerate(SERIAL_HEAVY):
        if relative.startswith(prefix):
            return (0, n)
    if relative in LONG:
        return (1, LONG.index(relative))
    if relative in SLOW_UNIT:
        return (3, SLOW_UNIT.index(relative) - len(SLOW_UNIT))
    return (2, 0) if integration else (3, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark as integration what needs Spark or a service: the core's tests/integration and
    tests/chaos, and the tests of plugins that use the ``spark`` fixture. Group the tests
    for pytest-xdist's ``loadgroup``: a test file's tests stay in one worker (its module
    fixtures are set up once), and :data:`SERIAL_HEAVY` is one group. Order the files by
    :func:`_rank` (a file's tests stay together and in their order)."""
    root = str(Path(__file__).parent) + "/"
    ranks: dict[str, tuple[int, int]] = {}
    for item in items:
        path = str(item.fspath)
        uses_spark = "spark" in getattr(item, "fixturenames", ())
        integration = "tests/integration" in path or "tests/chaos" in path or uses_spark
        if integration:
            item.add_marker(pytest.mark.integration)
        relative = path.removeprefix(root)
        heavy = any(relative.startswith(prefix) for prefix in SERIAL_HEAVY)
        item.add_marker(pytest.mark.xdist_group("serial-heavy" if heavy else relative))
        rank = _rank(relative, integration)
        ranks[relative] = min(ranks.get(relative, rank), rank)
    order = {path: n for n, path in enumerate(ranks)}  # first-collected order within a rank
    items.sort(key=lambda item: (*ranks[_relative(item, root)], order[_relative(item, root)]))


def _relative(item: pytest.Item, root: str) -> str:
    return str(item.fspath).removeprefix(root)


def _xdist_group(nodeid: str) -> str:
    """The ``loadgroup`` group of a test: :data:`SERIAL_HEAVY`'s tests one group, any
    other test file its own (its path, from the test's id)."""
    path = nodeid.split("::", 1)[0]
    return "serial-heavy" if path.startswith(SERIAL_HEAVY) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``, pytest-xdist's scheduler grouped by the ``@group``
    suffix its worker plugin appends to each test's id from the ``xdist_group`` marks
    (:func:`pytest_collection_modifyitems`); with pytest 9 (``Node._id``) its assignment
    to ``item._nodeid`` changes no id: every test was a group of its own, a file's tests
    (the serial-heavy ones too) ran in both workers at once, and module and session
    fixtures (``local_cluster_run``, a module's killed state) were set up in each. The
    same scheduler, its groups read from the test's path (:func:`_xdist_group`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileGroups(LoadGroupScheduling):
        """``loadgroup`` with the groups of :func:`_xdist_group`."""

        def _split_scope(self, nodeid: str) -> str:
            return _xdist_group(nodeid)

    return FileGroups(config, log)


@pytest.fixture(autouse=True, scope="session")
def _pyspark_loggers_keep_pytest_formatters() -> Iterator[None]:
    """pytest attaches its log-capture handlers to every non-propagating logger, PySpark's
    query-context loggers included, and ``PySparkLogger.addHandler`` sets its JSON formatter
    on whatever handler it gets: from then on every ``caplog.text`` of the session would be
    PySpark's JSON. Tests only: a pipeline never hands PySpark a shared handler."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:
        yield
        return
    import logging

    original = PySparkLogger.addHandler
    PySparkLogger.addHandler = logging.Logger.addHandler  # type: ignore[method-assign]
    yield
    PySparkLogger.addHandler = original  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _registered_secrets() -> Iterator[None]:
    """Each test leaves the process-wide registry of secrets as it found it: the ``fanout``
    command masks every registered secret in all it prints, so a pipeline file's
    ``postgresql://fanout:fanout@...`` would mask the word ``fanout`` in later tests' output."""
    from fanout.observe import logs

    before = set(logs.known_secrets())
    yield
    with logs._secrets_lock:
        logs._secrets.intersection_update(before)
