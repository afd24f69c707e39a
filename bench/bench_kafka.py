#!/usr/bin/env python
"""The Kafka sink against plain idempotent producers and librdkafka's own cost per record.

    python bench/bench_kafka.py [--rows 500000] [--batches 5] [--partitions 4] [--repeat 2]
                                [--bootstrap HOST:PORT]

The variants write the same cached rows, hash-partitioned by ``order_id`` into
``--partitions`` Spark partitions and encoded the same way (key = order_id, value = JSON of
the row, fanout's three headers), in ``--batches`` batches:

  sink   fanout_kafka.KafkaSink.write: per partition one transactional producer
         (init_transactions, marker lookup, begin, produce, flush, send_offsets, commit)
  plain  per partition one idempotent, non-transactional producer (acks=all, connecting
         to the brokers at once like the sink's): produce, flush; no markers, no
         transactions
  ready  librdkafka's floor in the tasks: per partition the same records already encoded
         (encoded beforehand by the sink's encoder and cached by Spark, untimed), produced
         without callbacks in one transaction of a producer configured as the sink's
         (init_transactions, begin, produce, flush, commit); no encoding, no markers

Every run writes a fresh topic and is verified by consuming it (read_committed for the
sink): exactly N records, N distinct keys, or the script exits 1. Runs are interleaved and
the best of --repeat is kept. The broker is the embedded Tansu broker unless --bootstrap
names one.

CPU, not wall-clock, is the figure that survives a shared machine: each run also reads the
CPU seconds of Spark's Python workers (``/proc/<pid>/stat`` of the JVM's child processes,
with librdkafka's threads inside them) and prints it per record. The floor beside it is
librdkafka's own cost for the same records on the same broker: the first batch's records as
``ready`` produces them (encoded by the sink's encoder, read back to the driver), produced
by one idempotent producer without callbacks and flushed, timed with ``time.process_time``,
alone on the machine. ``ready`` measures the same cost where the sink pays it: in Spark's
Python workers, two tasks at a time beside the JVM and the broker, interleaved with the
sink's runs, so ``sink / ready`` is what the sink's own code adds to librdkafka's work
under the same load (on a shared 2-core machine the floor alone moved between 3.0 and 5.2
µs a record within an hour while that multiple stayed between 1.0 and 1.3). Spark's own
floor is printed too: the Python workers' CPU for ``mapInArrow`` tasks that only read the
same partitions (and, as every task here, freeze the worker's long-lived objects:
``fanout.partitioned.worker_gc``).
The last line is machine-readable: ``python_us_per_record=<sink's Python-worker CPU µs per
record, best run> floor_us_per_record=<librdkafka's> spark_floor_us_per_record=<Spark's>
above_floors_us=<the sink minus both floors> plain_us_per_record=<plain's>
ratio_vs_plain=<sink rows/s / plain rows/s> task_floor_us_per_record=<ready's>
above_task_floor_us=<the sink minus ready> headerless_floor_us_per_record=<librdkafka's
floor for the same records without their headers>``: fanout's three fixed headers are a
large part of librdkafka's own cost per record. A Kafka topic is checked by
``kafka_count.py``, as bench_three_sinks does.
"""

from __future__ import annotations

import argparse
import atexit
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from common import exit_on_sigterm
from kafka_count import count_once, read_topic
from proc_cpu import python_workers_cpu

from fanout.partitioned.worker_gc import freeze_long_lived_objects

if TYPE_CHECKING:
    from fanout_kafka.records import Record

TARGET = 0.7
PYTHON_TARGET_US = 5.0


def produce_all(
    producer: Any,
    topic: str,
    records: list[Any],
    on_delivery: Any = None,
    *,
    headers: bool = True,
) -> None:
    """Hand every record to ``producer`` (waiting out a full queue), serving its events
    every 1000 records; the caller flushes. ``headers=False`` leaves the records' headers
    out."""
    extra = {} if on_delivery is None else {"on_delivery": on_delivery}
    for i, r in enumerate(records):
        while True:
            try:
                producer.produce(topic, r.value, r.key, headers=r.headers if headers else None,
                                 **extra)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 999:
            producer.poll(0)


