"""Fixtures of the integration tests: an embedded PostgreSQL server a pipeline's sink
writes to. (``fanout`` commands run in the test's process and SparkSession: the
``fanout_cli`` fixture of :mod:`tests.in_process_cli`, which the root conftest registers.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.streams import stopped_postgres


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """An embedded PostgreSQL server, stopped, and its URL (the same once started): a test
    starts it when it wants its sink up."""
    pg, url = stopped_postgres(tmp_path, "pipeline")
    yield pg, url
    pg.stop()
