"""A task of the query a checkpoint reset replaced (a straggler) cannot commit its batch
once the new epoch's start fenced the replaced epoch's scope
(:meth:`fanout_kafka.KafkaSink.fence_earlier_epochs`, :mod:`fanout_kafka.fence`).

Before the fence existed, the transactional ids ``<prefix>-<p>`` (the same in every epoch)
fenced a straggler only when the new epoch's task of the same partition initialised its
producer: a straggler committing between the new epoch's ``holds_batch`` and that moment,
one on a partition the new epoch no longer has, and one starting after the new epoch's
tasks all wrote its records, and the new epoch wrote them again. The records are read
from the log's committed transactions (Tansu shows aborted ones to read_committed
readers)."""

from __future__ import annotations

import pickle
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.errors import EpochFencedError
from fanout_kafka.markers import FENCED_BIT
from fanout_kafka.transaction import PartitionWriter
from kafka_log import committed_records, committed_values
from kafkatools import Broker, marker, read_topic

from fanout import FanOut, UnmarkedBatchError, hookimpl
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import PartlyHeld, SinkContext
from fanout.partitioned.membership import MemberDigest, PartitionPlan
from fanout.partitioned.task import CommitHooks


def _sink(kafka: Broker, topic: str, pipeline: str, partitions: int) -> KafkaSink:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=partitions)  # fmt: skip
    sink.open(SinkContext(pipeline))
    return sink


def _settings(sink: KafkaSink, pipeline: str, epoch: int, batch_id: int) -> Any:
    info = BatchInfo(pipeline, batch_id, epoch=epoch)
    return sink.settings(Batch(None, info, "events", txn_app_id(pipeline, "events", epoch)))


def _rows(tag: str) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pylist([{"id": f"k{i}", "v": f"{tag}{i}"} for i in range(2)])]


def _write(settings: Any, partition: int, batch_id: int, tag: str, hooks: Any = None) -> Any:
    if hooks is not None:  # fenced mid-transaction, librdkafka's send_offsets_to_transaction
        settings = replace(settings, operation_timeout_s=2)  # waits out its whole timeout
    return PartitionWriter(settings, partition, batch_id, hooks).run(_rows(tag))


def _epoch_zero(sink: KafkaSink, pipeline: str, partitions: int) -> Any:
    """Batch 0 of epoch 0 committed in every partition, the span recorded as a write does."""
    settings = _settings(sink, pipeline, 0, 0)
    sink._partition_span(settings, partitions, 0)
    for p in range(partitions):
        assert _write(settings, p, 0, f"a{p}-").status == "committed"
    return _settings(sink, pipeline, 0, 1)


class _FenceBeforeCommit:
    """A commit hook: the new epoch's start (its fence, then its question whether the
    sink holds the replaced epoch's batch 1) while the straggler's transaction is open
    (its records produced and flushed, its marker not yet sent)."""

    def __init__(self, sink: KafkaSink, pipeline: str) -> None:
        self.sink, self.pipeline = sink, pipeline
        self.held: Any = "not asked"

    def before(self, partition: int, rows: int, written: int) -> None:
        self.sink.fence_earlier_epochs(self.pipeline, 1)
        self.held = self.sink.holds_batch(self.pipeline, 0, 1)

    def after(self, partition: int, rows: int, written: int) -> None:
        pass


