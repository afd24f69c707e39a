"""A partition committed beside a transaction that a killed task left open is skipped by
the replay, on a restarted driver and on a retry alike: its marker is not held back
(on Tansu, until the open transaction is ended: fanout_kafka.abandoned)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pyarrow as pa
from confluent_kafka import Producer
from fanout_kafka import KafkaSink
from fanout_kafka.reruns import note_committing, note_path
from fanout_kafka.transaction import PartitionWriter
from kafka_log import committed_records
from kafkatools import Broker, create_topic, marker, read_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.partitioned.membership import PartitionPlan

PLAN = PartitionPlan(2, (("id", "string"),))
KEPT, LEFT_OPEN = 0, 1  # the partition that commits, the one whose task is killed


def _sink(kafka: Broker, topic: str, pipeline: str, partitions: int = 2) -> KafkaSink:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=partitions)  # fmt: skip
    sink.open(SinkContext(pipeline))
    return sink


def _batch(pipeline: str, batch_id: int = 0) -> Batch:
    return Batch(None, BatchInfo(pipeline, batch_id), "events", txn_app_id(pipeline, "events"))


@contextmanager
def _left_open(
    sink: KafkaSink, pipeline: str, topic: str, partition: int = LEFT_OPEN
) -> Iterator[Any]:
    """``partition``'s transaction as a killed task leaves it: records produced, no end
    (the producer is dropped without a word to the broker)."""
    settings = sink.settings(_batch(pipeline))
    producer = Producer(settings.producer_config(partition))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"killed", b"open")
    assert producer.flush(30) == 0
    yield producer


def _commit(
    sink: KafkaSink, pipeline: str, partition: int = KEPT, batch_id: int = 0, value: str = "kept"
) -> None:
    settings = replace(sink.settings(_batch(pipeline, batch_id)), plan=PLAN)
    rows = [{"id": f"k{i}", "v": value} for i in range(5)]
    done = PartitionWriter(settings, partition, batch_id).run([pa.RecordBatch.from_pylist(rows)])
    assert (done.status, done.written) == ("committed", 5)


def _committed_records(kafka: Broker, topic: str, expected: int = 5) -> list[tuple[str, str]]:
    """What a read_committed reader of Kafka gets (on Tansu, from the log's markers)."""
    if kafka.hides_aborted:
        records = read_topic(kafka.bootstrap, topic, expected)
        return sorted((r["key"], r["value"]) for r in records)
    found = committed_records(kafka.bootstrap, topic, 1)
    return sorted(((r.key or b"").decode(), (r.value or b"").decode()) for r in found)


def _replay_kept(sink: KafkaSink, pipeline: str) -> str:
    """The replay's driver step, then partition KEPT's task; its status."""
    batch = _batch(pipeline)
    committed = sink.committed_partitions(batch, PLAN)
    assert [c.partition for c in committed] == [KEPT]
    settings = sink.partition_writer(batch, PLAN).settings  # as the replay's tasks get it
    rows = [{"id": f"k{i}", "v": "replayed"} for i in range(5)]
    return PartitionWriter(settings, KEPT, 0).run([pa.RecordBatch.from_pylist(rows)]).status


def test_a_restarted_driver_skips_a_partition_committed_beside_a_killed_one(
    kafka: Broker,
) -> None:
    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)  # both partitions' records share its partition
    killed = _sink(kafka, topic, pipeline)
    assert killed.committed_partitions(_batch(pipeline), PLAN) == []
    with _left_open(killed, pipeline, topic):
        _commit(killed, pipeline)
        restarted = _sink(kafka, topic, pipeline)  # the driver killed, a new one opens
        assert _replay_kept(restarted, pipeline) == "skipped"

    assert marker(kafka.bootstrap, pipeline, "events", KEPT, "__fanout_markers") == 1
    assert _committed_records(kafka, topic) == [(f"k{i}", "kept") for i in range(5)]


def test_a_retry_skips_a_partition_committed_beside_a_killed_one(kafka: Broker) -> None:
    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    sink = _sink(kafka, topic, pipeline)
    assert sink.committed_partitions(_batch(pipeline), PLAN) == []  # the first attempt
    with _left_open(sink, pipeline, topic):
        _commit(sink, pipeline)
        assert _replay_kept(sink, pipeline) == "skipped"  # the attempt failed: a retry

    assert marker(kafka.bootstrap, pipeline, "events", KEPT, "__fanout_markers") == 1
    assert _committed_records(kafka, topic) == [(f"k{i}", "kept") for i in range(5)]


