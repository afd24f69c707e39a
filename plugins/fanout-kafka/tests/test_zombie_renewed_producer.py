"""A zombie attempt whose partition writer makes a second producer -- for a journal's
offset (a Delta dead-letter target and letters to name), or to redo a transaction after
the producer refused a record -- must not commit the batch after its successor committed
it. The second ``init_transactions`` fenced the successor (already done) and nothing read
the marker again, so the zombie's records were committed a second time: duplicates for
read_committed readers. Read here from the log's committed transactions (Tansu shows
aborted ones to read_committed readers)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from fanout_kafka import KafkaSink
from fanout_kafka.transaction import PartitionWriter
from kafka_log import committed_values
from kafkatools import Broker, marker

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from tests.integration.streams import delta_rows


def _rows(tag: str, last: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": f"k{i}", "v": f"{tag}{i}"} for i in range(3)] + [last]


def _settings(sink: KafkaSink, pipeline: str) -> Any:
    return sink.settings(Batch(None, BatchInfo(pipeline, 0), "events",
                               txn_app_id(pipeline, "events")))  # fmt: skip


def _successor(settings: Any, last: dict[str, Any]) -> None:
    done = PartitionWriter(settings, partition=0, batch_id=0).run(
        [pa.RecordBatch.from_pylist(_rows("s", last))]
    )
    assert (done.status, done.written, done.dead_lettered) == ("committed", 3, 1)


def test_a_zombie_with_journaled_letters_does_not_commit_the_batch_again(
    kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """The zombie prepares ("not written yet"), its successor writes the partition (a
    null key among its rows: a letter for the Delta table), then the zombie writes: its
    journal needs a producer reporting every delivery, made after the successor's commit."""
    pipeline, null_key = f"zr{uuid.uuid4().hex[:6]}", {"id": None, "v": "no key"}
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=1)  # fmt: skip
    sink.open(SinkContext(pipeline, dead_letters=DeltaDeadLetters(str(tmp_path / "dlq"))))
    settings = _settings(sink, pipeline)
    zombie = PartitionWriter(settings, partition=0, batch_id=0)
    assert zombie.prepare() is False
    _successor(settings, null_key)

    late = zombie.write(*settings.encoder.encode_all(_rows("z", null_key)), prepared=True)
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"s0", b"s1", b"s2"]
    assert (late.status, late.dead_lettered) == ("skipped", 1)
    assert [r["reason"] for r in delta_rows(tmp_path / "dlq")] == [
        'null key: key column(s) \'id\' are null in row {"id": null, "v": "no key"}'
    ]
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 1


def test_a_zombie_redoing_a_refused_transaction_does_not_commit_the_batch_again(
    kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """The zombie's first transaction is refused a record by its producer (over its
    ``message.max.bytes``, which ``max_record_bytes`` lets through) and aborted; its
    successor writes the partition before the zombie makes its second producer."""
    pipeline = f"zr{uuid.uuid4().hex[:6]}"
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=1, max_record_bytes=100_000,
                     producer={"message.max.bytes": 2000, "linger.ms": 0})  # fmt: skip
    sink.open(SinkContext(pipeline, dead_letters=DeltaDeadLetters(str(tmp_path / "dlq"))))
    settings, big = _settings(sink, pipeline), {"id": "big", "v": "b" * 3000}
    zombie = PartitionWriter(settings, partition=0, batch_id=0)
    assert zombie.prepare() is False
    renew = zombie._new_producer

    def successor_first(**kwargs: Any) -> None:  # the successor runs in this gap
        _successor(settings, big)
        renew(**kwargs)

    zombie._new_producer = successor_first  # type: ignore[method-assign]
    late = zombie.write(*settings.encoder.encode_all(_rows("z", big)), prepared=True)
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"s0", b"s1", b"s2"]
    assert (late.status, late.dead_lettered) == ("skipped", 1), late.failure
    assert [json.loads(r["details"])["key"] for r in delta_rows(tmp_path / "dlq")] == ["big"]
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 1
