"""A Spark Python worker keeps its write connection between partitions
(fanout_postgres.connections): the partitions of a worker run on one server backend, a
connection the server closed meanwhile is replaced before any row is read, a partition
that failed other than by a refused row does not leave its connection behind, the
sink's settings hold on a kept connection, and kept connections close after
``connection_idle_s``.

A statement trigger on the target logs the backend (``pg_backend_pid()``) and the
``work_mem`` of every statement that inserted rows, so each test sees which connection
wrote what."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.connections import CONNECTIONS, WorkerConnections
from pg_data import SCHEMA
from pgcheck import execute, query

from fanout import hookimpl
from fanout.contract.batch import Batch, BatchInfo
from fanout.errors import TransientSinkError
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink

TABLE_DDL = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, "
    "amount double precision CHECK (amount >= 0), version bigint NOT NULL)"
)
LOG_DDL = (
    "CREATE TABLE written_by (pid int, work_mem text)",
    "CREATE FUNCTION log_writer() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "INSERT INTO written_by VALUES (pg_backend_pid(), current_setting('work_mem')); "
    "RETURN NULL; END $$",
    "CREATE TRIGGER log_writer AFTER INSERT ON orders "
    "FOR EACH STATEMENT EXECUTE FUNCTION log_writer()",
)
ARROW = pa.schema(
    [("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()),
     ("version", pa.int64())]
)  # fmt: skip


pytestmark = pytest.mark.usefixtures("no_kept_connections")


def _sink(url: str, **options: Any) -> PostgresSink:
    execute(url, TABLE_DDL, *LOG_DDL)
    sink = PostgresSink("pg", url=url, table="orders", keys="id", **options)
    return open_sink(sink, "conn")


def _writer(spark: Any, sink: PostgresSink, batch_id: int = 0) -> Any:
    """The batch's partition writer, run in this process as a Python worker runs it."""
    batch = Batch(spark.createDataFrame([], SCHEMA), BatchInfo("conn", batch_id, "q"), "pg",
                  "fanout/conn/pg")  # fmt: skip
    return sink.partition_writer(batch, None)


def _write(writer: Any, partition: int, ids: range, hooks: CommitHooks | None = None) -> Any:
    rows = [{"id": i, "customer": f"c{i}", "amount": float(i), "version": 1} for i in ids]
    batches = pa.Table.from_pylist(rows, schema=ARROW).to_batches()
    hooks = hooks or CommitHooks("conn", "pg", writer.meta.batch_id)
    return writer.write_partition(partition, iter(batches), hooks, MemberDigest())


def _writers(url: str) -> list[tuple[int, str]]:
    return query(url, "SELECT pid, work_mem FROM written_by")


def _open_connections(url: str) -> int:
    database = url.rsplit("/", 1)[1].split("?")[0]
    return query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
        "AND application_name LIKE 'fanout conn/pg/%%'",
        (database,),
    )[0][0]


