"""The Kafka sink's ``holds_batch``: its markers on the marker topic say which batch each
partition committed, whatever the ledger says (the check before a new epoch starts,
ARCHITECTURE §5 "A batch written but never marked")."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kafkatools import Broker

from fanout import BatchInfo, FanOut


def test_markers_say_which_batches_the_sink_holds(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    pipeline = f"holds{uuid.uuid4().hex[:8]}"
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "partitions": 3}  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink])
    kafka_sink = fan.sinks["k"]
    assert kafka_sink.holds_batch(pipeline, 0, 0) is False  # no marker group yet
    rows = spark.createDataFrame([(i, f"v{i}") for i in range(6)], "id BIGINT, v STRING")
    fan.process(rows, BatchInfo(pipeline, 0, "q"))
    fan.process(rows, BatchInfo(pipeline, 1, "q"))
    assert [kafka_sink.holds_batch(pipeline, 0, b) for b in range(3)] == [True, True, False]
    assert kafka_sink.holds_batch(pipeline, 1, 0) is False  # epoch 1's groups: none
