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


@dataclass
class Streamed:
    """One stream of FILES batches into a fresh topic."""

    broker: Broker
    pipeline: str
    topic: str
    workdir: Path
    rows: list[dict[str, Any]]

    def sink_options(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.broker.bootstrap,
            "topic": self.topic,
            "key": "order_id",
            "partitions": PARTITIONS,
        }


@pytest.fixture(scope="module")
def streamed(spark: Any, kafka: Broker, tmp_path_factory: pytest.TempPathFactory) -> Streamed:
    workdir = tmp_path_factory.mktemp("kafka-stream")
    run = Streamed(kafka, f"eo{uuid.uuid4().hex[:6]}", f"orders-{uuid.uuid4().hex[:8]}",
                   workdir, write_input(workdir / "input", FILES, ROWS))  # fmt: skip
    create_topic(kafka.bootstrap, run.topic, 3)
    sink = {"type": "kafka", "name": "events", **run.sink_options()}
    with FanOut(run.pipeline, str(workdir / "ledger"), [sink]) as fan:
        run_stream(spark, workdir / "input", fan, workdir / "checkpoint")
    return run


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
    markers = [
        marker(streamed.broker.bootstrap, streamed.pipeline, "events", p, "__fanout_markers")
        for p in range(PARTITIONS)
    ]
    assert all(1 <= m <= FILES for m in markers), markers
    if max(markers) < FILES and last_stable_offset_stuck(
        streamed.broker.bootstrap, streamed.topic, FILES * ROWS
    ):
        # Tansu left the last transactions' commit unapplied: their records are read above
        # uncommitted (read_topic warned), and their marker offsets are withheld with them
        warnings.warn(f"markers {markers} behind the last batch: Tansu's stuck LSO", stacklevel=1)
        return
    assert max(markers) == FILES, markers


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
    with pytest.raises(KafkaMarkerError, match="markers in topic '__fanout_markers' are past"):
        replay(spark, streamed, 0)
    records = read_topic(streamed.broker.bootstrap, streamed.topic, FILES * ROWS)
    assert key_counts(records) == {str(r["order_id"]): 1 for r in streamed.rows}
