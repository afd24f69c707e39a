"""Ordinary operator actions on a PostgreSQL target between a crash and its replay (the
partitions committed, the ledger mark lost): a table rewritten in place (``VACUUM FULL``,
``CLUSTER``: a new relfilenode, the same OID), its indexes rebuilt (``REINDEX``) or the
upsert keys' unique index dropped and made again under another name, and ``fanout
migrate`` run again. None is refused, and the replay and the next batch leave each id once
in the table and each refused row once in the dead letters: the progress marks and
``upsert_routes`` rows record the table's OID, which none of these changes, and an upsert
finds its arbiter index by its columns, not its name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg2
import pytest
from pgcheck import dsn, execute, query

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.testing.faults import MarkLost

pytestmark = pytest.mark.integration

ACTIONS = {
    "vacuum_full": ["VACUUM FULL t1"],
    "cluster": ["CLUSTER t1 USING t1_id"],
    "reindex": ["REINDEX TABLE t1"],
    "index_made_again": ["DROP INDEX t1_id", "CREATE {unique} INDEX t1_id_again ON t1 (id)"],
}


def _autocommit(url: str, *statements: str) -> None:
    conn = psycopg2.connect(dsn(url))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def _fan(url: str, ledger: Any, mode: str) -> FanOut:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "t1", "mode": mode,
            "keys": ["id"], "partitions": 2, "dead_letter": "postgres:rejects"}  # fmt: skip
    return FanOut("ops", ledger, [sink], retries=0)


def _rows(spark: Any, batch: int) -> Any:
    """Ids ``10 * batch`` to ``10 * batch + 5``, the one ending in 2 refused by the CHECK."""
    return spark.range(10 * batch, 10 * batch + 6).selectExpr(
        "id", "CAST(IF(id % 10 = 2, -1, id) AS INT) AS v"
    )


@pytest.mark.parametrize("mode", ["append", "upsert"])
@pytest.mark.parametrize("action", [*ACTIONS, "migrate"])
def test_an_action_between_a_crash_and_its_replay_writes_each_row_once(
    spark: Any, pg_url: str, tmp_path: Path, mode: str, action: str
) -> None:
    unique = "UNIQUE" if mode == "upsert" else ""  # append: a duplicate would be a 2nd row
    execute(pg_url, "CREATE TABLE t1 (id bigint, v int CHECK (v >= 0))",
            f"CREATE {unique} INDEX t1_id ON t1 (id)")  # fmt: skip
    ledger = str(tmp_path / "ledger")
    fan = _fan(pg_url, ledger, mode)
    fan.process(_rows(spark, 0), BatchInfo("ops", 0, "q"))
    fan.close()
    with pytest.raises(BatchFailedError):  # the driver "dies" before the mark
        _fan(pg_url, MarkLost(ledger, "pg"), mode).process(
            _rows(spark, 1), BatchInfo("ops", 1, "q")
        )
    oid = query(pg_url, "SELECT 't1'::regclass::oid::bigint")[0][0]
    if action == "migrate":
        from fanout.app.cli import main

        assert main(["migrate", "--url", pg_url]) == 0
    else:
        _autocommit(pg_url, *(sql.format(unique=unique) for sql in ACTIONS[action]))
    assert query(pg_url, "SELECT 't1'::regclass::oid::bigint")[0][0] == oid
    fan = _fan(pg_url, ledger, mode)
    try:
        replay = fan.process(_rows(spark, 1), BatchInfo("ops", 1, "q"))["pg"]
        fan.process(_rows(spark, 2), BatchInfo("ops", 2, "q"))
    finally:
        fan.close()
    if mode == "append":  # every partition was marked: skipped, letters kept by the marks
        assert replay.details["skipped_partitions"] == [0, 1]
    ids = [row[0] for row in query(pg_url, "SELECT id FROM t1 ORDER BY id")]
    assert ids == [0, 1, 3, 4, 5, 10, 11, 13, 14, 15, 20, 21, 23, 24, 25]
    letters = query(pg_url, "SELECT batch_id, (row->>'id')::int FROM rejects ORDER BY 1, 2")
    assert letters == [(0, 2), (1, 12), (2, 22)]


def test_a_truncate_between_a_crash_mid_batch_and_its_replay_writes_the_rest_once(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Batch 1's partition 0 committed into ``t1``, partition 1 aborted; ``TRUNCATE t1``
    (a new relfilenode, the same OID) before the replay. The replay is not refused, skips
    partition 0 (the operator's deletion stands) and writes partition 1's rows once."""
    from fanout.testing.faults import VetoOnce

    execute(pg_url, "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    sink = {"type": "postgres", "name": "pg", "url": pg_url, "table": "t1", "mode": "append",
            "partitions": 2}  # fmt: skip
    veto = VetoOnce(batch=1, partition=1, state=str(tmp_path / "veto"), sink="pg")
    first = FanOut("ops", ledger, [sink], retries=0, plugins=[veto])
    with pytest.raises(BatchFailedError):
        first.process(spark.range(0, 8), BatchInfo("ops", 1, "q"))
    first.close()
    partial = [row[0] for row in query(pg_url, "SELECT id FROM t1 ORDER BY id")]
    assert 0 < len(partial) < 8, partial
    execute(pg_url, "TRUNCATE t1")
    again = FanOut("ops", ledger, [sink], retries=0)
    result = again.process(spark.range(0, 8), BatchInfo("ops", 1, "q"))["pg"]
    again.close()
    assert result.details["skipped_partitions"] == [0]
    rest = [row[0] for row in query(pg_url, "SELECT id FROM t1 ORDER BY id")]
    assert rest == sorted(set(range(8)) - set(partial))
