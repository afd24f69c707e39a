"""Reproduction (a script, not a test: it steps this machine's wall clock, so it needs root
and must run alone): the embedded broker (Tansu 0.6) answers a "beginning"/"earliest"
offset request with the batch it stored first *by its wall clock*, not with offset 0. A
clock stepped back while a partition is written hides the partition's first records from
every reader that starts at the broker's beginning; a reader that starts at offset 0 sees
them all. That is why the tests' reader, the chaos checker, the benchmarks' count and the
demo's check assign offset 0 (with ``auto.offset.reset = earliest`` for a Kafka whose log
no longer holds it).

usage: python plugins/fanout-kafka/tests/tansu_clock_step.py

Prints the records read from the broker's beginning (only the second five) and from offset
0 (all ten), and exits 1 when that difference is not seen.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fanout_kafka.embedded import EmbeddedKafka

STEP_S = 30


def produce(bootstrap: str, topic: str, tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        producer.produce(topic, value=f"{tag}-{i}".encode(), partition=0)
    producer.flush(30)


def read(bootstrap: str, topic: str, offset: int) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"clock-step-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, 0, offset)])
    values, idle = [], 0
    while idle < 6:
        message = consumer.poll(0.5)
        if message is None:
            idle += 1
        elif not message.error():
            values.append((message.value() or b"").decode())
            idle = 0
    consumer.close()
    return values


def main() -> None:
    with EmbeddedKafka() as bootstrap:
        topic = f"clock-{uuid.uuid4().hex[:6]}"
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        produce(bootstrap, topic, "first")
        subprocess.run(["date", "-s", f"-{STEP_S} seconds"], check=True, capture_output=True)
        try:
            produce(bootstrap, topic, "second")
        finally:
            subprocess.run(["date", "-s", f"+{STEP_S} seconds"], check=True, capture_output=True)
        from_beginning = read(bootstrap, topic, -2)  # librdkafka's OFFSET_BEGINNING
        from_zero = read(bootstrap, topic, 0)
    print("from the broker's beginning:", from_beginning)
    print("from offset 0:              ", from_zero)
    seen = len(from_zero) == 10 and from_beginning == [f"second-{i}" for i in range(5)]
    sys.exit(0 if seen else 1)


if __name__ == "__main__":
    main()
