"""Upsert mode with a key computed by ``uuid()`` (or ``rand()``, ``current_timestamp()``):
a replay would compute other keys and insert every row again, so such a key is refused
like append mode's partitioning columns -- at ``FanOut(...)`` when the route computes it,
else at the first batch, before any row is written. A deterministic key with volatile
other columns is written, and a replay changes nothing."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pg_data import run_stream, write_files
from pgcheck import execute, query

from fanout import FanOut, PartitioningError
from fanout.contract.batch import Batch, BatchInfo
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.testing import open_sink

WHY = (
    "is not deterministic: a replay or retry would compute other keys (or keep other rows), "
    "and the upsert would insert them beside the rows an earlier attempt wrote (every row "
    "written twice)."
)


def test_an_upsert_keyed_by_uuid_in_its_route_is_refused_at_fanout_and_keyed_by_id_is_written(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    files = write_files(tmp_path / "input", files=2, rows=20, step=20)
    route = Route(select=("*", "uuid() AS event_id"))
    options: dict[str, Any] = {"url": pg_url, "table": "events", "create_table": True,
                               "partitions": 2}  # fmt: skip
    with pytest.raises(PartitioningError) as refused:
        FanOut("pg-uuid", str(tmp_path / "ledger"),
               [SinkSpec(PostgresSink("events", keys=["event_id"], **options), route)])  # fmt: skip
    assert str(refused.value) == (
        f"sink 'events': route select expression 'uuid() AS event_id' {WHY} This sink upserts "
        "by event_id: derive those columns deterministically from the input (its other "
        "columns may be non-deterministic)"
    )
    assert query(pg_url, "SELECT count(*) FROM pg_tables WHERE tablename = 'events'") == [(0,)]
    with pytest.raises(PartitioningError, match="route where 'rand\\(\\) < 0.5' is not det"):
        FanOut("pg-uuid", str(tmp_path / "ledger"),
               [SinkSpec(PostgresSink("events", keys=["id"], **options),
                         Route(where="rand() < 0.5"))])  # fmt: skip

    keyed = PostgresSink("events", keys=["id"], **options)
    fan = FanOut("pg-uuid", str(tmp_path / "ledger"), [SinkSpec(keyed, route)])
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    got = query(pg_url, "SELECT id, length(event_id) FROM events ORDER BY id")
    assert got == [(r["id"], 36) for chunk in files for r in chunk]


def _batch(spark: Any, key: str, query_id: str) -> Batch:
    df = spark.range(10).selectExpr(f"{key} AS event_id", "id AS n", "uuid() AS token")
    return Batch(df, BatchInfo("vk", 0, query_id), "pg", "fanout/vk/pg")


@pytest.mark.parametrize("key", ["uuid()", "cast(rand() AS string)", "cast(now() AS string)"])
def test_the_first_batch_of_an_upsert_keyed_by_a_volatile_column_is_refused_before_writing(
    spark: Any, pg_url: str, key: str
) -> None:
    """The key comes from the batch's own query (no route): the keys resolved from the
    table's primary key are checked at the first batch, before any partition writes."""
    execute(pg_url, "CREATE TABLE ev (event_id text PRIMARY KEY, n bigint, token text)")
    sink = open_sink(PostgresSink("pg", url=pg_url, table="ev", partitions=2), "vk")
    with pytest.raises(PartitioningError) as refused:
        sink.write(_batch(spark, key, f"q-{uuid.uuid4()}"))
    message = str(refused.value)
    assert message.startswith("sink 'pg', batch 0: the batch's column 'event_id' (")
    assert WHY in message
    assert "This sink upserts by event_id" in message
    assert query(pg_url, "SELECT count(*) FROM ev") == [(0,)]


def test_a_deterministic_key_with_volatile_other_columns_is_written_once_on_replay(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, "CREATE TABLE ev (event_id text PRIMARY KEY, n bigint, token text)")
    sink = open_sink(PostgresSink("pg", url=pg_url, table="ev", partitions=2), "vk")
    for _ in range(2):  # the batch, then its replay
        sink.write(_batch(spark, "sha2(cast(id AS string), 256)", f"q-{uuid.uuid4()}"))
    assert query(pg_url, "SELECT count(*), count(DISTINCT n) FROM ev") == [(10, 10)]