def test_a_task_run_again_does_not_write_again_a_partition_committed_beside_a_killed_one(
    kafka: Broker,
) -> None:
    """Spark runs a partition's task again within the same attempt of the batch (its
    executor was lost right after the commit: a task retry, a stage retry), with no driver
    step between: nothing ended the transaction a killed task left open, which on Tansu
    holds the committed partition's marker back. The second run must not write the
    partition again: it finds the marker (Kafka), or, on Tansu, fails as transient without
    writing, and the batch's replay (whose driver ends the open transaction) skips it."""
    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    sink = _sink(kafka, topic, pipeline)
    batch = _batch(pipeline)
    assert sink.committed_partitions(batch, PLAN) == []  # the attempt's driver step
    settings = sink.partition_writer(batch, PLAN).settings  # what its tasks are given
    rows = [pa.RecordBatch.from_pylist([{"id": f"k{i}", "v": "kept"} for i in range(5)])]
    with _left_open(sink, pipeline, topic):  # partition LEFT_OPEN's task killed
        first = PartitionWriter(settings, KEPT, 0).run(rows)
        again = PartitionWriter(settings, KEPT, 0).run(rows)  # the same task, run again
        if kafka.hides_aborted:  # Kafka: the marker is there
            assert again.status == "skipped"
        else:  # Tansu: the marker held back, and the second run knows it cannot tell
            assert again.status == "failed", again
            assert again.failure is not None and again.failure.transient
            assert "held back" in again.failure.message, again.failure.message
            assert _replay_kept(sink, pipeline) == "skipped"

    assert (first.status, first.written) == ("committed", 5)
    assert marker(kafka.bootstrap, pipeline, "events", KEPT, "__fanout_markers") == 1
    assert _committed_records(kafka, topic) == [(f"k{i}", "kept") for i in range(5)]


def test_a_note_of_a_commit_that_failed_does_not_stop_the_replay_writing(kafka: Broker) -> None:
    """A run notes its commit and then the commit fails (aborted, fenced): nothing holds
    the batch. A run of the same attempt cannot tell and refuses (Tansu); the batch's
    replay, a new attempt, must write the partition, once: the note never refuses for
    ever."""
    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    sink = _sink(kafka, topic, pipeline)
    batch = _batch(pipeline)
    assert sink.committed_partitions(batch, PLAN) == []
    settings = sink.partition_writer(batch, PLAN).settings
    rows = [pa.RecordBatch.from_pylist([{"id": f"k{i}", "v": "kept"} for i in range(5)])]
    note = note_path(settings.end_turns, settings.transactional_id(KEPT))
    note_committing(note, settings.attempt)  # the run whose commit then failed
    again = PartitionWriter(settings, KEPT, 0).run(rows)
    if kafka.hides_aborted:  # Kafka: no note, the run writes
        assert note is None and (again.status, again.written) == ("committed", 5)
    else:
        assert again.status == "failed", again
        assert again.failure is not None and again.failure.transient
        assert sink.committed_partitions(batch, PLAN) == []  # the replay's driver step
        replay = sink.partition_writer(batch, PLAN).settings
        assert replay.attempt not in ("", settings.attempt)
        done = PartitionWriter(replay, KEPT, 0).run(rows)
        assert (done.status, done.written) == ("committed", 5)

    assert marker(kafka.bootstrap, pipeline, "events", KEPT, "__fanout_markers") == 1
    assert _committed_records(kafka, topic) == [(f"k{i}", "kept") for i in range(5)]


def test_a_restart_with_fewer_partitions_ends_a_dropped_partitions_open_transaction(
    kafka: Broker,
) -> None:
    """The markers' reader looks beyond the partition count (a count lowered since a
    partial commit): so does the ending of open transactions."""
    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    wide = _sink(kafka, topic, pipeline, partitions=3)
    for partition in range(3):  # batch 0 whole: partition 2 holds a marker
        _commit(wide, pipeline, partition, batch_id=0, value=f"b0p{partition}")
    with _left_open(wide, pipeline, topic, partition=2):  # batch 1: partition 2 killed
        _commit(wide, pipeline, KEPT, batch_id=1)
        narrow = _sink(kafka, topic, pipeline, partitions=2)  # restarted with 2
        committed = narrow.committed_partitions(_batch(pipeline, 1), PLAN)

    assert [c.partition for c in committed] == [KEPT]
    markers = [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers")
               for p in range(3)]  # fmt: skip
    assert markers == [2, 1, 1]
