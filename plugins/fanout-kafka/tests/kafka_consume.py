"""An independent read_committed consumer, run as a separate process by the tests.

usage: python kafka_consume.py BOOTSTRAP TOPIC EXPECTED [--timeout S] [--idle S] [--uncommitted]

Reads every partition of TOPIC from offset 0 until EXPECTED records arrived and then
nothing more for --idle seconds (extra records would be duplicates), or until --timeout.
Never uses watermarks (the embedded broker reports them wrongly). Prints one JSON object:
{"records": [{"partition", "offset", "key", "value", "headers"}...], "timed_out": bool}.
No fanout code is used.
"""

from __future__ import annotations

import argparse
import json
import time

from confluent_kafka import Consumer, TopicPartition


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("expected", type=int)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--idle", type=float, default=1.5)
    parser.add_argument("--uncommitted", action="store_true")
    args = parser.parse_args()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"fanout-test-reader-{time.time_ns()}",
            "isolation.level": "read_uncommitted" if args.uncommitted else "read_committed",
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,
            "auto.offset.reset": "earliest",  # where offset 0 is gone (not on Tansu)
            # an empty fetch returns after 100 ms, not librdkafka's 500: the idle time's
            # silence spans several empty fetches of every partition
            "fetch.wait.max.ms": 100,
        }
    )
    metadata = consumer.list_topics(args.topic, timeout=10)
    partitions = sorted(metadata.topics[args.topic].partitions)
    # From offset 0, not from the broker's "earliest": Tansu answers that with the batch it
    # stored first by its wall clock, which a clock stepped back puts after offset 0.
    consumer.assign([TopicPartition(args.topic, p, 0) for p in partitions])
    records: list[dict[str, object]] = []
    start = last = time.monotonic()
    while True:
        now = time.monotonic()
        if now - start > args.timeout:
            timed_out = True
            break
        if len(records) >= args.expected and now - last > args.idle:
            timed_out = False
            break
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error():
            continue
        last = time.monotonic()
        key, value = message.key(), message.value()
        records.append(
            {
                "partition": message.partition(),
                "offset": message.offset(),
                "key": None if key is None else key.decode(errors="replace"),
                "value": None if value is None else value.decode(errors="replace"),
                "headers": {k: v.decode() for k, v in (message.headers() or [])},
            }
        )
    consumer.close()
    print(json.dumps({"records": records, "timed_out": timed_out}))


if __name__ == "__main__":
    main()
