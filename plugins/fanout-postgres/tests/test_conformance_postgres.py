"""The sink conformance suite (fanout.testing.conformance) against the PostgreSQL sink:
upsert keyed by ``id``, and its password never shown."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query
from test_identifiers_secrets import PASSWORD, secret_url  # noqa: F401  (a fixture)

from fanout.testing.conformance import SinkConformance, SinkUnderTest


class TestPostgresConformance(SinkConformance):
    def _failing(self, request: pytest.FixtureRequest) -> dict[str, Any] | None:
        """A password-protected URL (its fixture makes a role: only for the secret check)."""
        if "secret" not in request.node.name:
            return None
        url = request.getfixturevalue("secret_url")
        return {"type": "postgres", "url": url, "table": "no_such_table"}

    def _refusing(self, request: pytest.FixtureRequest, pg_url: str, table: str) -> str | None:
        """For the refused-row check only: the table made first, with a ``CHECK`` refusing
        ``v = 'refused'`` (one the sink's own ``create_table`` never adds)."""
        if "target_refuses" not in request.node.name:
            return None
        execute(
            pg_url, f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, v TEXT CHECK (v <> 'refused'))"
        )
        return "refused"

    @pytest.fixture
    def under_test(
        self, pg_url: str, tmp_path: Path, request: pytest.FixtureRequest
    ) -> SinkUnderTest:
        table = f"conf_{uuid.uuid4().hex[:8]}"

        def read() -> list[dict[str, Any]]:
            exists = query(pg_url, "SELECT to_regclass(%s) IS NOT NULL", (table,))[0][0]
            rows = query(pg_url, f"SELECT id, v FROM {table}") if exists else []
            return [{"id": i, "v": v} for i, v in rows]

        def recreate() -> None:  # as a deploy script would: a new OID, no row
            execute(pg_url, f"DROP TABLE {table}")
            execute(pg_url, f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, v TEXT)")

        return SinkUnderTest(
            config={
                "type": "postgres",
                "url": pg_url,
                "table": table,
                "keys": ["id"],
                "create_table": True,
                "partitions": 2,
            },
            read=read,
            dead_letter=str(tmp_path / "dead"),
            keyed=True,
            schema_drift="refuses",
            recreate=recreate,
            drop=lambda: execute(pg_url, f"DROP TABLE {table}"),
            secret=PASSWORD,
            failing_config=self._failing(request),
            refused_value=self._refusing(request, pg_url, table),
        )
