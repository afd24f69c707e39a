"""Independent reads of a Kafka cluster for the tests (no fanout code): a read_committed
consumer in a separate process, markers as committed offsets, topic creation."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CONSUME = Path(__file__).with_name("consume.py")


@dataclass(frozen=True)
class Broker:
    """The broker the tests run against.

    :param bootstrap: ``host:port``.
    :param embedded: True for the embedded Tansu broker.
    :param hides_aborted: whether read_committed readers are spared aborted records
        (Kafka: yes; Tansu: no, see the plugin README), probed at session start.
    """

    bootstrap: str
    embedded: bool
    hides_aborted: bool


def read_topic(
    bootstrap: str, topic: str, expected: int, *, timeout: float = 30.0, idle: float = 1.0
) -> list[dict[str, Any]]:
    """Every record a read_committed consumer in another process reads (until
    ``expected`` arrived and then ``idle`` seconds of silence, or ``timeout``)."""
    out = subprocess.run(
        [sys.executable, str(CONSUME), bootstrap, topic, str(expected),
         "--timeout", str(timeout), "--idle", str(idle)],
        capture_output=True, text=True, timeout=timeout + 30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return list(result["records"])


def key_counts(records: list[dict[str, Any]]) -> Counter[str]:
    """How often each key was read."""
    return Counter(str(r["key"]) for r in records)


def create_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    """Create a topic (explicitly: the embedded broker loses the first records of
    auto-created topics)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def marker(bootstrap: str, pipeline: str, sink: str, partition: int, topic: str) -> int:
    """The committed marker offset of one partition's group (-1001 when none)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fanout.{pipeline}.{sink}.p{partition}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()
