#!/usr/bin/env python
"""The Kafka sink's throughput against plain idempotent producers.

    python bench/bench_kafka.py [--rows 500000] [--batches 5] [--partitions 4] [--repeat 2]
                                [--bootstrap HOST:PORT]

Both variants write the same cached rows, hash-partitioned by ``order_id`` into
``--partitions`` Spark partitions and encoded the same way (key = order_id, value = JSON of
the row, fanout's three headers), in ``--batches`` batches:

  sink   fanout_kafka.KafkaSink.write: per partition one transactional producer
         (init_transactions, marker lookup, begin, produce, flush, send_offsets, commit)
  plain  per partition one idempotent, non-transactional producer (acks=all, connecting
         to the brokers at once like the sink's): produce, flush; no markers, no
         transactions

Every run writes a fresh topic and is verified by consuming it (read_committed for the
sink): exactly N records, N distinct keys, or the script exits 1. Runs are interleaved and
the best of --repeat is kept. The broker is the embedded Tansu broker unless --bootstrap
names one. The last line is machine-readable: ``ratio_vs_plain=<sink rows/s / plain rows/s>``.
"""

from __future__ import annotations

import argparse
import atexit
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

TARGET = 0.7


@dataclass(frozen=True)
class PlainTask:
    """One partition through one idempotent producer, with delivery callbacks."""

    bootstrap: str
    topic: str
    encoder: Any

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Producer
        from fanout_kafka.settings import LIVELY_CONNECTIONS

        records, bad = self.encoder.encode_arrow(batches)
        assert not bad
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",
                **LIVELY_CONNECTIONS,  # as the sink's producers: no lazy connect
            }
        )
        failures: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(err)

        for i, r in enumerate(records):
            while True:
                try:
                    producer.produce(self.topic, r.value, r.key, headers=r.headers,
                                     on_delivery=delivered)  # fmt: skip
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 1000 == 999:
                producer.poll(0)
        remaining = producer.flush(120)
        if remaining or failures:
            raise RuntimeError(f"{remaining} undelivered, {len(failures)} failed: {failures[:3]}")
        yield pa.RecordBatch.from_pylist(
            [{"n": len(records)}], schema=pa.schema([("n", pa.int64())])
        )


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep the handle until done
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def verify(bootstrap: str, topic: str, expected: int, committed: bool) -> None:
    """Consume the topic until ``expected`` records and 2 s of silence (or 120 s)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4()}",
                         "isolation.level": "read_committed" if committed else "read_uncommitted",
                         "enable.auto.commit": False})  # fmt: skip
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, -2) for p in parts])
    keys: set[bytes] = set()
    count, start, last = 0, time.monotonic(), time.monotonic()
    while time.monotonic() - start < 120:
        if count >= expected and time.monotonic() - last > 2:
            break
        for message in consumer.consume(10000, timeout=0.5):
            if message.error():
                continue
            count += 1
            keys.add(message.key())
            last = time.monotonic()
    consumer.close()
    if count != expected or len(keys) != expected:
        print(f"VERIFY FAILED {topic}: {count} records, {len(keys)} keys, expected {expected}")
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--bootstrap")
    args = parser.parse_args()

    from fanout_kafka import KafkaSink
    from fanout_kafka.embedded import EmbeddedKafka

    from fanout.contract.batch import Batch, BatchInfo, txn_app_id
    from fanout.contract.sink import SinkContext
    from fanout.spark import local_session

    brokers: list[Any] = []
    atexit.register(lambda: [b.stop() for b in brokers])  # also when verify() exits early

    def fresh_bootstrap() -> str:
        """A new, empty embedded broker per run (Tansu keeps every record in memory and,
        holding a few million, stops serving some), or the external one."""
        if args.bootstrap:
            return str(args.bootstrap)
        while brokers:
            brokers.pop().stop()
        brokers.append(EmbeddedKafka())
        return str(brokers[-1].start())

    bootstrap = fresh_bootstrap()
    spark = local_session("fanout-bench-kafka")
    from pyspark.sql import functions as F

    per = args.rows // args.batches
    frames = []
    for b in range(args.batches):
        df = (
            spark.range(b * per, (b + 1) * per)
            .withColumnRenamed("id", "order_id")
            .withColumn("customer", F.concat(F.lit("c"), (F.col("order_id") % 1000).cast("string")))
            .withColumn("amount", (F.col("order_id") % 10000) / 100.0)
            .withColumn(
                "status",
                F.element_at(
                    F.array(*map(F.lit, ["new", "paid", "shipped"])),
                    (F.col("order_id") % 3 + 1).cast("int"),
                ),
            )
            .cache()
        )
        df.count()
        frames.append(df)
    total = per * args.batches
    kind = "embedded Tansu, a new broker per run" if brokers else "external"
    print(
        f"broker {bootstrap} ({kind}), {total} rows in {args.batches} batches, "
        f"{args.partitions} partitions, local[2]",
        flush=True,
    )

    def run_sink(label: str) -> float:
        bootstrap = fresh_bootstrap()
        topic = f"bench-sink-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        pipeline = f"bench{uuid.uuid4().hex[:6]}"
        sink = KafkaSink("kafka", bootstrap_servers=bootstrap, topic=topic, key="order_id",
                         partitions=args.partitions)  # fmt: skip
        sink.open(SinkContext(pipeline, spark))
        start = time.perf_counter()
        for b, df in enumerate(frames):
            result = sink.write(Batch(df, BatchInfo(pipeline, b), "kafka",
                                      txn_app_id(pipeline, "kafka")))  # fmt: skip
            assert result.details["written"] == per, result.details
        seconds = time.perf_counter() - start
        if label != "warm-up":
            verify(bootstrap, topic, total, committed=True)
        return seconds

    def run_plain(label: str) -> float:
        bootstrap = fresh_bootstrap()
        topic = f"bench-plain-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        sink = KafkaSink("kafka", bootstrap_servers=bootstrap, topic=topic, key="order_id",
                         partitions=args.partitions, create_topic=True)  # fmt: skip
        sink.open(SinkContext("plain", spark))
        start = time.perf_counter()
        for b, df in enumerate(frames):
            settings = sink.settings(Batch(df, BatchInfo("plain", b), "kafka",
                                           txn_app_id("plain", "kafka")))  # fmt: skip
            task = PlainTask(bootstrap, topic, settings.encoder)
            parted = df.repartition(args.partitions, "order_id")
            written = sum(r.n for r in parted.mapInArrow(task, "n LONG").collect())
            assert written == per, written
        seconds = time.perf_counter() - start
        if label != "warm-up":
            verify(bootstrap, topic, total, committed=False)
        return seconds

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # warm-up on the first batch only (Python workers, JIT)
    saved = frames
    frames = frames[:1]
    run_sink("warm-up")
    run_plain("warm-up")
    frames = saved
    times: dict[str, list[float]] = {"sink": [], "plain": []}
    for r in range(args.repeat):
        order = ("sink", "plain") if r % 2 == 0 else ("plain", "sink")
        for variant in order:
            seconds = (run_sink if variant == "sink" else run_plain)(variant)
            times[variant].append(seconds)
            print(f"  run {r + 1} {variant:5s} {seconds:7.2f} s  {total / seconds:10.0f} rows/s",
                  flush=True)  # fmt: skip
    best = {v: min(t) for v, t in times.items()}
    print(f"{'variant':8s} {'best s':>8s} {'rows/s':>10s}")
    for variant in ("sink", "plain"):
        print(f"{variant:8s} {best[variant]:8.2f} {total / best[variant]:10.0f}")
    ratio = best["plain"] / best["sink"]
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"sink vs plain: {ratio:.3f} (target >= {TARGET}) {verdict}; all runs verified")
    spark.stop()
    while brokers:
        brokers.pop().stop()
    print(f"ratio_vs_plain={ratio:.3f}")


if __name__ == "__main__":
    main()
