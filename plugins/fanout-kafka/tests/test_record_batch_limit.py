"""librdkafka packs records into record batches up to its ``batch.size`` (1000000 bytes by
default); a broker refuses a record batch over the topic's ``max.message.bytes`` *whole*,
so on a topic with a small limit every record of an oversized batch was refused (and
dead-lettered) though each fits alone. The sink caps the producers' ``batch.size`` to the
topics' limit: the records that fit are written, only those over the limit are refused.

The embedded Tansu broker enforces no size limit (plugins/fanout-kafka/README.md), so the
batches are measured where librdkafka reports them (its statistics: ``batchsize`` per
topic); against a real Kafka (``FANOUT_KAFKA_BOOTSTRAP``) the same test also shows which
keys the broker took.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic
from fanout_kafka import KafkaSink
from fanout_kafka.settings import producer_config
from fanout_kafka.transaction import PartitionWriter
from kafkatools import Broker, create_topic, key_counts, read_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.partitioned.membership import PartitionPlan
from fanout.testing import open_sink

LIMIT = 20_000  # the topic's max.message.bytes
SMALL = 2_000  # records of about 130 bytes: 260 KB, one record batch by default
PLAN = PartitionPlan(1, (("id", "string"),))


def _limited_topic(bootstrap: str) -> str:
    name = f"small-{uuid.uuid4().hex[:8]}"
    topic = NewTopic(name, 1, 1, config={"max.message.bytes": str(LIMIT)})
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([topic])[name].result(30)
    return name


class MeasuredWriter(PartitionWriter):
    """The sink's partition writer, serving the producer's last statistics before it is
    released (librdkafka queues them until a poll)."""

    def close(self) -> None:
        if self._producer is not None:
            self._producer.poll(0.5)
        super().close()


def _batch_sizes(stats: list[str], topic: str) -> list[int]:
    """The largest record batch librdkafka reports for ``topic`` in each statistics line."""
    found = [json.loads(s)["topics"].get(topic, {}).get("batchsize", {}) for s in stats]
    return [int(b["max"]) for b in found if b.get("cnt")]


def test_record_batches_stay_within_the_topics_limit_so_only_oversized_records_are_refused(
    kafka: Broker,
) -> None:
    topic, dlq = _limited_topic(kafka.bootstrap), f"dlq-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, dlq, 1)
    stats: list[str] = []
    sink = KafkaSink(
        "events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id", value="v",
        partitions=1, dead_letter=f"kafka:{dlq}",
        producer={"linger.ms": 50, "statistics.interval.ms": 10, "stats_cb": stats.append},
    )  # fmt: skip
    pipeline = f"lim{uuid.uuid4().hex[:6]}"
    open_sink(sink, pipeline)
    assert sink.max_record_bytes == LIMIT - 61
    rows = [{"id": f"k{i}", "v": "x" * 100} for i in range(SMALL)]
    rows.append({"id": "big", "v": "y" * (LIMIT + 1000)})  # over the limit alone
    batch = Batch(None, BatchInfo(pipeline, 0), "events", txn_app_id(pipeline, "events"))
    assert sink.committed_partitions(batch, PLAN) == []
    settings = replace(sink.settings(batch), plan=PLAN)
    assert settings.producer_config(0)["batch.size"] == LIMIT

    writer = MeasuredWriter(settings, 0, 0)
    outcome = writer.run([pa.RecordBatch.from_pylist(rows)])  # type: ignore[arg-type]
    assert (outcome.status, outcome.written, outcome.dead_lettered) == ("committed", SMALL, 1)
    sizes = _batch_sizes(stats, topic)
    assert sizes, "librdkafka reported no record batch of the topic"
    assert max(sizes) <= LIMIT, f"record batches of up to {max(sizes)} bytes"

    assert key_counts(read_topic(kafka.bootstrap, topic, SMALL)) == {
        f"k{i}": 1 for i in range(SMALL)
    }
    dead = read_topic(kafka.bootstrap, dlq, 1)
    assert [(r["key"], r["value"]) for r in dead] == [("big", None)]  # a reference only
    assert "is over the sink's limit of 19939 bytes" in dead[0]["headers"]["fanout.error"]


def _config(producer: dict[str, Any], limit: int | None) -> dict[str, Any]:
    return producer_config(producer, "h:1", "t-0", 60_000, max_batch_bytes=limit)


def test_batch_size_is_capped_to_the_limit_and_a_smaller_one_is_kept() -> None:
    assert _config({}, LIMIT)["batch.size"] == LIMIT
    assert _config({"batch.size": 500_000}, LIMIT)["batch.size"] == LIMIT
    assert _config({"batch.size": 5_000}, LIMIT)["batch.size"] == 5_000
    assert "batch.size" not in _config({}, 1_048_588)  # librdkafka's 1000000 fits
    assert "batch.size" not in _config({}, None)
