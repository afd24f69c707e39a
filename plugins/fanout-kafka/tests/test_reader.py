"""The tests' independent reader tells records hidden from read_committed apart from
records that are not there."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from kafkatools import Broker, last_stable_offset_stuck, read_topic


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


def test_records_past_the_expected_count_are_read_as_duplicates(kafka: Broker, topic: str) -> None:
    """The read goes on past ``expected`` for its idle time: records a second committed
    transaction wrote again on other partitions (a retried task's duplicates) are in what
    it returns, with the default idle time."""
    for n, partitions in enumerate(((0,), (1, 2))):
        producer = Producer({"bootstrap.servers": kafka.bootstrap,
                             "transactional.id": f"{topic}-{n}"})  # fmt: skip
        producer.init_transactions(30)
        producer.begin_transaction()
        for partition in partitions:
            for i in range(3):
                producer.produce(topic, b"v", str(i).encode(), partition=partition)
        producer.commit_transaction(30)
    records = read_topic(kafka.bootstrap, topic, 3)
    assert sorted(r["key"] for r in records) == ["0", "0", "0", "1", "1", "1", "2", "2", "2"]


def test_a_stuck_last_stable_offset_is_told_from_a_healthy_or_short_topic(
    kafka: Broker, topic: str
) -> None:
    """The marker check of test_exactly_once relaxes only when this says so: records in
    the log but not visible as committed, on a broker that does not hide aborted ones."""
    plain = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(3):
        plain.produce(topic, b"v", str(i).encode(), partition=1)
    assert plain.flush(30) == 0
    assert not last_stable_offset_stuck(kafka.bootstrap, topic, 3, timeout=3)  # all committed
    # one record short, and not hidden: missing, not stuck
    assert not last_stable_offset_stuck(kafka.bootstrap, topic, 4, timeout=3)

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3, 5):
        producer.produce(topic, b"v", str(i).encode(), partition=0)
    assert producer.flush(30) == 0  # in the log, never committed
    assert last_stable_offset_stuck(kafka.bootstrap, topic, 5, timeout=3) is not kafka.hides_aborted
    producer.abort_transaction(30)
