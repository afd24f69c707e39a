"""Upsert mode: a route changed between a partial attempt (some partitions committed, then
a failure) and its replay. The upsert rewrites every row the new route keeps but removes
none, so a row the committed partitions hold that the new route refuses would end both in
the table and in the route's dead letters: the replay is refused before any letter is
written, naming both routes; the old route restored completes the batch exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchFailedError, BatchInfo, FanOut, RouteError
from fanout.routes.route import Route
from fanout.routes.settings import session_settings
from fanout.testing.faults import VetoOnce

SCHEMA = "id LONG, amount STRING"
BAD = {4: "abc", 17: "9z"}
ROWS = [{"id": i, "amount": BAD.get(i, str(i * 10))} for i in range(20)]
STRICT = ["id", "CAST(amount AS INT) AS amount"]
LENIENT = ["id", "TRY_CAST(amount AS INT) AS amount"]
ROWS_SQL = "SELECT id, amount FROM amounts ORDER BY id"
COMMITTED = [2, 4, 5, 8, 12, 14, 15, 16, 17, 18, 19]
"""The ids of partition 0 of 2 (hash of ``id``), which the first attempt commits."""


def _sink(url: str, select: list[str]) -> dict[str, Any]:
    return {"type": "postgres", "name": "pg", "url": url, "table": "amounts", "keys": ["id"],
            "partitions": 2, "dead_letter": "postgres:route_rejects",
            "select": select}  # fmt: skip


def test_a_replay_of_a_partial_upsert_under_a_route_refusing_committed_rows_is_refused(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The first attempt's route refuses no row (no letter, so no route recorded with
    letters); partition 1's commit is vetoed, partition 0 commits rows 4 and 17 (amount
    null). The restart's route refuses rows 4 and 17: its letters would put them in two
    places. Refused, naming the committed partition and both routes, nothing written."""
    execute(pg_url, "CREATE TABLE amounts (id bigint PRIMARY KEY, amount integer)")
    batch, info = spark.createDataFrame(ROWS, SCHEMA), BatchInfo("pgroute", 6, "q")
    ledger = str(tmp_path / "ledger")
    veto = VetoOnce(batch=6, partition=1, state=str(tmp_path / "veto.json"), sink="pg")
    with pytest.raises(BatchFailedError):
        FanOut("pgroute", ledger, [_sink(pg_url, LENIENT)], retries=0,
               plugins=[veto]).process(batch, info)  # fmt: skip
    partial = [(i, None if i in BAD else i * 10) for i in COMMITTED]
    assert query(pg_url, ROWS_SQL) == partial

    with pytest.raises(BatchFailedError) as failed:
        FanOut("pgroute", ledger, [_sink(pg_url, STRICT)], retries=0).process(batch, info)
    error = failed.value.failures["pg"]
    assert isinstance(error, RouteError) and (error.sink, error.batch_id) == ("pg", 6)
    settings = session_settings(batch)
    old, new = (Route(select=tuple(s)).stamp(settings) for s in (LENIENT, STRICT))
    assert str(error) == (
        f"sink 'pg', batch 6: the route changed mid-batch: partition(s) [0] committed this "
        f"batch under {old.text} (fingerprint {old.fingerprint}), but the sink's route is "
        f"now {new.text} (fingerprint {new.fingerprint}). An upsert rewrites the rows the "
        "route keeps but deletes none, so a row those partitions hold that the new route "
        "refuses would be both in the table and in the dead letters, and one it leaves out "
        "would stay in the table. Nothing was written. Restore the old route (its "
        "expressions and the Spark settings it names) until this batch completes, then "
        "change it (a change between batches is safe)"
    )
    assert query(pg_url, "SELECT count(*) FROM route_rejects") == [(0,)]
    assert query(pg_url, ROWS_SQL) == partial

    result = FanOut("pgroute", ledger, [_sink(pg_url, LENIENT)], retries=0).process(batch, info)
    assert (result["pg"].rows, result["pg"].dead_lettered) == (20, 0)
    assert query(pg_url, ROWS_SQL) == [(i, None if i in BAD else i * 10) for i in range(20)]
    assert query(pg_url, "SELECT count(*) FROM route_rejects") == [(0,)]
