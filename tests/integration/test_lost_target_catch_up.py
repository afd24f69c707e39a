"""A lagging sink's catch-up is a write too: the lost-target check (docs/architecture.md
§5, "A target lost behind fanout's back") runs before it. A restart with no new data runs
no batch, so ``fan.start_catch_up(query)`` would otherwise write the spooled batches into
a target recreated empty (the first write creates it: ``create_topic``, ``create_table``,
the Delta sink) with no question asked, and the next run's check would find them held.
A lagging sink (``on_failure="lag"``) whose target was lost lags with the error, never
written, and the other sinks go on; a sink without it keeps the catch-up for the first
batch, which refuses the run. Real Spark, a real checkpoint, a real spool and Delta
ledger."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut, SinksBehindError, SinkWriteError, TargetLostError
from fanout.contract.sink import Batch, SinkResult
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.testing import RecordingSink
from tests.integration.streams import (
    SCHEMA,
    committed_marks,
    delta_rows,
    run_stream,
    write_input,
)


class _Target(RecordingSink):
    """A recording sink down from batch ``down_from`` on; its target is its own memory,
    so a new instance is the target deleted and created again empty."""

    def __init__(self, name: str, *, down_from: int | None) -> None:
        super().__init__(name)
        self.down_from = down_from
        self.asked: list[int] = []

    def write(self, batch: Batch) -> SinkResult:
        if self.down_from is not None and batch.batch_id >= self.down_from:
            raise SinkWriteError("the target is down", sink=self.name, batch_id=batch.batch_id)
        return super().write(batch)

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        self.asked.append(batch_id)
        return batch_id in self.batches


def _fan(tmp_path: Path, copy: _Target, probe_interval_s: float = 3600) -> FanOut:
    return FanOut(
        "lost", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         SinkSpec(copy, lag=lag_policy("copy", {"on_failure": "lag"}))],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=probe_interval_s,
    )  # fmt: skip


def _start(spark: Any, tmp_path: Path, fan: FanOut) -> str | None:
    """Start the query again on the same checkpoint (no new data: no batch runs) and
    ``fan.start_catch_up`` beside it; its reason, after a catch-up started then would have
    written the spooled batches."""
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
    query = (
        stream.json(str(tmp_path / "input"))
        .writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        reason = fan.start_catch_up(query)
        time.sleep(5)  # a catch-up thread started would have written batches 2 and 3 by now
    finally:
        query.stop()
    return reason


def _first_run(spark: Any, tmp_path: Path, down_from: int) -> tuple[_Target, Counter[Any]]:
    write_input(tmp_path / "input", 4, 3)
    copy = _Target("copy", down_from=down_from)
    first = _fan(tmp_path, copy)
    try:
        run_stream(spark, tmp_path / "input", first, tmp_path / "checkpoint")
    finally:
        first.close()
    marks = Counter({("lake", b): 1 for b in range(4)}) + Counter(
        {("copy", b): 1 for b in range(down_from)}
    )
    assert committed_marks(tmp_path / "ledger", "lost") == marks
    return copy, marks


def test_the_catch_up_started_with_the_query_writes_nothing_into_a_lost_target(
    spark: Any, tmp_path: Path
) -> None:
    _, marks = _first_run(spark, tmp_path, down_from=2)

    lost = _Target("copy", down_from=None)  # deleted and created again empty: holds nothing
    fan = _fan(tmp_path, lost, probe_interval_s=0.5)  # the thread tries it again and again
    try:
        reason = _start(spark, tmp_path, fan)
        lag = fan.lagging.lag_of("copy")
    finally:
        fan.close()

    assert lost.calls == []
    assert lost.asked == [1]
    assert reason is None  # the catch-up started, for every sink but the lost one
    assert (lag.state, lag.batches) == ("lagging", 2)
    assert lag.error is not None and lag.error.startswith(
        "TargetLostError: sink 'copy', batch 1: pipeline 'lost': its target no longer holds "
        "batch 1 of epoch 0"
    ), lag.error
    assert committed_marks(tmp_path / "ledger", "lost") == marks
    refused = [  # the thread did try it: its refusal, recorded once, at its next batch
        (r["batch_id"], r["error"].split(":")[0])
        for r in delta_rows(tmp_path / "ledger")
        if r["sink"] == "copy" and r["status"] == "failed" and "TargetLost" in r["error"]
    ]
    assert refused == [(2, "TargetLostError")], refused


def test_a_lost_target_of_a_sink_without_lag_keeps_the_catch_up_for_the_first_batch(
    spark: Any, tmp_path: Path
) -> None:
    copy, marks = _first_run(spark, tmp_path, down_from=2)
    shutil.rmtree(tmp_path / "lake")  # the Delta sink's table, deleted: it refuses the run

    copy.down_from = None  # its target up again, holding batches 0 and 1
    fan = _fan(tmp_path, copy)
    try:
        reason = _start(spark, tmp_path, fan)
        with pytest.raises(TargetLostError) as refused:  # nor does the final catch-up write
            fan.final_catch_up()
    finally:
        fan.close()

    assert (refused.value.sink, refused.value.batch_id) == ("lake", 3)
    assert copy.calls == [(0, 1), (1, 1)]  # the first run's writes only
    assert reason is not None and "no longer holds batch 3 of epoch 0" in reason, reason
    assert reason.startswith("sink 'lake', batch 3: "), reason
    assert committed_marks(tmp_path / "ledger", "lost") == marks


def test_the_final_catch_up_of_a_run_without_a_batch_writes_nothing_into_a_lost_target(
    spark: Any, tmp_path: Path
) -> None:
    write_input(tmp_path / "input", 3, 3)
    first = _fan(tmp_path, _Target("copy", down_from=1))
    try:
        run_stream(spark, tmp_path / "input", first, tmp_path / "checkpoint")
    finally:
        first.close()

    lost = _Target("copy", down_from=None)
    fan = _fan(tmp_path, lost)
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")  # no new batch
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up()
    finally:
        fan.close()

    assert lost.calls == []
    assert "TargetLostError: sink 'copy', batch 0: " in str(behind.value)
    assert "no longer holds batch 0 of epoch 0" in str(behind.value)
    assert "Not written by the next run until you act: copy" in str(behind.value)
    assert committed_marks(tmp_path / "ledger", "lost") == Counter(
        {("lake", 0): 1, ("lake", 1): 1, ("lake", 2): 1, ("copy", 0): 1}
    )
