"""A ``FanOut(...)`` that fails to start closes the PostgreSQL sink it had opened: its
driver engine is disposed and no connection of it is left on the server."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout import ConfigurationError, FanOut
from fanout.ledger.memory import MemoryLedger


class Counted(PostgresSink):
    """The real sink, the ``close()`` calls after its ``open()`` returned counted (inside
    it, the sink closes an engine of its own before it makes one)."""

    opened, closes = False, 0

    def open(self, context: Any) -> None:
        super().open(context)
        self.opened = True

    def close(self) -> None:
        self.closes += self.opened
        super().close()


def _connections(url: str) -> int:
    """The server's connections to the test's database but the one asking."""
    return query(
        url,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )[0][0]


def test_a_start_failing_at_the_second_sink_closes_the_first_postgres_sink(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE orders (id bigint PRIMARY KEY, v text)")
    before = _connections(pg_url)
    first = Counted("orders", url=pg_url, table="orders")
    second = PostgresSink("missing", url=pg_url, table="missing")
    with pytest.raises(ConfigurationError) as refused:
        FanOut("pgstart", MemoryLedger(), [first, second])
    assert str(refused.value) == (
        "postgres sink 'missing' (table missing): the table does not exist; create it, or "
        "set create_table: true to create it from the batch schema"
    )
    assert first.closes == 1
    engine: Any = vars(first).get("_driver_engine")
    assert engine is None  # disposed by close()
    assert (before, _connections(pg_url)) == (0, 0)
