"""The sink's producers ask for failed delivery reports only
(``delivery.report.only.error``). The sink acts on failures alone; these tests pin down what
it relies on, with the sink's own producer settings and a real broker: delivered records
call no callback, and an undelivered record still does."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import KafkaError, Producer
from fanout_kafka.embedded import free_port
from fanout_kafka.settings import producer_config
from kafkatools import Broker, key_counts, read_topic


def _config(bootstrap: str, transactional_id: str, timeout_ms: int) -> dict[str, Any]:
    return producer_config({}, bootstrap, transactional_id, timeout_ms)


def test_delivered_records_call_no_callback(kafka: Broker, topic: str) -> None:
    producer = Producer(_config(kafka.bootstrap, f"dr-{uuid.uuid4().hex[:8]}", 30000))
    producer.init_transactions(30)
    calls: list[tuple[Any, Any]] = []
    producer.begin_transaction()
    for i in range(50):
        producer.produce(
            topic, b"v", str(i).encode(), on_delivery=lambda e, m: calls.append((e, m))
        )
    assert producer.flush(30) == 0
    producer.commit_transaction(30)
    assert calls == []
    records = read_topic(kafka.bootstrap, topic, 50)
    assert key_counts(records) == {str(i): 1 for i in range(50)}


def test_an_undelivered_record_still_calls_back_with_its_error() -> None:
    # nothing listens on the port: the record times out in the producer's queue
    config = _config(f"127.0.0.1:{free_port()}", "unused", 1000)
    del config["transactional.id"]
    producer = Producer({**config, "socket.connection.setup.timeout.ms": 1000})
    calls: list[tuple[Any, Any]] = []
    producer.produce("orders", b"v", b"k1", on_delivery=lambda e, m: calls.append((e, m)))
    assert producer.flush(20) == 0
    assert len(calls) == 1
    error, message = calls[0]
    assert error is not None and error.code() == KafkaError._MSG_TIMED_OUT
    assert message.key() == b"k1" and message.topic() == "orders"
