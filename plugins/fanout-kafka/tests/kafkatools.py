"""Independent reads of a Kafka cluster for the tests (no fanout code): a read_committed
consumer in a separate process, markers as committed offsets, topic creation, and a
producer wrapper for tests that override some of its methods."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fanout_kafka.markers import marker_group

CONSUME = Path(__file__).with_name("kafka_consume.py")


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


class WrappedProducer:
    """A real producer (``inner``) standing in for the one fanout makes, for a test to
    override some of its methods: its ``transactional_id``, whether it was ``closed`` (the
    real one is closed by the test), and each one made appended to ``made``."""

    def __init__(self, config: dict[str, Any], made: list[Any]) -> None:
        self.inner = Producer(config)
        self.transactional_id = str(config["transactional.id"])
        self.closed = False
        made.append(self)

    def close(self) -> bool:
        self.closed = True
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def read_topic(
    bootstrap: str, topic: str, expected: int, *, timeout: float = 30.0, idle: float = 0.5
) -> list[dict[str, Any]]:
    """Every record a read_committed consumer in another process reads (until
    ``expected`` arrived and then ``idle`` seconds of silence, or ``timeout``).

    When fewer arrive, the topic is read again uncommitted. If that finds at least
    ``expected``, the records are in the log but not visible as committed: an open
    transaction, or Tansu's stuck last stable offset (plugins/fanout-kafka/README.md).
    On a broker that hides aborted records from read_committed readers (Kafka) that
    fails the test. On one that does not (Tansu), read_committed and read_uncommitted
    differ only in where the last stable offset stands, so the uncommitted records are
    returned, with a warning: the caller's exact checks still fail on any record
    missing, repeated or aborted."""
    result = _consume(bootstrap, topic, expected, timeout, idle)
    records = list(result["records"])
    if result["timed_out"] and len(records) < expected:
        uncommitted = _consume(bootstrap, topic, expected, timeout, idle, "--uncommitted")
        seen = len(uncommitted["records"])
        message = (
            f"records of {topic!r} are in the log but not visible as committed: "
            f"read_committed got {len(records)} of {expected}, read_uncommitted {seen} (an "
            "open transaction, or Tansu's stuck last stable offset: "
            "plugins/fanout-kafka/README.md)"
        )
        if seen >= expected and not broker_hides_aborted(bootstrap):
            warnings.warn(f"{message}; checking the uncommitted read", stacklevel=2)
            return list(uncommitted["records"])
        assert seen < expected, message
    return records


def last_stable_offset_stuck(
    bootstrap: str, topic: str, expected: int, *, timeout: float = 10.0
) -> bool:
    """Whether ``topic``'s records are in the log but not all visible as committed on a
    broker that does not hide aborted records (Tansu's stuck last stable offset, see
    :func:`read_topic`). Tansu then also withholds the consumer-group offsets committed
    in those transactions, fanout's partition markers among them."""
    if broker_hides_aborted(bootstrap):
        return False
    committed = _consume(bootstrap, topic, expected, timeout, 1.0)
    if len(committed["records"]) >= expected:
        return False
    uncommitted = _consume(bootstrap, topic, expected, timeout, 1.0, "--uncommitted")
    return len(uncommitted["records"]) >= expected


@functools.cache
def broker_hides_aborted(bootstrap: str) -> bool:
    """:func:`hides_aborted`, probed once per broker."""
    return hides_aborted(bootstrap)


def _consume(
    bootstrap: str, topic: str, expected: int, timeout: float, idle: float, *flags: str
) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(CONSUME), bootstrap, topic, str(expected),
         "--timeout", str(timeout), "--idle", str(idle), *flags],
        capture_output=True, text=True, timeout=timeout + 30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def key_counts(records: list[dict[str, Any]]) -> Counter[str]:
    """How often each key was read."""
    return Counter(str(r["key"]) for r in records)


def create_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    """Create a topic (explicitly: the embedded broker loses the first records of
    auto-created topics)."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def marker(
    bootstrap: str, pipeline: str, sink: str, partition: int, topic: str, *, suffix: str = ""
) -> int:
    """The committed marker offset of one partition's group (-1001 when none); with
    ``suffix``, of the group ``<marker group><suffix>`` (``.route``, ``.plan``...)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": marker_group(pipeline, sink, partition) + suffix,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def hides_aborted(bootstrap: str) -> bool:
    """Probe: does a read_committed reader skip an aborted transaction's record?"""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"probe-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    for value, commit in ((b"aborted", False), (b"committed", True)):
        producer.begin_transaction()
        producer.produce(topic, value, partition=0)
        producer.flush(30)
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "isolation.level": "read_committed"}
    )
    consumer.assign([TopicPartition(topic, 0, -2)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 15
    while b"committed" not in seen and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            seen.append(message.value() or b"")
    consumer.close()
    assert b"committed" in seen, f"the probe read nothing committed from {bootstrap}"
    return b"aborted" not in seen


def delete_marker_groups(bootstrap: str, pipeline: str, sink: str, partitions: int) -> None:
    """Delete the marker group of each of a sink's ``partitions`` in ``pipeline``'s first
    epoch, as an operator cleaning "unused" consumer groups does (or the broker's offset
    retention): the sink then cannot tell which batches its topic holds."""
    groups = [marker_group(pipeline, sink, p) for p in range(partitions)]
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for deleted in admin.delete_consumer_groups(groups).values():
            deleted.result(10)
