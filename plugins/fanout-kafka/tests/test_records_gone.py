"""The Kafka sink's own records (its marker groups on the marker topic) deleted while the
topic still holds the batches: what a replay of a batch written and never marked does.

Known gap (docs/architecture.md §5, "A sink's own records gone"): with no marker of the
epoch left, ``holds_batch`` cannot tell a deletion from the broker's expiry
(``offsets.retention.minutes``, an idle pipeline whose restart must pass), so it answers
``None``, the run's lost-target check passes, and the replay finds no marker of the batch
and writes it a second time. Kept as a strict xfail: it fails the day it is fixed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kafkatools import Broker, key_counts, read_topic

from fanout import BatchInfo, FanOut
from fanout.testing.faults import DieAfterWrite, DriverKilled

pytestmark = pytest.mark.integration


def _write(kafka: Broker, topic: str, pipeline: str, spark: Any, batch_id: int,
           tmp_path: Path, *plugins: object) -> None:  # fmt: skip
    """Write batch ``batch_id`` (keys ``10 * batch_id`` + 0..2) to ``topic`` through sink
    ``k`` (two partitions, the topic created at its first write), then close."""
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap, "topic": topic,
            "key": "id", "partitions": 2, "create_topic": {"partitions": 2}}  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink], retries=0, plugins=plugins)
    info = BatchInfo(pipeline, batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=1000 + batch_id)  # fmt: skip
    try:
        fan.process(spark.createDataFrame([(batch_id * 10 + n,) for n in range(3)], "id BIGINT"),
                    info)  # fmt: skip
    finally:
        fan.close()


def _delete_markers(kafka: Broker, pipeline: str) -> None:
    """Delete the sink's marker groups (``fanout_kafka.markers.marker_group``), as an
    operator cleaning "unused" consumer groups does."""
    groups = [f"fanout/{pipeline}/k/p{p}" for p in range(2)]
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        for future in admin.delete_consumer_groups(groups).values():
            future.result(10)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Kafka markers deleted: the replay writes batch 1 again",
)
def test_markers_deleted_after_an_unmarked_batch_do_not_let_its_replay_write_it_again(
    spark: Any, kafka: Broker, tmp_path: Path
) -> None:
    pipeline, topic = f"gonek{uuid.uuid4().hex[:6]}", f"gone-{uuid.uuid4().hex[:8]}"
    _write(kafka, topic, pipeline, spark, 0, tmp_path)
    with pytest.raises(DriverKilled):
        _write(kafka, topic, pipeline, spark, 1, tmp_path, DieAfterWrite("k", 1))
    written = {"0": 1, "1": 1, "2": 1, "10": 1, "11": 1, "12": 1}
    assert key_counts(read_topic(kafka.bootstrap, topic, 6, timeout=15)) == written
    _delete_markers(kafka, pipeline)

    try:
        _write(kafka, topic, pipeline, spark, 1, tmp_path)  # the replay
    except Exception as refused:  # a refusal naming the sink would do: nothing written
        assert "sink 'k'" in str(refused)
    assert key_counts(read_topic(kafka.bootstrap, topic, 6, timeout=15, idle=3.0)) == written
