"""Upsert's count of each partition's refused rows (``upsert_routes.refused``, ``kept_in``:
migration ``0007``) is the last committed attempt's: a replay that refuses none resets it,
and refused rows a PostgreSQL dead-letter table took in the partition's own transaction
wait for nothing. The driver "dies" between the partitions' commits and its hand-over of
the refused rows (``after_partitions`` raises), as in ``test_kept_dead_letters.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout import PartlyHeld
from fanout.contract.batch import Batch, BatchInfo
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.deadletters.held import refused_rows_held
from fanout.testing import open_sink

PIPELINE, PARTITIONS = "counted", 2
DDL = "CREATE TABLE items (id bigint PRIMARY KEY, qty integer CONSTRAINT positive CHECK (qty >= 0))"
ROWS = [(i, -1 if i in (2, 5) else i) for i in range(1, 7)]
"""Rows 2 and 5 break the CHECK."""


class DriverDied(Exception):
    """The driver died after every partition committed, before it wrote the letters."""


def _sink(url: str, dead_letter: str) -> PostgresSink:
    sink = PostgresSink("pg", url=url, table="items", mode="upsert", keys=["id"],
                        partitions=PARTITIONS, dead_letter=dead_letter)  # fmt: skip
    return open_sink(sink, PIPELINE)


def _write(spark: Any, sink: PostgresSink, *, dies: bool) -> None:
    df = spark.createDataFrame(ROWS, "id LONG, qty INT").repartition(PARTITIONS)
    batch = Batch(df, BatchInfo(PIPELINE, 1, "q"), "pg", f"fanout/{PIPELINE}/pg")
    if not dies:
        sink.write(batch)
        return

    def died(*_: Any) -> None:
        raise DriverDied()

    sink.after_partitions = died  # type: ignore[method-assign]
    try:
        with pytest.raises(DriverDied):
            sink.write(batch)
    finally:
        del sink.after_partitions


def _counted(url: str) -> list[tuple[Any, ...]]:
    return query(
        url,
        "SELECT count(*), sum(refused), count(kept_in), min(kept_in) FROM fanout.upsert_routes "
        "WHERE pipeline LIKE %s AND sink = 'pg' AND batch_id = 1",
        (f"{PIPELINE}%",),
    )


def test_a_replay_refusing_none_resets_the_count_its_first_attempt_left(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, DDL)
    dead = tmp_path / "dead"
    sink = _sink(pg_url, str(dead))
    try:
        _write(spark, sink, dies=True)
        assert _counted(pg_url) == [(PARTITIONS, 2, 0, None)]
        assert sink.holds_batch(PIPELINE, 0, 1) == PartlyHeld(PARTITIONS, PARTITIONS, letters=2)

        execute(pg_url, "ALTER TABLE items DROP CONSTRAINT positive")
        _write(spark, sink, dies=False)  # the replay: every row fits now
        assert _counted(pg_url) == [(PARTITIONS, 0, 0, None)]
        assert sink.holds_batch(PIPELINE, 0, 1) is True
    finally:
        sink.close()
    assert query(pg_url, "SELECT id, qty FROM items ORDER BY id") == ROWS
    assert refused_rows_held(DeltaDeadLetters(str(dead)), PIPELINE, "pg", (0, 1)) == 0


def test_refused_rows_kept_in_a_postgres_table_wait_for_no_driver(spark: Any, pg_url: str) -> None:
    execute(pg_url, DDL)
    sink = _sink(pg_url, "postgres:rejects")
    try:
        _write(spark, sink, dies=True)
        records = query(
            pg_url,
            "SELECT refused, kept_in FROM fanout.upsert_routes WHERE sink = 'pg' AND batch_id = 1",
        )
        assert len(records) == PARTITIONS and sum(r for r, _ in records) == 2
        assert [k for r, k in records if r] == ["rejects"] * sum(1 for r, _ in records if r)
        assert [k for r, k in records if not r] == [None] * sum(1 for r, _ in records if not r)
        assert sink.holds_batch(PIPELINE, 0, 1) is True
    finally:
        sink.close()
    assert query(pg_url, "SELECT (row->>'id')::int FROM rejects ORDER BY 1") == [(2,), (5,)]