def test_an_open_transaction_of_the_replaced_epoch_is_aborted_by_the_fence(
    kafka: Broker, topic: str
) -> None:
    """(a) The straggler's transaction is open when the new epoch starts: its commit fails,
    ``holds_batch`` says the replaced epoch's batch 1 is not there, and the new epoch
    writes it once."""
    pipeline = f"ef{uuid.uuid4().hex[:6]}"
    sink = _sink(kafka, topic, pipeline, 1)
    old = _epoch_zero(sink, pipeline, 1)
    start = _FenceBeforeCommit(sink, pipeline)
    straggler = _write(old, 0, 1, "s", start)
    assert start.held is False  # so the new epoch writes batch 1 (as it reads it again)
    assert _write(_settings(sink, pipeline, 1, 1), 0, 1, "n").status == "committed"
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"a0-0", b"a0-1", b"n0", b"n1"]
    assert (straggler.status, straggler.failure.kind) == ("failed", "fenced")
    assert sink.holds_batch(pipeline, 0, 1) is False
    if kafka.hides_aborted:  # Kafka: the aborted records are not read (Tansu shows them)
        read = read_topic(kafka.bootstrap, topic, 4)
        assert sorted(r["value"] for r in read) == ["a0-0", "a0-1", "n0", "n1"]
    # the replaced scope's fenced marker reads as before on the driver: batch 0 (no plan
    # offsets in these tests, so the count is unknown)
    assert sink.holds_batch(pipeline, 0, 0) == PartlyHeld(1, None)
    assert marker(kafka.bootstrap, f"{pipeline}@e1", "events", 0, "__fanout_markers") == 2


def test_a_straggler_starting_after_the_fence_writes_nothing(kafka: Broker, topic: str) -> None:
    """(b) A task of the replaced query that starts after the fence initialises its own
    producer (fencing nobody who matters) and then reads its marker: it refuses."""
    pipeline = f"ef{uuid.uuid4().hex[:6]}"
    sink = _sink(kafka, topic, pipeline, 2)
    old = _epoch_zero(sink, pipeline, 2)
    sink.fence_earlier_epochs(pipeline, 1)
    sink.fence_earlier_epochs(pipeline, 1)  # idempotent
    late = _write(old, 1, 1, "s")
    assert _write(_settings(sink, pipeline, 1, 1), 1, 1, "n").status == "committed"
    assert sorted(committed_values(kafka.bootstrap, topic)) == [
        b"a0-0", b"a0-1", b"a1-0", b"a1-1", b"n0", b"n1"
    ]  # fmt: skip
    assert (late.status, late.failure.kind, late.failure.transient) == ("failed", "error", False)
    assert "checkpoint reset replaced" in late.failure.message
    assert sink.holds_batch(pipeline, 0, 1) is False
    # the replaced query's driver, restarted on its checkpoint, is refused before writing
    batch = Batch(None, BatchInfo(pipeline, 1), "events", txn_app_id(pipeline, "events"))
    closed = r"p0', .*p1' in topic '__fanout_markers' are closed"
    with pytest.raises(EpochFencedError, match=closed) as refused:
        sink.committed_partitions(batch, PartitionPlan(2, (("id", "string"),)))
    # how to lift it, in calls an operator can make (the sink as configured, opened)
    assert f"sink.lift_epoch_fence({pipeline!r}, 1)" in str(refused.value)
    assert "events" in str(refused.value) and "batch 1" in str(refused.value)


def test_a_partition_beyond_the_new_count_is_fenced_too(kafka: Broker, topic: str) -> None:
    """(c) The replaced epoch wrote 3 partitions, the new one has 1: the straggler of
    partition 2 (open transaction, and one starting later) cannot commit either."""
    pipeline = f"ef{uuid.uuid4().hex[:6]}"
    old_sink = _sink(kafka, topic, pipeline, 3)
    old = _epoch_zero(old_sink, pipeline, 3)
    sink = _sink(kafka, topic, pipeline, 1)  # the new epoch's, with fewer partitions
    start = _FenceBeforeCommit(sink, pipeline)
    open_one = _write(old, 2, 1, "s", start)
    late = _write(old, 2, 1, "t")
    assert start.held is False
    assert _write(_settings(sink, pipeline, 1, 1), 0, 1, "n").status == "committed"
    assert sorted(committed_values(kafka.bootstrap, topic)) == [
        b"a0-0", b"a0-1", b"a1-0", b"a1-1", b"a2-0", b"a2-1", b"n0", b"n1"
    ]  # fmt: skip
    assert (open_one.status, open_one.failure.kind) == ("failed", "fenced")
    assert (late.status, late.failure.kind) == ("failed", "error")


