"""Shared fixtures of the whole suite (the core's tests and each plugin's, beside it): one
local SparkSession per test process, started on first use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession shared by every integration test of this process."""
    from fanout.spark import local_session

    session = local_session("fanout-tests")
    yield session
    session.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark as integration what needs Spark or a service: the core's tests/integration and
    tests/chaos, and the tests of plugins that use the ``spark`` fixture."""
    for item in items:
        path = str(item.fspath)
        uses_spark = "spark" in getattr(item, "fixturenames", ())
        if "tests/integration" in path or "tests/chaos" in path or uses_spark:
            item.add_marker(pytest.mark.integration)


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
