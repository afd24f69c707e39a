"""Streaming batches into Kafka: a read_committed consumer in another process reads every
row once; a replayed batch writes nothing (the partitions' markers)."""

from __future__ import annotations

import json
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.errors import KafkaMarkerError
from kafkatools import (
    Broker,
    create_topic,
    key_counts,
    last_stable_offset_stuck,
    marker,
    read_topic,
)

from fanout import FanOut
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from tests.integration.streams import SCHEMA, committed_marks, run_stream, write_input

FILES, ROWS, PARTITIONS = 3, 25, 4
ATTEMPTS = 3
"""Streams tried on Tansu before the module fails: a stuck last stable offset withholds
the later batches' markers (plugins/fanout-kafka/README.md; about 1 stream in 8 here
before the sink's transaction ends took turns on Tansu)."""


@dataclass
class Streamed:
    """One stream of FILES batches into a fresh topic and marker topic."""

    broker: Broker
    pipeline: str
    topic: str
    marker_topic: str
    workdir: Path
    rows: list[dict[str, Any]]

    def sink_options(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.broker.bootstrap,
            "topic": self.topic,
            "marker_topic": self.marker_topic,
            "key": "order_id",
            "partitions": PARTITIONS,
        }

    def markers(self) -> list[int]:
        """Each partition's committed marker (the batch it last committed, plus one)."""
        return [
            marker(self.broker.bootstrap, self.pipeline, "events", p, self.marker_topic)
            for p in range(PARTITIONS)
        ]


def stream_once(spark: Any, kafka: Broker, workdir: Path) -> Streamed:
    """FILES batches of ROWS rows through a one-sink fan-out into fresh topics."""
    suffix = uuid.uuid4().hex[:8]
    run = Streamed(kafka, f"eo{suffix[:6]}", f"orders-{suffix}", f"markers-{suffix}",
                   workdir, write_input(workdir / "input", FILES, ROWS))  # fmt: skip
    create_topic(kafka.bootstrap, run.topic, 3)
    sink = {"type": "kafka", "name": "events", **run.sink_options()}
    with FanOut(run.pipeline, str(workdir / "ledger"), [sink]) as fan:
        run_stream(spark, workdir / "input", fan, workdir / "checkpoint")
    return run


@pytest.fixture(scope="module")
def streamed(spark: Any, kafka: Broker, tmp_path_factory: pytest.TempPathFactory) -> Streamed:
    """A stream whose every commit the broker applied: each partition's marker says the
    last batch. The replays below are only meaningful on such a broker.

    On Tansu, a stream whose markers lag while the topic shows the stuck last stable offset
    is streamed again into fresh topics (its commits returned, but the broker withholds
    them and the markers committed with them, so a replay rightly finds them missing). On
    Kafka a lagging marker fails at once, as any other stuck attempt does."""
    for attempt in range(1, ATTEMPTS + 1):
        run = stream_once(spark, kafka, tmp_path_factory.mktemp(f"kafka-stream-{attempt}"))
        markers = run.markers()
        if markers == [FILES] * PARTITIONS:
            return run
        assert not kafka.hides_aborted, f"markers {markers}: a commit was not applied"
        assert last_stable_offset_stuck(kafka.bootstrap, run.topic, FILES * ROWS), (
            f"markers {markers} lag the last batch {FILES}, but the topic's records are all "
            "visible as committed"
        )
        warnings.warn(
            f"stream {attempt}: markers {markers} withheld by Tansu's stuck last stable "
            "offset; streaming again into fresh topics",
            stacklevel=1,
        )
    pytest.fail(f"Tansu withheld records in {ATTEMPTS} streams in a row")


def test_read_committed_consumer_reads_every_row_once(streamed: Streamed) -> None:
    records = read_topic(streamed.broker.bootstrap, streamed.topic, FILES * ROWS)
    expected = {str(r["order_id"]): r for r in streamed.rows}
    assert key_counts(records) == {k: 1 for k in expected}
    for record in records:
        row = expected[record["key"]]
        assert json.loads(record["value"]) == row
        assert record["headers"] == {
            "fanout.pipeline": streamed.pipeline,
            "fanout.sink": "events",
            "fanout.batch_id": str(row["order_id"] // ROWS),  # file n is batch n
        }
    assert committed_marks(streamed.workdir / "ledger", streamed.pipeline) == {
        ("events", b): 1 for b in range(FILES)
    }


def replay(spark: Any, streamed: Streamed, batch_id: int) -> Any:
    df = spark.read.schema(SCHEMA).json(
        str(streamed.workdir / "input" / f"orders-{batch_id:04d}.json")
    )
    sink = KafkaSink("events", **streamed.sink_options())
    sink.open(SinkContext(streamed.pipeline, spark))
    info = BatchInfo(streamed.pipeline, batch_id)
    return sink.write(Batch(df, info, "events", txn_app_id(streamed.pipeline, "events")))


def test_replay_of_a_committed_batch_writes_no_partition(spark: Any, streamed: Streamed) -> None:
    # the last batch: the only one Spark replays (fanout skips a marked sink before that)
    result = replay(spark, streamed, FILES - 1)
    assert result.rows == ROWS
    assert result.details["committed_partitions"] == []
    assert result.details["written"] == 0
    assert result.already_written is True
    assert len(result.details["skipped_partitions"]) >= 1
    records = read_topic(streamed.broker.bootstrap, streamed.topic, FILES * ROWS)
    assert key_counts(records) == {str(r["order_id"]): 1 for r in streamed.rows}


def test_a_batch_older_than_the_markers_is_refused_not_skipped(
    spark: Any, streamed: Streamed
) -> None:
    """Markers past the batch cannot come from this sink's own run (it marks every batch in
    the ledger before the next), so they are another writer's: refused, nothing written."""
    past = f"markers in topic '{streamed.marker_topic}' are past"
    with pytest.raises(KafkaMarkerError, match=past):
        replay(spark, streamed, 0)
    records = read_topic(streamed.broker.bootstrap, streamed.topic, FILES * ROWS)
    assert key_counts(records) == {str(r["order_id"]): 1 for r in streamed.rows}
