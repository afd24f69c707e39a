"""The partitioned-sink kit's ``check_replay`` makes the sink's partition input and its plan
and reads the committed partitions; the write of the same attempt takes all three instead
of computing them again (up to this version it made the input and the plan twice). A
write of another attempt or batch, a second write, or one after the sink's preflight
dropped the read (:meth:`PartitionedSink.forget_replay_read`) computes them anew. The
driver's side only: real local Spark for the batch, the sink of
tests/integration/kit_route_sink.py, counted calls."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import fanout.partitioned.sink as kit
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.partitioned.membership import PartitionPlan
from fanout.partitioned.sink import PartitionedSink, PartitionInput
from tests.integration.kit_route_sink import RouteRecordingSink


class Counted:
    """Counts the kit's calls of :meth:`PartitionedSink.partition_input` and ``plan_of``,
    each with the batch id it was made for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        made_input, made_plan = PartitionedSink.partition_input, kit.plan_of

        def partition_input(sink: PartitionedSink, batch: Batch) -> PartitionInput:
            self.calls.append(f"input {batch.batch_id}")
            return made_input(sink, batch)

        def plan_of(df: Any, by: Any, partitions: int) -> PartitionPlan:
            self.calls.append("plan")
            return made_plan(df, by, partitions)

        monkeypatch.setattr(PartitionedSink, "partition_input", partition_input)
        monkeypatch.setattr(kit, "plan_of", plan_of)


def sink_in(tmp_path: Path) -> RouteRecordingSink:
    directory = tmp_path / "out"
    directory.mkdir()
    return RouteRecordingSink("s", directory=str(directory), partitions=3)


def batch_of(spark: Any, batch_id: int = 3) -> Batch:
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, v STRING")
    return Batch(df, BatchInfo("pipe", batch_id), "s", txn_app_id("pipe", "s"))


def test_the_write_after_check_replay_computes_nothing_again(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted, sink, batch = Counted(monkeypatch), sink_in(tmp_path), batch_of(spark)
    sink.check_replay(batch)  # fanout's order: check, route letters, write
    read = sink._kit_read
    assert read is not None
    prepared = sink.prepare_partitions(batch)
    assert counted.calls == ["input 3", "plan"]
    assert sink.mark_reads == 1
    assert prepared.given is read.given
    assert prepared.task.writer.plan == read.plan == PartitionPlan(3, (("id", "bigint"),))


def test_other_attempts_batches_and_later_writes_compute_anew(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted, sink, first = Counted(monkeypatch), sink_in(tmp_path), batch_of(spark)
    sink.check_replay(first)
    second = replace(first, attempt=2)  # the route letters failed: a retry without check
    sink.prepare_partitions(second)
    sink.check_replay(second)
    sink.prepare_partitions(batch_of(spark, 4))  # not the checked batch: read dropped
    sink.prepare_partitions(second)
    sink.check_replay(second)
    sink.prepare_partitions(second)  # taken
    sink.prepare_partitions(second)  # already taken: computed again
    made = ["input 3", "plan"]
    assert counted.calls == [*made * 3, "input 4", "plan", *made * 3]
    assert sink.mark_reads == 7


def test_a_preflight_that_forgets_the_read_makes_the_write_compute_anew(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted, sink, batch = Counted(monkeypatch), sink_in(tmp_path), batch_of(spark)
    monkeypatch.setattr(sink, "preflight", lambda batch: sink.forget_replay_read())
    sink.check_replay(batch)
    sink.prepare_partitions(batch)
    assert counted.calls == ["input 3", "plan"] * 2
    assert sink.mark_reads == 2