def librdkafka_floor(
    bootstrap: str, records: list[Any], partitions: int, *, headers: bool = True
) -> float:
    """Process CPU µs per record of producing ``records`` (ready bytes, with their headers
    unless ``headers=False``) with one idempotent producer, no delivery callbacks, and
    flushing them."""
    from confluent_kafka import Producer

    topic = f"bench-floor-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "partitioner": "murmur2_random"})  # fmt: skip
    producer.list_topics(topic, timeout=10)  # connected before the clock starts
    start = time.process_time()
    produce_all(producer, topic, records, headers=headers)
    remaining = producer.flush(120)
    seconds = time.process_time() - start
    if remaining:
        raise RuntimeError(f"floor: {remaining} records undelivered")
    return 1e6 * seconds / len(records)


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
        freeze_long_lived_objects()  # as the sink's tasks do
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

        produce_all(producer, self.topic, records, delivered)
        remaining = producer.flush(120)
        if remaining or failures:
            raise RuntimeError(f"{remaining} undelivered, {len(failures)} failed: {failures[:3]}")
        yield pa.RecordBatch.from_pylist(
            [{"n": len(records)}], schema=pa.schema([("n", pa.int64())])
        )


def ready_records(
    batches: Iterable[pa.RecordBatch], headers: Iterable[tuple[str, bytes]]
) -> list[Record]:
    """The records of ready ``key``/``value`` batches (:class:`EncodeTask`'s), built by the
    sink's own function."""
    from fanout_kafka.records import records_of

    records: list[Record] = []
    for batch in batches:
        records += records_of(batch.column(0).to_pylist(), batch.column(1).to_pylist(), headers)
    return records


@dataclass(frozen=True)
class EncodeTask:
    """Encodes one partition with the sink's encoder into ready ``key``/``value`` bytes
    (untimed: the input of :class:`ReadyTask`)."""

    encoder: Any

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        records, bad = self.encoder.encode_arrow(batches)
        assert not bad
        yield pa.RecordBatch.from_arrays(
            [pa.array([r.key for r in records], pa.binary()),
             pa.array([r.value for r in records], pa.binary())],
            names=["key", "value"],
        )  # fmt: skip


