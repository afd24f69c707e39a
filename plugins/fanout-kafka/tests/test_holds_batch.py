"""The Kafka sink's ``holds_batch``: its markers on the marker topic say which batch each
partition committed, whatever the ledger says (the check before a new epoch starts,
ARCHITECTURE §5 "A batch written but never marked")."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from fanout_kafka.transaction import PartitionWriter
from kafkatools import Broker

from fanout import BatchInfo, FanOut, PartlyHeld
from fanout.contract.batch import Batch, txn_app_id
from fanout.partitioned.membership import MemberDigest, PartitionPlan


def test_markers_say_which_batches_the_sink_holds(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    pipeline = f"holds{uuid.uuid4().hex[:8]}"
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "partitions": 3}  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink])
    kafka_sink = fan.sinks["k"]
    # no marker group yet: never written, or markers the broker forgot (cannot tell)
    assert kafka_sink.holds_batch(pipeline, 0, 0) is None
    rows = spark.createDataFrame([(i, f"v{i}") for i in range(6)], "id BIGINT, v STRING")
    fan.process(rows, BatchInfo(pipeline, 0, "q"))
    fan.process(rows, BatchInfo(pipeline, 1, "q"))
    assert [kafka_sink.holds_batch(pipeline, 0, b) for b in range(3)] == [True, True, False]
    assert kafka_sink.holds_batch(pipeline, 1, 0) is None  # epoch 1's groups: none


def test_a_batch_some_partitions_committed_is_held_in_part(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """Batch 1 committed in partitions 0 and 1 of 3 (the driver killed before partition 2
    ran): the sink holds part of it, with the count the plan offsets recorded. Before, it
    said ``True``, and fanout recorded a lost mark of the whole batch: a replay then
    skipped partition 2's rows."""
    pipeline = f"holds{uuid.uuid4().hex[:8]}"
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "value": "v", "partitions": 3}  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink])
    kafka_sink = fan.sinks["k"]
    rows = spark.createDataFrame([(i, f"v{i}") for i in range(6)], "id BIGINT, v STRING")
    fan.process(rows, BatchInfo(pipeline, 0, "q"))
    one = Batch(None, BatchInfo(pipeline, 1), "k", txn_app_id(pipeline, "k"))
    settings = replace(kafka_sink.settings(one), plan=PartitionPlan(3, (("id", "bigint"),)))
    for partition in (0, 1):
        records = pa.RecordBatch.from_pylist([{"id": str(partition), "v": "x"}])
        PartitionWriter(settings, partition, 1, digest=MemberDigest()).run([records])
    assert kafka_sink.holds_batch(pipeline, 0, 0) is True
    assert kafka_sink.holds_batch(pipeline, 0, 1) == PartlyHeld(2, 3)
    assert kafka_sink.holds_batch(pipeline, 0, 2) is False


def test_a_batch_committed_in_a_later_partition_only_is_held_in_part(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """The epoch's first batch committed in partition 1 of 3 only (partition 0 failed, or
    the driver was killed before it ran): the markers were read from partition 0 on, for
    as long as each had one, so partition 0's missing marker ended them and the sink said
    it held none of the batch: a new epoch wrote partition 1's rows a second time."""
    pipeline = f"holds{uuid.uuid4().hex[:8]}"
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "value": "v", "partitions": 3}  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink])
    kafka_sink = fan.sinks["k"]
    zero = Batch(None, BatchInfo(pipeline, 0), "k", txn_app_id(pipeline, "k"))
    settings = replace(kafka_sink.settings(zero), plan=PartitionPlan(3, (("id", "bigint"),)))
    records = pa.RecordBatch.from_pylist([{"id": "1", "v": "x"}])
    PartitionWriter(settings, 1, 0, digest=MemberDigest()).run([records])
    assert kafka_sink.holds_batch(pipeline, 0, 0) == PartlyHeld(1, 3)
    assert kafka_sink.holds_batch(pipeline, 0, 1) is False
