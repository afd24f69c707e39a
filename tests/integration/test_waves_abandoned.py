"""A timed partitioned write runs in waves (:mod:`fanout.partitioned.waves`): abandoned
at its ``write_timeout_s`` between two waves (the driver between two jobs: the one it
cancelled had ended, the next not yet begun, so nothing was running to cancel), it must
start no further wave. Before, the next wave ran uncancelled, committing partitions for
a write the batch had gone on without (and, on a hung target, holding its cores until
the target answered, the catch-up waiting for it meanwhile)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.functions import spark_partition_id

import fanout.partitioned.waves as waves
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.errors import SinkTimeoutError
from fanout.steps.timeout import AbandonedWrites, TimedWrite, WriteClaim
from tests.integration.kit_route_sink import RouteRecordingSink

PIPELINE = "waves"


class Runner:
    """The sink's write of the batch, once (what :class:`fanout.steps.write.SinkRunner`
    runs, without retries or marks)."""

    def __init__(self, sink: RouteRecordingSink, batch: Batch) -> None:
        self.sink, self.batch = sink, batch
        self.claim: WriteClaim | None = None
        self.attempt = 1

    def run(self) -> Any:
        return self.sink.write(self.batch)

    def timed_out(self, error: Exception) -> None:
        pass


def _committed(directory: Path) -> dict[int, list[int]]:
    """The ids each committed partition file holds, by partition."""
    found = {}
    for path in directory.glob("*.json"):
        partition = int(path.stem.rsplit("-", 1)[1])
        found[partition] = sorted(row["id"] for row in json.loads(path.read_text())["rows"])
    return found


def test_a_write_abandoned_between_two_waves_starts_no_further_wave(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert spark.sparkContext.master == "local[2]"  # a budget of 1: one partition a wave
    directory = tmp_path / "parts"
    sink = RouteRecordingSink("files", directory=str(directory), partitions=2)
    sink.open(SinkContext(PIPELINE))
    df = spark.createDataFrame([(i,) for i in range(20)], "id long")
    batch = Batch(df, BatchInfo(PIPELINE, 3), "files", txn_app_id(PIPELINE, "files"))
    run_job = waves._run_job
    timed: list[TimedWrite] = []
    ran: list[list[int]] = []

    def first_then_deadline(rdd: Any, partitions: list[int]) -> list[Any]:
        rows = run_job(rdd, partitions)
        ran.append(partitions)
        if len(ran) == 1:  # the deadline passes now, between this wave and the next
            assert isinstance(timed[0].give_up(), SinkTimeoutError)
        return rows

    monkeypatch.setattr(waves, "_run_job", first_then_deadline)
    abandoned = AbandonedWrites(PIPELINE)
    runner = Runner(sink, batch)
    timed.append(TimedWrite.start(runner, 120.0, abandoned, lambda fn: fn))
    assert timed[0].done.wait(120)
    assert ran == [[0]]  # partition 1's wave never started
    first = df.repartition(2, "id").where(spark_partition_id() == 0).collect()
    assert _committed(directory) == {0: sorted(row.id for row in first)}
    error = timed[0].future.exception()
    assert isinstance(error, SinkTimeoutError)
    assert str(error) == (
        "sink 'files', batch 3: abandoned at its write_timeout_s after partitions [0] of 0..1 "
        "were written: partitions [1] were not started (the catch-up writes the batch from "
        "the spool, skipping those written)"
    )
