"""A PostgreSQL table dropped between two runs: the progress marks (append) and
``upsert_routes`` rows (upsert) live in the ``fanout`` schema and outlive it, so the sink's
records alone still said "held". The next run's first batch is now refused with
:class:`fanout.TargetLostError` before anything is written (``create_table`` would have
created the table again empty and written on), also when the table was created again by
hand before the run (``create_table`` with ``batch_schema`` creates it at ``open()``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchInfo, FanOut, TargetLostError

pytestmark = pytest.mark.integration


def _fan(tmp_path: Path, url: str, mode: str = "append", **options: Any) -> FanOut:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "lost_orders",
            "mode": mode, "create_table": True, "partitions": 2}  # fmt: skip
    if mode == "upsert":
        sink["keys"] = ["id"]
    return FanOut("lostpg", str(tmp_path / "ledger"), [sink], retries=0, **options)


def _run(fan: FanOut, spark: Any, batch_id: int) -> None:
    rows = [(batch_id * 10 + n, f"order-{batch_id}-{n}") for n in range(4)]
    info = BatchInfo("lostpg", batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=1000 + batch_id)  # fmt: skip
    try:
        fan.process(spark.createDataFrame(rows, "id LONG, name STRING"), info)
    finally:
        fan.close()


def _ids(url: str) -> list[int]:
    return [row[0] for row in query(url, "SELECT id FROM lost_orders ORDER BY 1")]


def _table_exists(url: str) -> bool:
    return query(url, "SELECT to_regclass('public.lost_orders') IS NOT NULL")[0][0]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_dropped_table_refuses_the_next_run(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    _run(_fan(tmp_path, pg_url, mode), spark, 0)
    _run(_fan(tmp_path, pg_url, mode), spark, 1)
    execute(pg_url, "DROP TABLE lost_orders")

    with pytest.raises(TargetLostError) as refused:
        _run(_fan(tmp_path, pg_url, mode), spark, 2)
    assert str(refused.value).startswith(
        "sink 'pg', batch 1: pipeline 'lostpg': table 'lost_orders' no longer holds batch 1 "
        "of epoch 0, which the ledger marks written there (its last marked batch that wrote "
        "rows): the target was probably deleted or replaced since, and created again empty"
    )
    assert "--accept-lost-target pg`" in str(refused.value)
    assert not _table_exists(pg_url)  # nothing written, not even the table created

    _run(_fan(tmp_path, pg_url, mode, accept_lost_targets=["pg"]), spark, 2)
    assert _ids(pg_url) == [20, 21, 22, 23]
    _run(_fan(tmp_path, pg_url, mode), spark, 3)  # holds its mark 2 now: passes
    assert _ids(pg_url) == [20, 21, 22, 23, 30, 31, 32, 33]


def test_a_table_created_again_empty_at_open_refuses_and_a_normal_restart_passes(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    schema = {"batch_schema": "id LONG, name STRING"}
    _run(_fan(tmp_path, pg_url), spark, 0)
    _run(_fan(tmp_path, pg_url), spark, 1)  # a restart with the table in place
    assert _ids(pg_url) == [0, 1, 2, 3, 10, 11, 12, 13]

    execute(pg_url, "DROP TABLE lost_orders")
    fan = FanOut(
        "lostpg", str(tmp_path / "ledger"),
        [{"type": "postgres", "name": "pg", "url": pg_url, "table": "lost_orders",
          "mode": "append", "create_table": True, "partitions": 2, **schema}],
        retries=0,
    )  # fmt: skip
    assert _table_exists(pg_url)  # created again, empty, by open()
    with pytest.raises(TargetLostError, match="table 'lost_orders' no longer holds batch 1"):
        _run(fan, spark, 2)
    assert _ids(pg_url) == []
