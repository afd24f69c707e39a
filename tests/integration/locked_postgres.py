"""What the tests of a PostgreSQL sink hung on a locked table share
(``test_write_timeout.py``, ``test_write_timeout_cores.py``): the embedded server's
fixture, the stream run in a thread joined within a bound, and the table's ids read back
(no fanout code is used to check results)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut
from tests.chaos.checker import libpq_url
from tests.integration.streams import run_stream


def postgres_url_fixture(database: str) -> Any:
    """A ``pg_url`` fixture: an embedded PostgreSQL server holding ``database``, started
    in the test's ``tmp_path``, its URL, and the server stopped after the test. Assign it
    to ``pg_url`` in the test module."""

    @pytest.fixture(name="pg_url")
    def pg_url(tmp_path: Path) -> Iterator[str]:
        """The URL of an embedded PostgreSQL server running for the test."""
        from fanout_postgres.embedded import EmbeddedPostgres

        server = EmbeddedPostgres(tmp_path / "pgdata", database=database, durable=False)
        url = server.start()
        yield url
        server.stop()

    return pg_url


def run_bounded(
    spark: Any,
    tmp: Path,
    fan: FanOut,
    bound_s: float,
    on_hang: Callable[[], None] | None = None,
) -> None:
    """The stream of ``tmp / "input"`` through ``fan``, in a thread joined within
    ``bound_s``: a batch that hangs fails the test (``on_hang`` called first, then the
    active queries stopped); the stream's own error is raised."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            run_stream(spark, tmp / "input", fan, tmp / "ckpt")
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        if on_hang is not None:
            on_hang()
        for query in spark.streams.active:
            query.stop()
        pytest.fail("the stream hung on the locked sink")
    if failure:
        raise failure[0]


def pg_ids(url: str, table: str) -> list[int]:
    """The ``order_id`` of every row of ``table``, as stored."""
    import psycopg2

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT order_id FROM "{table}"')
        ids = [int(r[0]) for r in cur.fetchall()]
    conn.close()
    return ids
