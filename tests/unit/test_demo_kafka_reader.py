"""The demo's Kafka check reads every partition from offset 0, never from the broker's
"earliest" (Tansu answers that with the batch it stored first by its wall clock: a clock
stepped back hides a partition's first records from a reader starting there; the
reproduction is ``plugins/fanout-kafka/tests/tansu_clock_step.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fanout.app.demo.checks import from_offset_zero

pytest.importorskip("confluent_kafka")


class FakeConsumer:
    """Answers ``list_topics`` for one topic with the given partitions."""

    def __init__(self, topic: str, partitions: list[int]) -> None:
        self.topic = topic
        self.partitions = partitions
        self.asked: list[tuple[str, float]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.asked.append((topic, timeout))
        found = {p: SimpleNamespace(id=p) for p in self.partitions}
        return SimpleNamespace(topics={self.topic: SimpleNamespace(partitions=found)})


def test_every_partition_is_assigned_at_offset_zero() -> None:
    consumer = FakeConsumer("orders", [2, 0, 1])
    assigned = from_offset_zero(consumer, "orders")
    assert [(tp.topic, tp.partition, tp.offset) for tp in assigned] == [
        ("orders", 0, 0),
        ("orders", 1, 0),
        ("orders", 2, 0),
    ]
    assert consumer.asked == [("orders", 10)]


def test_a_topic_without_partitions_assigns_nothing() -> None:
    assert from_offset_zero(FakeConsumer("orders", []), "orders") == []
