"""A batch carrying route letters has its markers read (and, on Tansu, its abandoned
transactions ended) once per attempt: :meth:`KafkaSink.check_replay`'s read is handed to
the write that follows it. Up to this version the write read them again. A read is never
used for another attempt or batch, nor by a write after one that failed before reading.
Unit tests of the driver's logic: the reads are counted by stand-ins, no broker (a local
Spark session for the batch)."""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any

import pytest
from fanout_kafka import KafkaSink, former_ids, renewal
from fanout_kafka import sink as sink_module

import fanout.partitioned.sink as kit
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.partitioned.membership import CommittedPartition


class Markers:
    """Stand-ins of the driver's marker reads: each read answers a new list (partition
    ``n`` holding the batch at the ``n``-th read), and what the write's membership check
    was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.checked: list[list[int]] = []
        self.spans: list[int] = []
        self.prefixes: list[str] = []  # the recorded prefix's reads: once per open()
        monkeypatch.setattr(sink_module, "end_abandoned_transactions", self.end)
        monkeypatch.setattr(sink_module, "read_committed", self.read)
        monkeypatch.setattr(sink_module, "record_span", self.span)
        # the prefix recorded is the one in use: nothing to fence, nothing recorded
        monkeypatch.setattr(former_ids, "recorded_prefix", self.prefix)
        monkeypatch.setattr(kit, "check_committed", self.check)
        # no broker: the marker groups' renewal would wait out its timeout at each try
        monkeypatch.setattr(renewal, "renew_markers", self.renew)

    def span(self, config: Any, settings: Any, partitions: int, first: Any = None) -> int:
        self.spans.append(partitions)  # recorded once per open() and scope, not per read
        return partitions

    def prefix(self, settings: Any, timeout_s: float) -> str:
        self.prefixes.append(str(settings.transactional_id_prefix))
        return self.prefixes[-1]

    def renew(self, settings: Any, span: int, batch_id: int, *, warn: bool) -> Any:
        return renewal.Renewal(renewed={})

    def end(self, settings: Any, partitions: int, batch_id: int) -> None:
        self.calls.append(f"end {batch_id}")

    def read(self, settings: Any, batch_id: int, span: int = 0) -> list[CommittedPartition]:
        self.calls.append(f"read {batch_id}")
        return [CommittedPartition(self.calls.count(f"read {batch_id}"))]

    def check(self, committed: Any, plan: Any, summary: Any, **named: Any) -> None:
        self.checked.append([c.partition for c in committed])


def tansu_sink() -> KafkaSink:
    """A sink as ``open()`` leaves it on Tansu (whose abandoned transactions it ends)."""
    sink = KafkaSink("events", bootstrap_servers="h:1", topic="t", key="id", partitions=2)
    sink.pipeline, sink.max_record_bytes = "pipe", 10_000
    sink.transactional_id_prefix = "fanout/pipe/events"
    sink._end_turns = "/tmp/turns-h-1"
    return sink


def batch_of(spark: Any, batch_id: int = 3) -> Batch:
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id LONG, v STRING")
    return Batch(df, BatchInfo("pipe", batch_id), "events", txn_app_id("pipe", "events"))


def test_the_write_after_check_replay_takes_its_read(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers, sink, batch = Markers(monkeypatch), tansu_sink(), batch_of(spark)
    sink.check_replay(batch)  # fanout's order: check, route letters, write
    sink.prepare_partitions(batch)
    assert markers.calls == ["end 3", "read 3"]
    assert markers.checked == [[1]]  # what check_replay read
    assert markers.spans == [2]


def test_a_read_is_never_used_for_another_attempt_or_batch(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers, sink, first = Markers(monkeypatch), tansu_sink(), batch_of(spark)
    sink.check_replay(first)
    second = replace(first, attempt=2)  # the route letters failed: a retry without check
    sink.prepare_partitions(second)
    sink.check_replay(second)
    sink.prepare_partitions(batch_of(spark, 4))  # not the checked batch
    sink.prepare_partitions(second)  # the read was dropped by the write before
    sink.check_replay(second)
    sink.prepare_partitions(second)  # taken
    sink.prepare_partitions(second)  # already taken: read again
    reads = ["end 3", "read 3"] * 3
    assert markers.calls == [*reads, "end 4", "read 4", *reads]
    assert markers.checked == [[2], [1], [4], [5], [6]]
    assert markers.spans == [2]  # one scope, one open(): recorded once
    assert markers.prefixes == ["fanout/pipe/events"]  # read once per open(), not per batch


def test_a_write_failing_before_its_read_leaves_nothing_for_the_next(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same Batch object written again (a sink called directly) after a write failed
    between taking the read and using it: the next write reads again."""
    markers, sink, batch = Markers(monkeypatch), tansu_sink(), batch_of(spark)
    sink.check_replay(batch)

    def down(*args: Any, **named: Any) -> None:
        raise OSError("the determinism check failed")

    with monkeypatch.context() as patched:
        patched.setattr(kit, "check_batch", down)
        with pytest.raises(OSError):
            sink.prepare_partitions(batch)
    sink.prepare_partitions(batch)
    sink.check_replay(batch)  # and the next attempt's read is taken again
    sink.prepare_partitions(batch)
    assert markers.calls == ["end 3", "read 3"] * 3
    assert markers.checked == [[2], [3]]


def test_a_sink_holding_a_read_pickles_without_it(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    Markers(monkeypatch)
    sink, batch = tansu_sink(), batch_of(spark)
    sink.check_replay(batch)
    clone = pickle.loads(pickle.dumps(sink))
    assert (getattr(clone, "_kit_read", None), clone.topic) == (None, "t")
    assert sink._kit_read is not None and sink._kit_read.committed == (CommittedPartition(1),)


def test_the_write_after_check_replay_builds_neither_input_nor_plan_again(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_replay makes the attempt's input (the routed batch, its columns checked) and
    its plan; the write takes them. Up to this version the Kafka sink's own check_replay
    kept only the markers it read, and the write made the input and the plan again."""
    Markers(monkeypatch)
    made: list[str] = []
    own_input, own_plan = KafkaSink.partition_input, kit.plan_of

    def partition_input(self: KafkaSink, batch: Batch) -> Any:
        made.append("input")
        return own_input(self, batch)

    def plan_of(*args: Any) -> Any:
        made.append("plan")
        return own_plan(*args)

    monkeypatch.setattr(KafkaSink, "partition_input", partition_input)
    monkeypatch.setattr(kit, "plan_of", plan_of)
    monkeypatch.setattr(sink_module, "plan_of", plan_of, raising=False)
    sink, batch = tansu_sink(), batch_of(spark)
    sink.check_replay(batch)
    prepared = sink.prepare_partitions(batch)
    assert made == ["input", "plan"]
    assert prepared.given.by == ["id"] and prepared.task.writer.batch_id == 3
