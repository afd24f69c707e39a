"""Two attempts of one partition at once (Spark speculation: the original, slow, and its
copy on another executor): whichever ends first, its outcome is the partition's fate, so
an original that the copy fenced must not report a failure when the copy commits the
batch. Seen on a standalone cluster with ``spark.speculation``: the original, fenced while
it waited before its commit, reported "ran 72.0 s, longer than transaction_timeout_ms"
while its copy committed the partition, and the batch failed (not transient)."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from fanout_kafka import KafkaSink
from fanout_kafka.records import BadRecord, Record
from fanout_kafka.settings import WriterSettings
from fanout_kafka.transaction import PartitionWriter
from kafkatools import Broker, marker, read_topic

from fanout import hookimpl
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.partitions import PartitionCommit
from fanout.contract.sink import SinkContext
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.task import CommitHooks


class SlowBeforeCommit:
    """Holds a partition's transaction open ``seconds`` just before its commit (a
    straggler: a long GC pause, a busy executor)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @hookimpl
    def fanout_partition_commit(self, commit: PartitionCommit) -> None:
        """Sleep, the transaction open."""
        time.sleep(self.seconds)


def _settings(kafka: Broker, topic: str, **changes: object) -> tuple[str, WriterSettings]:
    pipeline = f"s{uuid.uuid4().hex[:6]}"
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=1)  # fmt: skip
    sink.open(SinkContext(pipeline))
    batch = Batch(None, BatchInfo(pipeline, 0), "events", txn_app_id(pipeline, "events"))
    return pipeline, replace(sink.settings(batch), **changes)


def _records(settings: WriterSettings, tag: str) -> tuple[list[Record], list[BadRecord]]:
    return settings.encoder.encode_all([{"id": f"k{i}", "v": tag} for i in range(5)])


def test_a_straggler_whose_copy_committed_while_it_waited_is_skipped(
    kafka: Broker, topic: str
) -> None:
    # operation_timeout_s: Tansu holds a fenced producer's request (its abort) that long
    pipeline, settings = _settings(
        kafka, topic, transaction_timeout_ms=1000, operation_timeout_s=1.0
    )
    hooks = CommitHooks(pipeline, "events", 0, plugins=[SlowBeforeCommit(2.0)])
    original = PartitionWriter(settings, partition=0, batch_id=0, hooks=hooks)
    assert original.prepare() is False
    copy = PartitionWriter(settings, partition=0, batch_id=0)

    def copy_writes() -> None:
        time.sleep(0.5)  # the original is in its transaction, waiting before its commit
        done = copy.run([pa_batch("copy")])
        assert (done.status, done.written) == ("committed", 5)

    thread = threading.Thread(target=copy_writes)
    thread.start()
    records, bad = _records(settings, "original")
    # outlived transaction_timeout_ms (and was fenced): but its copy holds the batch
    late = original.write(records, bad, prepared=True)
    thread.join()
    # the copy committed it while the original ran: written in this write, not before it
    assert (late.status, late.written, late.failure, late.rival) == ("skipped", 0, None, True)
    assert committed(kafka, topic) == [(f"k{i}", "copy") for i in range(5)]
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 1
    # a replay finds it committed before it began: no rival's
    replay = PartitionWriter(settings, partition=0, batch_id=0).run([pa_batch("replay")])
    assert (replay.status, replay.rival) == ("skipped", False)


@pytest.mark.parametrize("speculation", [True, None])  # on, or not known: a copy may run
def test_an_original_fenced_by_a_copy_still_writing_waits_for_its_commit(
    kafka: Broker, topic: str, speculation: bool | None
) -> None:
    # operation_timeout_s: Tansu holds a fenced producer's request up to that long
    pipeline, settings = _settings(
        kafka, topic, transaction_timeout_ms=20_000, operation_timeout_s=1.0,
        speculation=speculation,
    )  # fmt: skip
    original = PartitionWriter(settings, partition=0, batch_id=0)
    assert original.prepare() is False
    copy = PartitionWriter(settings, partition=0, batch_id=0)
    assert copy.prepare() is False  # fences the original; commits 3 s later
    copy_records, copy_bad = _records(settings, "copy")
    outcomes: list[PartitionOutcome] = []

    def copy_commits() -> None:
        time.sleep(3.0)
        outcomes.append(copy.write(copy_records, copy_bad, prepared=True))

    thread = threading.Thread(target=copy_commits)
    thread.start()
    records, bad = _records(settings, "original")
    started = time.monotonic()
    late = original.write(records, bad, prepared=True)  # fenced at once
    waited = time.monotonic() - started
    thread.join()
    assert [(o.status, o.written) for o in outcomes] == [("committed", 5)]
    assert (late.status, late.written, late.failure, late.rival) == ("skipped", 0, None, True)
    assert 2.0 < waited < 20.0
    assert committed(kafka, topic) == [(f"k{i}", "copy") for i in range(5)]
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 1


def test_a_fenced_attempt_without_a_possible_rival_fails_at_once(kafka: Broker, topic: str) -> None:
    """Speculation off and the first attempt (here: no task at all, as on the driver):
    nothing Spark runs can commit the partition, so the fencing is not waited out
    (``transaction_timeout_ms``, here 20 s) but reported at once, saying where it came from."""
    pipeline, settings = _settings(
        kafka, topic, transaction_timeout_ms=20_000, operation_timeout_s=1.0, speculation=False
    )
    lone = PartitionWriter(settings, partition=0, batch_id=0)
    assert lone.prepare() is False
    outsider = Producer(settings.producer_config(0))  # same transactional id, not Spark's
    outsider.init_transactions(10)  # the epoch bumped: the attempt is fenced
    records, bad = _records(settings, "lone")
    started = time.monotonic()
    failed = lone.write(records, bad, prepared=True)
    took = time.monotonic() - started
    assert failed.failure is not None
    assert (failed.status, failed.failure.kind, failed.failure.transient) == (
        "failed", "fenced", False
    )  # fmt: skip
    assert took < 6.0, took
    assert (
        "; no other attempt of this partition can be running (the driver, spark.speculation "
        "off), so no rival's commit was waited for" in failed.failure.message
    )
    assert f"transactional id 'fanout/{pipeline}/events-0'" in failed.failure.message
    assert committed(kafka, topic) == []
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == -1001


def test_a_task_reads_its_attempt_number(spark: Any) -> None:
    """Inside a Spark task (a Python worker), as a fenced partition asks it."""
    from fanout_kafka.rivals import task_attempt

    rdd = spark.sparkContext.parallelize([0, 1], 2)
    assert rdd.map(lambda _: task_attempt()).collect() == [0, 0]
    assert task_attempt() is None  # the driver


def committed(kafka: Broker, topic: str) -> list[tuple[str, str]]:
    """The topic's committed records as (key, value): read_committed where the broker
    hides aborted records, else from its log's transaction markers (Tansu)."""
    if kafka.hides_aborted:
        return sorted((r["key"], r["value"]) for r in read_topic(kafka.bootstrap, topic, 5))
    from kafka_log import committed_records

    records = committed_records(kafka.bootstrap, topic, 3)
    return sorted((r.key.decode(), r.value.decode()) for r in records if r.key and r.value)


def pa_batch(tag: str) -> pa.RecordBatch:
    """Five rows ``k0..k4`` whose value says which attempt wrote them."""
    return pa.RecordBatch.from_pylist([{"id": f"k{i}", "v": tag} for i in range(5)])
