"""kafka_log: the committed records of a topic, read from the log's own transaction
markers, whatever the broker lists as aborted (Tansu lists nothing)."""

from __future__ import annotations

from confluent_kafka import Producer
from kafka_log import committed_records, describe_duplicates
from kafkatools import Broker


def _producer(bootstrap: str, transactional_id: str | None = None) -> Producer:
    config = {"bootstrap.servers": bootstrap, "linger.ms": 0}
    if transactional_id:
        config["transactional.id"] = transactional_id
    return Producer(config)


def test_only_committed_transactions_and_plain_records_are_read(kafka: Broker, topic: str) -> None:
    bootstrap = kafka.bootstrap
    first = _producer(bootstrap, f"{topic}-a")
    first.init_transactions(30)
    first.begin_transaction()
    for i in range(3):
        first.produce(topic, f"aborted-{i}".encode(), b"k", partition=0)
    first.flush(30)
    first.abort_transaction(30)
    first.begin_transaction()
    for i in range(2):
        first.produce(topic, f"committed-{i}".encode(), b"k", partition=0)
        first.produce(topic, f"committed-p1-{i}".encode(), partition=1)
    first.flush(30)
    first.commit_transaction(30)
    first.begin_transaction()
    first.produce(topic, b"fenced", partition=0)
    first.flush(30)  # left open: the next producer with the same id fences it
    second = _producer(bootstrap, f"{topic}-a")
    second.init_transactions(30)
    second.begin_transaction()
    second.produce(topic, b"after-fencing", partition=0)
    second.flush(30)
    second.commit_transaction(30)
    plain = _producer(bootstrap)
    plain.produce(topic, b"plain", partition=2)
    plain.flush(30)
    other = _producer(bootstrap, f"{topic}-b")  # interleaved with nothing: still open
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(topic, b"still-open", partition=2)
    other.flush(30)

    found = committed_records(bootstrap, topic, 3)

    assert [(r.partition, r.value) for r in found] == [
        (0, b"committed-0"),
        (0, b"committed-1"),
        (0, b"after-fencing"),
        (1, b"committed-p1-0"),
        (1, b"committed-p1-1"),
        (2, b"plain"),
    ]
    assert [r.key for r in found[:2]] == [b"k", b"k"]
    assert [r.offset for r in found if r.partition == 1] == [0, 1]
    offsets = [r.offset for r in found if r.partition == 0]
    assert offsets == sorted(offsets) and offsets[0] > 2  # after the aborted three
    other.abort_transaction(30)


def test_duplicates_are_described_by_where_each_copy_sits(kafka: Broker, topic: str) -> None:
    bootstrap = kafka.bootstrap
    for attempt in range(2):  # the same record committed twice, by two producers
        producer = _producer(bootstrap, f"{topic}-{attempt}")
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, b"twice", b"k", partition=1, headers=[("batch", b"7")])
        producer.produce(topic, f"once-{attempt}".encode(), b"k", partition=1)
        producer.flush(30)
        producer.commit_transaction(30)

    lines = describe_duplicates(bootstrap, topic).splitlines()

    assert len(lines) == 1, lines
    value, copies = lines[0].split(": ", 1)
    assert value == "twice"
    first, second = copies.split("; ")
    assert first.startswith("p1@0 producer (") and first.endswith(") batch=7")
    assert second.startswith("p1@") and second.endswith(") batch=7")
    assert first.split(" producer ")[1] != second.split(" producer ")[1]  # two producers
