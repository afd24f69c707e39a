"""A bad record bound for a ``kafka:`` dead-letter topic is written there even when the
letter as a whole would not fit: a dead letter is the record plus three headers (the
reason, the topic, the size), and a record the producer refused (over its
``message.max.bytes``, which ``max_record_bytes`` let through) was produced again whole
as its letter. The producer refused the letter too, and the partition failed for good
(``transaction aborted: MSG_SIZE_TOO_LARGE``) instead of dead-lettering the record. A
letter too large for the producer now goes without its value, as one over the sink's
limit always did (a reference: key, headers, ``fanout.record_bytes``)."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.transaction import PartitionWriter
from kafka_log import committed_records, committed_values
from kafkatools import Broker, create_topic, read_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.testing import open_sink

SMALL = [{"id": f"k{i}", "v": f"v{i}"} for i in range(3)]


def _write(
    kafka: Broker,
    topic: str,
    rows: list[dict[str, Any]],
    *,
    again: tuple[str, str] | None = None,
    **options: Any,
) -> Any:
    """Partition 0 of batch 0 of ``rows`` through a sink with a dead-letter topic (a new
    pipeline and topic, or ``again`` those of an earlier call: a replay); returns
    (outcome, dead-letter topic, the last row's record size when it has a key)."""
    pipeline, dlq = again or (f"dt{uuid.uuid4().hex[:6]}", f"dlq-{uuid.uuid4().hex[:8]}")
    if again is None:
        create_topic(kafka.bootstrap, dlq, 1)
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=1, dead_letter=f"kafka:{dlq}", **options)  # fmt: skip
    open_sink(sink, pipeline)
    settings = sink.settings(Batch(None, BatchInfo(pipeline, 0), "events",
                                   txn_app_id(pipeline, "events")))  # fmt: skip
    writer = PartitionWriter(settings, partition=0, batch_id=0)
    size = settings.encoder.encode_all(rows[-1:])[0][0].size if rows[-1]["id"] else None
    return writer.run([pa.RecordBatch.from_pylist(rows)]), (pipeline, dlq), size


def test_a_record_the_producer_refuses_is_dead_lettered_to_the_topic(
    kafka: Broker, topic: str
) -> None:
    big = {"id": "big", "v": "b" * 3000}
    done, (_, dlq), size = _write(kafka, topic, [*SMALL, big], max_record_bytes=100_000,
                       producer={"message.max.bytes": 2000, "linger.ms": 0})  # fmt: skip
    assert (done.status, done.written, done.dead_lettered) == ("committed", 3, 1), done.failure
    # the log's committed records: Tansu shows the refused first attempt's too
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"v0", b"v1", b"v2"]
    (letter,) = committed_records(kafka.bootstrap, dlq, 1)
    headers = dict(letter.headers)
    assert (letter.key, letter.value) == (b"big", None)
    assert headers[b"fanout.record_bytes"] == str(size).encode()
    assert b"refused by the producer: over its message.max.bytes of 2000" in (
        headers[b"fanout.error"] or b""
    )


def test_a_bad_record_near_the_limit_is_dead_lettered_to_the_topic(
    kafka: Broker, topic: str
) -> None:
    """A null key (a bad record) of a value a little under the limit: with the letter's
    headers it is over it."""
    near = {"id": None, "v": "n" * 1800}
    done, (_, dlq), _ = _write(kafka, topic, [*SMALL, near],
                       producer={"message.max.bytes": 2000, "linger.ms": 0})  # fmt: skip
    assert (done.status, done.written, done.dead_lettered) == ("committed", 3, 1), done.failure
    (letter,) = read_topic(kafka.bootstrap, dlq, 1, timeout=10)
    assert (letter["key"], letter["value"]) == (None, None)
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"v0", b"v1", b"v2"]
    assert letter["headers"]["fanout.error"].startswith("null key: key column(s) 'id'")


@pytest.mark.parametrize("replay_max_bytes", [2000, 100_000])
def test_a_replay_counts_the_refused_record_as_the_commit_did(
    kafka: Broker, topic: str, replay_max_bytes: int
) -> None:
    """A replay that finds the partition committed counts the record the producer refused
    among the dead letters, not the rows (``SinkResult.rows``: rows written), as the
    commit did, even when its own producer would now take it: before, the skipped
    partition said ``rows`` 4, ``dead_lettered`` 0."""
    rows = [*SMALL, {"id": "big", "v": "b" * 3000}]
    done, again, _ = _write(kafka, topic, rows, max_record_bytes=100_000,
                            producer={"message.max.bytes": 2000, "linger.ms": 0})  # fmt: skip
    assert (done.status, done.rows, done.dead_lettered) == ("committed", 3, 1), done.failure
    producer = {"message.max.bytes": replay_max_bytes, "linger.ms": 0}
    replay, _, _ = _write(kafka, topic, rows, again=again, max_record_bytes=100_000,
                          producer=producer)  # fmt: skip
    assert (replay.status, replay.rows, replay.written, replay.dead_lettered) == (
        "skipped", 3, 0, 1,
    ), replay.failure  # fmt: skip
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"v0", b"v1", b"v2"]
    assert len(committed_records(kafka.bootstrap, again[1], 1)) == 1