@dataclass(frozen=True)
class ReadyTask:
    """librdkafka's floor inside Spark's tasks: one partition of ready bytes (with the
    sink's three headers) in one transaction of a producer configured as the sink's (no
    delivery callbacks, no markers, no encoding), in the same workers and under the same
    load as the sink's tasks. Transactional like the sink's: on Tansu a fresh idempotent
    producer's first flush waits ~0.5 s and costs ~1 us a record more."""

    bootstrap: str
    topic: str
    headers: tuple[tuple[str, bytes], ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Producer
        from fanout_kafka.settings import producer_config

        freeze_long_lived_objects()  # as the sink's tasks do
        records = ready_records(batches, self.headers)
        transactional_id = f"bench-ready-{uuid.uuid4().hex}"
        producer = Producer(producer_config({}, self.bootstrap, transactional_id, 60_000))
        producer.init_transactions(30)
        producer.begin_transaction()
        produce_all(producer, self.topic, records)
        remaining = producer.flush(120)
        if remaining:
            raise RuntimeError(f"{remaining} undelivered")
        producer.commit_transaction(30)
        yield pa.RecordBatch.from_pylist(
            [{"n": len(records)}], schema=pa.schema([("n", pa.int64())])
        )


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` task that only reads its partition: Spark's own Python cost."""
    rows = sum(batch.num_rows for batch in batches)
    freeze_long_lived_objects()  # as the sink's tasks do: else the worker's gc.collect()
    # after each task (~25 ms) is most of this floor
    yield pa.RecordBatch.from_pylist([{"n": rows}], schema=pa.schema([("n", pa.int64())]))


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:  # the handle until done
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def verify(bootstrap: str, topic: str, expected: int, committed: bool) -> None:
    """Exactly ``expected`` records with ``expected`` distinct keys (read_committed for the
    sink: :func:`kafka_count.count_once`, which accepts Tansu's stuck last stable offset
    with a warning), or the script exits 1."""
    if committed:
        found = count_once(bootstrap, topic, expected, timeout_s=120, quiet_s=2)
        read = found.committed
        if found.lso_stuck:
            print(f"  WARNING {topic}: Tansu served {read.count} of {expected} committed "
                  f"records to read_committed; read_uncommitted holds exactly {expected}, "
                  "once each (stuck last stable offset)", flush=True)  # fmt: skip
        if found.exact or found.lso_stuck:
            return
    else:
        read = read_topic(bootstrap, topic, expected, "read_uncommitted", 120, quiet_s=2)
        if read.count == expected == len(read.keys):
            return
    print(f"VERIFY FAILED {topic}: {read.count} records, {len(read.keys)} keys, "
          f"expected {expected}")  # fmt: skip
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
    exit_on_sigterm()  # ... and when killed

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

    def measured(label: str, variant: str) -> float:
        """One run of ``variant`` on a fresh broker and topic: its writes timed, with the
        Python workers' CPU, then the topic verified (not after a warm-up)."""
        bootstrap = fresh_bootstrap()
        topic = f"bench-{variant}-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        set_up, committed = writers[variant]
        write = set_up(bootstrap, topic)  # before the clock starts
        cpu, start = python_workers_cpu(), time.perf_counter()
        write()
        seconds = time.perf_counter() - start
        worker_cpu[label].append(python_workers_cpu() - cpu)
        if label != "warm-up":
            verify(bootstrap, topic, total, committed=committed)
        return seconds

    def sink_writes(bootstrap: str, topic: str) -> Callable[[], None]:
        pipeline = f"bench{uuid.uuid4().hex[:6]}"
        sink = KafkaSink("kafka", bootstrap_servers=bootstrap, topic=topic, key="order_id",
                         partitions=args.partitions)  # fmt: skip
        sink.open(SinkContext(pipeline, spark))

        def write() -> None:
            for b, df in enumerate(frames):
                result = sink.write(Batch(df, BatchInfo(pipeline, b), "kafka",
                                          txn_app_id(pipeline, "kafka")))  # fmt: skip
                assert result.details["written"] == per, result.details

        return write

    def plain_writes(bootstrap: str, topic: str) -> Callable[[], None]:
        sink = KafkaSink("kafka", bootstrap_servers=bootstrap, topic=topic, key="order_id",
                         partitions=args.partitions, create_topic=True)  # fmt: skip
        sink.open(SinkContext("plain", spark))

        def write() -> None:
            for b, df in enumerate(frames):
                settings = sink.settings(Batch(df, BatchInfo("plain", b), "kafka",
                                               txn_app_id("plain", "kafka")))  # fmt: skip
                task = PlainTask(bootstrap, topic, settings.encoder)
                parted = df.repartition(args.partitions, "order_id")
                written = sum(r.n for r in parted.mapInArrow(task, "n LONG").collect())
                assert written == per, written

        return write

    def ready_writes(bootstrap: str, topic: str) -> Callable[[], None]:
        def write() -> None:
            for b, df in enumerate(ready):
                task = ReadyTask(bootstrap, topic, batch_headers("bench", "kafka", b))
                written = sum(r.n for r in df.mapInArrow(task, "n LONG").collect())
                assert written == per, written

        return write

    # each variant's set-up, and whether its topic is read committed
    writers = {"sink": (sink_writes, True), "plain": (plain_writes, False),
               "ready": (ready_writes, False)}  # fmt: skip

    # the ready bytes of librdkafka's floor in the tasks: each batch's partitions encoded
    # by the sink's encoder, kept in Spark's cache (untimed)
    from fanout_kafka.records import Encoder, batch_headers

    encoder = Encoder(("order_id",), None, (), batch_headers("bench", "kafka", 0), 1 << 20)
    ready = []
    for df in frames:
        encoded = (
            df.repartition(args.partitions, "order_id")
            .mapInArrow(EncodeTask(encoder), "key BINARY, value BINARY")
            .cache()
        )
        assert encoded.count() == per
        ready.append(encoded)
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    worker_cpu: dict[str, list[float]] = {"warm-up": [], **{v: [] for v in writers}}
    # warm-up on the first batch only (Python workers, JIT)
    saved, saved_ready = frames, ready
    frames, ready = frames[:1], ready[:1]
    for variant in writers:
        measured("warm-up", variant)
    frames, ready = saved, saved_ready
    times: dict[str, list[float]] = {v: [] for v in writers}
    for r in range(args.repeat):
        order = ("sink", "ready", "plain") if r % 2 == 0 else ("plain", "ready", "sink")
        for variant in order:
            seconds = measured(variant, variant)
            times[variant].append(seconds)
            print(f"  run {r + 1} {variant:5s} {seconds:7.2f} s  {total / seconds:10.0f} rows/s",
                  flush=True)  # fmt: skip
    # the floor: the first batch's ready records, through a bare producer
    records = ready_records(ready[0].toArrow().to_batches(), batch_headers("bench", "kafka", 0))
    floors: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(3):  # interleaved: what the records' fixed headers cost librdkafka
        for headers in (True, False):
            bootstrap = fresh_bootstrap()
            floors[headers].append(
                librdkafka_floor(bootstrap, records, args.partitions, headers=headers)
            )
    floor, headerless = min(floors[True]), min(floors[False])
    # Spark's floor: the same partitions read by a task that does nothing with them
    spark_runs = []
    for _ in range(2):
        cpu = python_workers_cpu()
        for df in frames:
            parted = df.repartition(args.partitions, "order_id")
            assert sum(r.n for r in parted.mapInArrow(count_rows, "n LONG").collect()) == per
        spark_runs.append(python_workers_cpu() - cpu)
    spark_floor = 1e6 * min(spark_runs) / total
    best = {v: min(t) for v, t in times.items()}
    us = {v: 1e6 * min(worker_cpu[v]) / total for v in writers}
    print(f"{'variant':8s} {'best s':>8s} {'rows/s':>10s} {'py-worker CPU us/rec (best)':>28s}")
    for variant in writers:
        print(f"{variant:8s} {best[variant]:8.2f} {total / best[variant]:10.0f} "
              f"{us[variant]:28.2f}")  # fmt: skip
    print(f"librdkafka floor (produce + flush of ready records, no callbacks): {floor:.2f} us/rec")
    print(f"  of it, the records' {len(records[0].headers)} fixed headers: "
          f"{floor - headerless:.2f} us/rec (the same records without them: "
          f"{headerless:.2f})")  # fmt: skip
    print(f"librdkafka floor in the tasks (ready: ready records in one transaction per "
          f"partition, in Spark's Python workers beside the sink's runs): "
          f"{us['ready']:.2f} us/rec")  # fmt: skip
    print(f"Spark floor (mapInArrow tasks that only read the same partitions): "
          f"{spark_floor:.2f} us/rec")  # fmt: skip
    above = us["sink"] - floor - spark_floor
    print(f"sink above both floors (encoding, transactions, markers): {above:.2f} us/rec")
    above_ready = us["sink"] - us["ready"]
    print(f"sink above the floor in the tasks (encoding, markers, checks): "
          f"{above_ready:.2f} us/rec")  # fmt: skip
    print(
        "py-worker CPU s per run: "
        + ", ".join(f"{v} {' '.join(f'{c:.2f}' for c in cs)}" for v, cs in worker_cpu.items())
    )
    ratio = best["plain"] / best["sink"]
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"sink vs plain: {ratio:.3f} (target >= {TARGET}) {verdict}; all runs verified")
    python_verdict = "PASS" if us["sink"] <= PYTHON_TARGET_US else "MISS"
    print(f"sink Python CPU: {us['sink']:.2f} us/record (target <= {PYTHON_TARGET_US}) "
          f"{python_verdict}, {us['sink'] / floor:.2f}x librdkafka's floor, "
          f"{us['sink'] / us['ready']:.2f}x its floor in the tasks")  # fmt: skip
    spark.stop()
    while brokers:
        brokers.pop().stop()
    print(f"python_us_per_record={us['sink']:.2f} floor_us_per_record={floor:.2f} "
          f"spark_floor_us_per_record={spark_floor:.2f} above_floors_us={above:.2f} "
          f"plain_us_per_record={us['plain']:.2f} ratio_vs_plain={ratio:.3f} "
          f"task_floor_us_per_record={us['ready']:.2f} "
          f"above_task_floor_us={above_ready:.2f} "
          f"headerless_floor_us_per_record={headerless:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