def test_a_refused_start_lifts_the_fence(kafka: Broker, topic: str) -> None:
    """(d) The new epoch's start was refused after the fence: lifted, the replaced epoch's
    checkpoint completes its batch; its markers read as before the fence."""
    pipeline = f"ef{uuid.uuid4().hex[:6]}"
    sink = _sink(kafka, topic, pipeline, 2)
    old = _epoch_zero(sink, pipeline, 2)
    assert sink.holds_batch(pipeline, 0, 0) == PartlyHeld(2, None)
    sink.fence_earlier_epochs(pipeline, 1)
    assert sink.holds_batch(pipeline, 0, 0) == PartlyHeld(2, None)
    assert [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers") for p in (0, 1)] == [
        FENCED_BIT | 1, FENCED_BIT | 1,
    ]  # fmt: skip
    sink.lift_epoch_fence(pipeline, 1)
    sink.lift_epoch_fence(pipeline, 1)  # idempotent
    assert [_write(old, p, 1, f"r{p}-").status for p in (0, 1)] == ["committed", "committed"]
    assert [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers") for p in (0, 1)] == [
        2, 2,
    ]  # fmt: skip
    assert sorted(committed_values(kafka.bootstrap, topic)) == [
        b"a0-0", b"a0-1", b"a1-0", b"a1-1", b"r0-0", b"r0-1", b"r1-0", b"r1-1"
    ]  # fmt: skip


def test_a_new_epochs_start_through_fanout_closes_the_old_scope(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """Through :class:`fanout.FanOut`: the new checkpoint's first batch (batch 1's rows
    again) starts epoch 1, whose start fences the Kafka sink's epoch-0 scope before it asks
    ``holds_batch``; the replaced query's task of batch 1, shipped before that query
    failed and run after the start, writes nothing. (On the code before, its rows were in
    the topic twice.)"""
    pipeline = f"ef{uuid.uuid4().hex[:6]}"

    def fan(on_reset: str) -> FanOut:
        sinks = [{"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
                  "topic": topic, "key": "id", "value": "name", "partitions": 1}]  # fmt: skip
        return FanOut(
            pipeline, str(tmp_path / "ledger"), sinks, parallelism=1, retries=0,
            on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
        )  # fmt: skip

    def info(batch_id: int, query_id: str, end: int) -> BatchInfo:
        return BatchInfo(pipeline, batch_id, query_id, [{"orders": {"0": end}}],
                         batch_timestamp_ms=1000 + batch_id)  # fmt: skip

    rows = [(1, "m+1"), (2, "m+1")]
    old = fan("refuse")
    old.process(spark.createDataFrame([(0, "batch 0")], "id LONG, name STRING"), info(0, "q0", 1))
    sink = old.sinks["events"]
    frame = spark.createDataFrame(rows, "id LONG, name STRING")
    batch = Batch(frame, BatchInfo(pipeline, 1, "q0"), "events", txn_app_id(pipeline, "events"))
    straggler = pickle.loads(pickle.dumps(sink.partition_writer(batch, None)))
    new = fan("new_epoch")
    try:
        new.process(spark.createDataFrame(rows, "id LONG, name STRING"), info(1, "q1", 3))
        table = pa.Table.from_pylist([{"id": i, "name": n} for i, n in rows])
        outcome = straggler.write_partition(
            0, iter(table.to_batches()), CommitHooks(pipeline, "events", 1), MemberDigest()
        )
    finally:
        old.close()
        new.close()
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"batch 0", b"m+1", b"m+1"]
    assert (outcome.status, outcome.failure.kind) == ("failed", "error")
    assert "checkpoint reset replaced" in outcome.failure.message