def test_a_route_letter_too_large_for_the_producer_is_written_as_a_reference(
    kafka: Broker, topic: str
) -> None:
    """A row failing the sink's route whose JSON is over the producer's limit: its letter
    was produced whole, refused, and the batch failed for good (``SinkWriteError``)."""
    from fanout.contract.dead_letters import DeadLetter

    pipeline, dlq = f"dt{uuid.uuid4().hex[:6]}", f"dlq-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, dlq, 1)
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     partitions=1, dead_letter=f"kafka:{dlq}",
                     producer={"message.max.bytes": 2000, "linger.ms": 0})  # fmt: skip
    open_sink(sink, pipeline)
    batch = Batch(None, BatchInfo(pipeline, 0), "events", txn_app_id(pipeline, "events"))
    letters = [DeadLetter({"id": 1, "v": "b" * 3000}, "bad cast", "v", "b" * 3000),
               DeadLetter({"id": 2, "v": "ok"}, "bad cast", "v", "ok")]  # fmt: skip
    assert sink._dead.write(batch, letters, source="route") == 2
    got = [(r.key, r.value, dict(r.headers)[b"fanout.error"], dict(r.headers)[b"fanout.value"])
           for r in committed_records(kafka.bootstrap, dlq, 1)]  # fmt: skip
    assert got == [(None, None, b"bad cast", b"b" * 200 + b"..."),
                   (None, b'{"id":2,"v":"ok"}', b"bad cast", b"ok")]  # fmt: skip


def test_a_replay_whose_own_size_check_sets_the_refused_record_aside_counts_it_once(
    kafka: Broker, topic: str
) -> None:
    """The commit's producer refused the big record (dead-lettered, its count committed);
    the replay runs with a lower ``max_record_bytes``, so its own size check sets the same
    record aside before producing. Counting its own bad records plus the committed refused
    count said ``rows`` 2, ``dead_lettered`` 2 for a partition that wrote 3 and set 1
    aside."""
    rows = [{"id": "big", "v": "b" * 3000}, *SMALL]  # not last: _write sizes the last
    producer = {"message.max.bytes": 2000, "linger.ms": 0}
    done, again, _ = _write(kafka, topic, rows, max_record_bytes=100_000, producer=producer)
    assert (done.status, done.rows, done.dead_lettered) == ("committed", 3, 1), done.failure
    replay, _, _ = _write(kafka, topic, rows, again=again, max_record_bytes=1000,
                          producer=producer)  # fmt: skip
    assert (replay.status, replay.rows, replay.written, replay.dead_lettered) == (
        "skipped", 3, 0, 1,
    ), replay.failure  # fmt: skip


def test_a_replay_whose_size_check_lets_the_letter_through_counts_it_as_the_commit_did(
    kafka: Broker, topic: str
) -> None:
    """The commit's own size check set the big record aside (its letter in the topic); the
    replay runs with a higher ``max_record_bytes`` (the topic's limit raised meanwhile), so
    its check lets the record through and it skips the committed partition. It counted its
    own bad records only: ``rows`` 4, ``dead_lettered`` 0, for a partition that wrote 3
    and holds one letter."""
    rows = [{"id": "big", "v": "b" * 3000}, *SMALL]
    producer = {"message.max.bytes": 100_000, "linger.ms": 0}
    done, again, _ = _write(kafka, topic, rows, max_record_bytes=1000, producer=producer)
    assert (done.status, done.rows, done.dead_lettered) == ("committed", 3, 1), done.failure
    replay, _, _ = _write(kafka, topic, rows, again=again, max_record_bytes=100_000,
                          producer=producer)  # fmt: skip
    assert (replay.status, replay.rows, replay.written, replay.dead_lettered) == (
        "skipped", 3, 0, 1,
    ), replay.failure  # fmt: skip
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"v0", b"v1", b"v2"]
    assert len(committed_records(kafka.bootstrap, again[1], 1)) == 1