def _closed_connections_gone(url: str) -> int:
    """The open connections once the server has let go of those the client closed (a
    backend exits after its client's close, not with it): polled up to 10 s."""
    deadline = time.monotonic() + 10
    while _open_connections(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _open_connections(url)


def test_the_partitions_of_a_worker_run_on_one_backend(spark: Any, pg_url: str) -> None:
    writer = _writer(spark, _sink(pg_url))
    outcomes = [_write(writer, p, range(p * 10, p * 10 + 10)) for p in range(3)]
    assert [o.status for o in outcomes] == ["committed"] * 3
    pids = {pid for pid, _ in _writers(pg_url)}
    assert len(_writers(pg_url)) == 3 and len(pids) == 1
    assert query(pg_url, "SELECT count(*), min(id), max(id) FROM orders") == [(30, 0, 29)]
    assert CONNECTIONS.at_rest() == 1 and _open_connections(pg_url) == 1


def test_connection_idle_s_zero_is_a_connection_per_partition(spark: Any, pg_url: str) -> None:
    writer = _writer(spark, _sink(pg_url, connection_idle_s=0))
    for p in range(3):
        assert _write(writer, p, range(p * 10, p * 10 + 10)).status == "committed"
    assert len({pid for pid, _ in _writers(pg_url)}) == 3
    assert CONNECTIONS.at_rest() == 0 and _closed_connections_gone(pg_url) == 0


def test_a_connection_the_server_closed_is_replaced(spark: Any, pg_url: str) -> None:
    writer = _writer(spark, _sink(pg_url))
    assert _write(writer, 0, range(0, 10)).status == "committed"
    [(first, _)] = _writers(pg_url)
    assert query(pg_url, "SELECT pg_terminate_backend(%s)", (first,)) == [(True,)]
    outcome = _write(writer, 1, range(10, 20))
    assert outcome.status == "committed" and outcome.rows == 10
    pids = [pid for pid, _ in _writers(pg_url)]
    assert len(pids) == 2 and pids[1] != first
    assert query(pg_url, "SELECT count(*), min(id), max(id) FROM orders") == [(20, 0, 19)]


class Veto:
    """A plugin refusing every partition's commit."""

    @hookimpl
    def fanout_partition_commit(self, commit: Any) -> None:
        raise TransientSinkError("not now", sink="pg")


def test_a_partition_that_failed_closes_its_connection(spark: Any, pg_url: str) -> None:
    writer = _writer(spark, _sink(pg_url))
    vetoed = _write(writer, 0, range(0, 10), CommitHooks("conn", "pg", 0, plugins=(Veto(),)))
    assert vetoed.status == "failed" and "not now" in vetoed.failure.message
    assert CONNECTIONS.at_rest() == 0 and _closed_connections_gone(pg_url) == 0
    assert query(pg_url, "SELECT count(*) FROM orders") == [(0,)]


def test_a_refused_row_keeps_the_connection_and_its_settings(spark: Any, pg_url: str) -> None:
    # the settings are committed when the connection opens: the first partition on it
    # rolling back (a refused row) must not take them away from the next ones
    writer = _writer(spark, _sink(pg_url, settings={"work_mem": "7MB", "temp_buffers": "9MB"}))
    refused = writer.write_partition(
        0,
        iter([pa.RecordBatch.from_pylist(
            [{"id": 3, "customer": "c", "amount": -1.0, "version": 2}], schema=ARROW)]),
        CommitHooks("conn", "pg", 0),
        MemberDigest(),
    )  # fmt: skip
    assert refused.status == "failed" and refused.failure.kind == "data"
    assert CONNECTIONS.at_rest() == 1
    assert _write(writer, 1, range(0, 10)).status == "committed"
    # an update of existing keys is staged in a temporary table, on the same backend
    assert _write(writer, 2, range(5, 15)).status == "committed"
    written = _writers(pg_url)
    assert len(written) == 2 and len({pid for pid, _ in written}) == 1
    assert {mem for _, mem in written} == {"7MB"}
    assert query(pg_url, "SELECT count(*), min(id), max(id) FROM orders") == [(15, 0, 14)]


def test_kept_connections_close_after_connection_idle_s(spark: Any, pg_url: str) -> None:
    writer = _writer(spark, _sink(pg_url, connection_idle_s=0.3))
    assert _write(writer, 0, range(0, 10)).status == "committed"
    assert _open_connections(pg_url) == 1
    assert _closed_connections_gone(pg_url) == 0 and CONNECTIONS.at_rest() == 0


def test_spark_workers_reuse_connections_across_batches(spark: Any, pg_url: str) -> None:
    sink = _sink(pg_url, partitions=4)
    for batch_id in range(2):
        ids = range(batch_id * 100, batch_id * 100 + 100)
        rows = [(i, f"c{i}", float(i), batch_id) for i in ids]
        df = spark.createDataFrame(rows, SCHEMA)
        result = sink.write(Batch(df, BatchInfo("conn", batch_id, "q"), "pg", "fanout/conn/pg"))
        assert result.rows == 100
    assert query(pg_url, "SELECT count(*), min(id), max(id) FROM orders") == [(200, 0, 199)]
    # 8 partitions, on local[2]'s few Python workers: fewer backends than partitions
    assert len(_writers(pg_url)) == 8
    assert len({pid for pid, _ in _writers(pg_url)}) < 8


class FakeConnection:
    """Stands in for a psycopg2 connection at rest (the keeping logic only)."""

    def __init__(self) -> None:
        self.closed = 0

    def get_transaction_status(self) -> int:
        return 0  # psycopg2.extensions.TRANSACTION_STATUS_IDLE

    def close(self) -> None:
        self.closed = 1


def test_at_most_max_idle_connections_wait_the_oldest_closed_first() -> None:
    kept = WorkerConnections(max_idle=2)
    first, second, third = FakeConnection(), FakeConnection(), FakeConnection()
    for connection in (first, second, third):
        kept.give_back(connection, "postgresql://h/d", (), 60.0)
    assert kept.at_rest() == 2 and (first.closed, second.closed, third.closed) == (1, 0, 0)
    kept.close_all()
    assert (second.closed, third.closed) == (1, 1) and kept.at_rest() == 0


@pytest.mark.parametrize(
    ("left_with", "taken_with", "reused"), [(0.05, 60.0, False), (60.0, 0.05, True)]
)
def test_how_long_a_kept_connection_may_wait_is_its_keepers_setting(
    monkeypatch: pytest.MonkeyPatch, left_with: float, taken_with: float, reused: bool
) -> None:
    from fanout_postgres import connections

    made: list[FakeConnection] = []

    def new_connection(url: Any, application_name: str) -> FakeConnection:
        made.append(FakeConnection())
        return made[-1]

    monkeypatch.setattr(connections, "connect", new_connection)
    monkeypatch.setattr(connections, "_answers", lambda connection, name: True)
    monkeypatch.setattr(FakeConnection, "cursor", lambda self: _NoCursor(), raising=False)
    monkeypatch.setattr(FakeConnection, "commit", lambda self: None, raising=False)
    kept = WorkerConnections()
    left = FakeConnection()
    kept.give_back(left, "postgresql://h/d", (), left_with)
    time.sleep(0.15)  # past 0.05 s, well within 60 s
    taken = kept.take("postgresql://h/d", (), "conn", taken_with)
    assert (taken is left, len(made), left.closed) == (
        reused,
        0 if reused else 1,
        0 if reused else 1,
    )
    kept.close_all()


class _NoCursor:
    def __enter__(self) -> _NoCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, *args: object) -> None:
        return None

    def fetchone(self) -> tuple[str]:
        return ("on",)  # SHOW synchronous_commit
