"""The Kafka tests' broker: the embedded Tansu broker, started once per test session, or
a real cluster when ``FANOUT_KAFKA_BOOTSTRAP`` is set (e.g. the docker-compose Kafka).

On the embedded broker a failed Kafka test runs once more (pytest-rerunfailures; the
summary counts it as ``rerun``): Tansu now and then stops advancing its last stable
offset, or a read misses a record, in runs whose code is unchanged
(plugins/fanout-kafka/README.md). A test fails when it fails twice; on a real Kafka it
fails the first time."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator

import pytest
from kafkatools import Broker, create_topic, hides_aborted

ENV_BOOTSTRAP = "FANOUT_KAFKA_BOOTSTRAP"


@pytest.fixture(scope="session")
def kafka() -> Iterator[Broker]:
    """The broker of this test session."""
    external = os.environ.get(ENV_BOOTSTRAP)
    if external:
        yield Broker(external, embedded=False, hides_aborted=hides_aborted(external))
        return
    from fanout_kafka.embedded import EmbeddedKafka

    with EmbeddedKafka() as bootstrap:
        yield Broker(bootstrap, embedded=True, hides_aborted=hides_aborted(bootstrap))
        # Kafka clients caught in reference cycles (a test frame holding a producer and a
        # pytest.raises whose exception's traceback holds that frame) are destroyed by the
        # cyclic collector; do it while the broker still answers, or they print
        # "Connection refused" to stderr after the session
        gc.collect()


@pytest.fixture
def topic(kafka: Broker) -> str:
    """A fresh 3-partition topic."""
    name = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, 3)
    return name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On the embedded broker, the tests of this folder that use it may run twice."""
    if os.environ.get(ENV_BOOTSTRAP):
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here) and "kafka" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.flaky(reruns=1))
