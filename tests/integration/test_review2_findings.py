"""Review 2 (adversarial), the holes that need real Spark: each a strict expected failure
until it is fixed."""

from __future__ import annotations

import io
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
    started, done = threading.Event(), threading.Event()

    def slow(df: Any, batch_id: int) -> None:
        started.set()
        time.sleep(BATCH_S)
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
        query.stop()


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
