"""A partition's producer is initialised and its marker read while the rest of the
partition encodes (fanout_kafka.transaction), against the real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
from fanout_kafka import KafkaSink
from fanout_kafka.transaction import PartitionWriter
from kafkatools import Broker, create_topic, marker, read_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext


def _writer(kafka: Broker, topic: str, pipeline: str) -> PartitionWriter:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=1)  # fmt: skip
    sink.open(SinkContext(pipeline))
    batch = Batch(None, BatchInfo(pipeline, 4), "events", txn_app_id(pipeline, "events"))
    return PartitionWriter(sink.settings(batch), partition=0, batch_id=4)


def _input(writer: PartitionWriter, value: str, seen: list[bool]) -> Iterator[pa.RecordBatch]:
    """Three batches; the last only after the marker consumer exists (the producer was
    initialised first), or 10 s."""
    for first in range(0, 6, 3):
        yield pa.RecordBatch.from_pylist(
            [{"id": f"k{i}", "v": value} for i in range(first, first + 3)]
        )
    deadline = time.monotonic() + 10
    while writer._consumer is None and time.monotonic() < deadline:
        time.sleep(0.01)
    seen.append(writer._consumer is not None)
    yield pa.RecordBatch.from_pylist([{"id": f"k{i}", "v": value} for i in range(6, 9)])


def test_a_partition_prepared_beside_its_encoding_commits_once_and_its_replay_skips(
    kafka: Broker,
) -> None:
    topic, pipeline = f"pa-{uuid.uuid4().hex[:8]}", f"pa{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    seen: list[bool] = []
    first = _writer(kafka, topic, pipeline)
    done = first.run(_input(first, "first", seen))
    assert (done.status, done.rows, done.written) == ("committed", 9, 9)
    replay = _writer(kafka, topic, pipeline)
    again = replay.run(_input(replay, "replayed", seen))
    assert (again.status, again.rows) == ("skipped", 9)

    assert seen == [True, True]  # both prepared while their input was still arriving
    assert first._producer is None and replay._producer is None  # closed
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 5
    records = read_topic(kafka.bootstrap, topic, 9)
    assert [(r["key"], r["value"]) for r in records] == [(f"k{i}", "first") for i in range(9)]
