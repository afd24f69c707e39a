"""The Kafka tests' broker: the embedded Tansu broker, started once per test session, or
a real cluster when ``FANOUT_KAFKA_BOOTSTRAP`` is set (e.g. the docker-compose Kafka)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.kafka.kafkatools import Broker, create_topic

ENV_BOOTSTRAP = "FANOUT_KAFKA_BOOTSTRAP"


def _hides_aborted(bootstrap: str) -> bool:
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
            seen.append(message.value())
    consumer.close()
    assert b"committed" in seen, f"the probe read nothing committed from {bootstrap}"
    return b"aborted" not in seen


@pytest.fixture(scope="session")
def kafka() -> Iterator[Broker]:
    """The broker of this test session."""
    external = os.environ.get(ENV_BOOTSTRAP)
    if external:
        yield Broker(external, embedded=False, hides_aborted=_hides_aborted(external))
        return
    from fanout_kafka.embedded import EmbeddedKafka

    with EmbeddedKafka() as bootstrap:
        yield Broker(bootstrap, embedded=True, hides_aborted=_hides_aborted(bootstrap))


@pytest.fixture
def topic(kafka: Broker) -> str:
    """A fresh 3-partition topic."""
    name = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, 3)
    return name
