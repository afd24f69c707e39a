"""Review 2 (adversarial), the holes that need real Spark: each a strict expected failure
until it is fixed."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

from fanout.app import runner
from fanout.app.config import PipelineConfig
from fanout.contract.batch import BatchInfo

BATCH_S = 30.0  # how long the batch in flight takes
STOP_TIMEOUT_S = 2.0


def test_finding7_a_stop_after_its_timeout_still_waits_for_the_batch(
    spark: Any, tmp_path: Path
) -> None:
    started, done, release = threading.Event(), threading.Event(), threading.Event()

    def slow(df: Any, batch_id: int) -> None:
        started.set()
        release.wait(BATCH_S)  # released once checked, so the test need not wait it out
        done.set()

    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        .writeStream.foreachBatch(slow)
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    )  # fmt: skip
    try:
        assert started.wait(120)
        tracker = runner.BatchTracker()
        tracker.in_flight = 0  # as fanout_batch_start leaves it
        tracker.idle.clear()
        config = PipelineConfig("p", str(tmp_path / "ledger"), str(tmp_path / "cp"), {}, [],
                                stop_timeout_s=STOP_TIMEOUT_S)  # fmt: skip
        out = io.StringIO()
        clock = time.monotonic()
        runner._stop(query, tracker, config, "SIGTERM", out)
        took = time.monotonic() - clock
        said = out.getvalue()
        assert took < STOP_TIMEOUT_S + 10 and not ("abandoned" in said and done.is_set()), (
            f"with stop_timeout_s={STOP_TIMEOUT_S:g} the stop took {took:.0f} s (the batch "
            f"takes {BATCH_S:g} s; finished: {done.is_set()}) and said:\n{said}"
        )
    finally:
        release.set()
        query.stop()


# -- finding 5: a backfill gives the new sink the rows its source dead-lettered too ---------

SCHEMA = "id LONG, k STRING, amount DECIMAL(10,2), at TIMESTAMP"


def test_finding5_a_backfill_gives_the_new_sink_the_rows_its_source_dead_lettered(
    spark: Any, tmp_path: Path
) -> None:
    from datetime import UTC, datetime
    from decimal import Decimal

    from fanout import BatchInfo, FanOut
    from fanout.ledger.delta import DeltaLedger
    from tests.integration.streams import delta_rows

    ledger = str(tmp_path / "ledger")
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake"),
            "partition_by": ["k"], "dead_letter": str(tmp_path / "dead")}  # fmt: skip
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
            "backfill_from": "lake"}  # fmt: skip
    at = datetime(2024, 5, 1, 8, 0, 0, 123456, tzinfo=UTC)
    rows = {
        0: [(1, "a", Decimal("1.50"), at), (2, "", Decimal("2.25"), at)],  # 2: set aside
        1: [],  # empty: the lake's table has no commit of it
        2: [(3, "", Decimal("-3.00"), None)],  # every row set aside: no commit either
        3: [(4, "b", None, at)],
        4: [(5, "c", Decimal("5.05"), at)],
    }

    def process(fan: FanOut, batch: int) -> None:
        fan.process(spark.createDataFrame(rows[batch], SCHEMA), BatchInfo("bf", batch, "q"))

    first = FanOut("bf", ledger, [lake], backoff_s=0)
    try:
        for batch in range(4):
            process(first, batch)
    finally:
        first.close()
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == [1, 4]
    letters = sorted((r["batch_id"], r["row"]) for r in delta_rows(tmp_path / "dead"))
    assert [(b, json.loads(row)["id"]) for b, row in letters] == [(0, 2), (2, 3)]

    fan = FanOut("bf", ledger, [lake, copy], backoff_s=0, spool=str(tmp_path / "spool"))
    try:
        process(fan, 4)
        assert fan.catch_up(timeout_s=120)["copy"].state == "live"
    finally:
        fan.close()
    every = sorted(
        ({"id": i, "k": k, "amount": a, "at": t} for b in rows.values() for i, k, a, t in b),
        key=lambda r: r["id"],
    )
    got = sorted(delta_rows(tmp_path / "copy"), key=lambda r: r["id"])
    assert got == every, "the copy must receive every row of each batch, the lake's letters too"
    marks = sorted(
        (e.batch_id, e.rows)
        for e in DeltaLedger(ledger).committed_entries("bf")
        if e.sink == "copy"
    )
    assert marks == [(0, 2), (1, 0), (2, 1), (3, 1), (4, 1)]


def test_a_stop_waits_for_a_batch_that_finishes_within_its_timeout(
    spark: Any, tmp_path: Path
) -> None:
    """The other side of finding 7: a batch that ends before stop_timeout_s is waited for,
    the query stops (Spark's next batch, if it began, is short) and the run says so."""
    tracker = runner.BatchTracker()
    started, done = threading.Event(), threading.Event()

    def batch(df: Any, batch_id: int) -> None:
        info = BatchInfo("p", batch_id, "q")
        tracker.fanout_batch_start(info, ["a"], [])
        if batch_id == 0:
            started.set()
            time.sleep(3)
            done.set()
        tracker.fanout_batch_end(info, {})

    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    )  # fmt: skip
    try:
        assert started.wait(120)
        config = PipelineConfig("p", str(tmp_path / "ledger"), str(tmp_path / "cp"), {}, [],
                                stop_timeout_s=60)  # fmt: skip
        out = io.StringIO()
        clock = time.monotonic()
        outcome = runner._stop(query, tracker, config, "SIGTERM", out)
        took = time.monotonic() - clock
        assert (outcome, done.is_set(), query.isActive) == ("finished", True, False)
        assert took < 20, took
        assert out.getvalue().splitlines()[1] == "SIGTERM: batch 0 finished; stopped cleanly"
    finally:
        query.stop()
