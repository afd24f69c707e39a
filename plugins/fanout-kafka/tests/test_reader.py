"""The tests' independent reader tells records hidden from read_committed apart from
records that are not there."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from kafkatools import Broker, read_topic


def test_records_of_an_open_transaction_fail_as_hidden_not_as_lost(
    kafka: Broker, topic: str
) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, b"v", str(i).encode(), partition=0)
    assert producer.flush(30) == 0  # in the log, never committed
    hidden = "read_committed got 0 of 5, read_uncommitted 5"
    if kafka.hides_aborted:  # Kafka: a failure saying the records are hidden
        with pytest.raises(AssertionError) as caught:
            read_topic(kafka.bootstrap, topic, 5, timeout=3, idle=0.5)
        assert hidden in str(caught.value)
    else:  # Tansu: the uncommitted records, with a warning saying so
        with pytest.warns(UserWarning, match=hidden):
            records = read_topic(kafka.bootstrap, topic, 5, timeout=3, idle=0.5)
        assert sorted(r["key"] for r in records) == ["0", "1", "2", "3", "4"]
    producer.abort_transaction(30)


def test_a_short_topic_returns_what_it_holds(kafka: Broker, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(3):
        producer.produce(topic, b"v", str(i).encode(), partition=1)
    assert producer.flush(30) == 0
    records = read_topic(kafka.bootstrap, topic, 5, timeout=3, idle=0.5)
    assert sorted(r["key"] for r in records) == ["0", "1", "2"]
