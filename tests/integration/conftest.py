"""Fixtures of the integration tests that drive a pipeline with a PostgreSQL sink."""

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