def test_a_fence_lifted_after_failing_partway_opens_the_scope_as_it_was(
    kafka: Broker, topic: str
) -> None:
    """A fence that closed some partitions only (it failed at another: the start is
    refused) is lifted whole: the partitions fenced open again, the one it never reached
    left as it was, and a marker that had none before the fence (``FENCED_BIT | 0``, then
    ``0``) reads as none everywhere: ``holds_batch`` answers as before the fence and the
    replaced epoch's task writes batch 0 there (a marker is ``batch + 1``, never ``0``)."""
    pipeline = f"ef{uuid.uuid4().hex[:6]}"
    sink = _sink(kafka, topic, pipeline, 3)
    settings = _settings(sink, pipeline, 0, 0)
    sink._partition_span(settings, 3, 0)
    assert [_write(settings, p, 0, f"a{p}-").status for p in (0, 1)] == ["committed"] * 2
    before = sink.holds_batch(pipeline, 0, 0)
    assert before == PartlyHeld(2, None)
    fence = sink._scope_fence(pipeline, 1)
    fence._one(0, fence=True)
    fence._one(2, fence=True)  # partition 1 never reached
    markers = [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers") for p in range(3)]
    assert markers == [FENCED_BIT | 1, 1, FENCED_BIT]
    sink.lift_epoch_fence(pipeline, 1)
    markers = [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers") for p in range(3)]
    assert markers == [1, 1, 0]
    assert sink.holds_batch(pipeline, 0, 0) == before
    assert sink.holds_batch(pipeline, 0, 1) is False
    assert _write(settings, 2, 0, "a2-").status == "committed"
    old = _settings(sink, pipeline, 0, 1)
    assert [_write(old, p, 1, f"b{p}-").status for p in range(3)] == ["committed"] * 3
    markers = [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers") for p in range(3)]
    assert markers == [2, 2, 2]
    assert sorted(committed_values(kafka.bootstrap, topic)) == sorted(
        f"{tag}{p}-{i}".encode() for tag in "ab" for p in range(3) for i in range(2)
    )


def test_a_start_refused_by_a_fence_failing_part_way_lifts_it(
    kafka: Broker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new epoch's start (fanout's :func:`fanout.steps.unmarked.fence_epochs`) whose Kafka
    fence closes partitions 0 and 2 of the replaced scope and fails at 1 (the broker does
    not answer there): the start is refused and the fence lifted, so the replaced epoch's
    checkpoint, started again, writes its batch 1 in every partition. Before, the sink
    whose fence failed was not lifted: partitions 0 and 2 refused that batch (fenced)."""
    from fanout_kafka.fence import ScopeFence

    from fanout import TransientSinkError
    from fanout.ledger.memory import MemoryLedger
    from fanout.steps.unmarked import fence_epochs

    pipeline = f"ef{uuid.uuid4().hex[:6]}"
    sink = _sink(kafka, topic, pipeline, 3)
    old = _epoch_zero(sink, pipeline, 3)
    real = ScopeFence._transact

    def fails_at_one(self: ScopeFence, partition: int, *, fence: bool) -> None:
        if fence and partition == 1:
            raise TimeoutError("partition 1: the broker did not answer")
        real(self, partition, fence=fence)

    def markers() -> list[int]:
        return [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers")
                for p in range(3)]  # fmt: skip

    at_lift: list[list[int]] = []
    lift = sink.lift_epoch_fence

    def lift_seen(pipeline: str, epoch: int) -> None:
        at_lift.append(markers())
        lift(pipeline, epoch)

    monkeypatch.setattr(ScopeFence, "_transact", fails_at_one)
    monkeypatch.setattr(sink, "lift_epoch_fence", lift_seen)
    info = BatchInfo(pipeline, 1, "q1", epoch=0)
    with pytest.raises(TransientSinkError, match="partition 1: the broker did not answer"):
        fence_epochs(info, {"events": sink}, {}, MemoryLedger())
    assert [_write(old, p, 1, f"b{p}-").status for p in range(3)] == ["committed"] * 3
    assert at_lift == [[FENCED_BIT | 1, 1, FENCED_BIT | 1]]
    assert markers() == [2, 2, 2]
    assert sorted(committed_values(kafka.bootstrap, topic)) == sorted(
        f"{tag}{p}-{i}".encode() for tag in "ab" for p in range(3) for i in range(2)
    )


class _DriverKilled(BaseException):
    """The driver's death between the Kafka sink's commit of batch 1 and its mark."""


class _KillAfterWrite:
    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 1:
            raise _DriverKilled("killed between the write and the mark")


def test_a_start_refused_for_a_held_batch_fences_nothing(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replaced query committed batch 1 to the topic and died before its mark; a new
    checkpoint's start is refused (the sink holds batch 1) without fencing the replaced
    epoch's scope: its producer of transactional id ``<prefix>-0`` is not fenced, its
    marker never carries the fence bit, and the replaced query, started again on its
    checkpoint, writes batch 2 with the producer epochs of its own initialisations only.
    Before, the start fenced (marker ``FENCED_BIT | 2``, a producer initialised for the
    fence and one for the lift: two producer epochs more) and then lifted."""
    pipeline = f"ef{uuid.uuid4().hex[:6]}"
    fenced: list[int] = []
    real_fence = KafkaSink.fence_earlier_epochs

    def fence(self: KafkaSink, pipeline: str, epoch: int) -> None:
        real_fence(self, pipeline, epoch)
        fenced.append(marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers"))

    monkeypatch.setattr(KafkaSink, "fence_earlier_epochs", fence)

    def fan(on_reset: str, *plugins: object) -> FanOut:
        sinks = [{"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
                  "topic": topic, "key": "id", "value": "name", "partitions": 1}]  # fmt: skip
        return FanOut(
            pipeline, str(tmp_path / "ledger"), sinks, plugins=plugins, parallelism=1,
            retries=0, on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
        )  # fmt: skip

    def run(fan: FanOut, batch_id: int, query_id: str) -> None:
        info = BatchInfo(pipeline, batch_id, query_id, [{"orders": {"0": batch_id + 1}}],
                         batch_timestamp_ms=1000 + batch_id)  # fmt: skip
        frame = spark.createDataFrame([(batch_id, f"b{batch_id}")], "id LONG, name STRING")
        fan.process(frame, info)

    old = fan("refuse", _KillAfterWrite())
    try:
        run(old, 0, "q0")
        with pytest.raises(_DriverKilled):
            run(old, 1, "q0")
    finally:
        old.close()
    new = fan("new_epoch")
    try:
        with pytest.raises(UnmarkedBatchError) as refused:
            run(new, 1, "q1")
    finally:
        new.close()
    assert str(refused.value).startswith(
        f"pipeline {pipeline!r}: query q1 cannot start epoch 1: sink events holds batch 1 of "
        "epoch 0 by its own records"
    )
    assert fenced == []  # before: [FENCED_BIT | 2], lifted to 2 after
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 2
    again = fan("refuse")
    try:
        run(again, 2, "q0")
    finally:
        again.close()
    records = committed_records(kafka.bootstrap, topic, 3)
    assert sorted(r.value for r in records if r.value is not None) == [b"b0", b"b1", b"b2"]
    # the producer epoch of transactional id <prefix>-0 between batch 1's write and batch
    # 2's: the restart's own initialisations only, the end of the abandoned transactions
    # (Tansu), the markers' renewal (fanout_kafka.renewal) and the task's (before: 2 more,
    # the fence's and the lift's, which fenced any producer of the replaced query still open)
    epochs = {r.value: r.producer[1] for r in records if r.value is not None}
    assert epochs[b"b2"] - epochs[b"b1"] == 3  # before: 5
