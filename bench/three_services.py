"""bench_three_sinks' services (embedded PostgreSQL and Kafka), the sinks each variant
writes to, and the time each sink spends per batch."""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    SCHEMA,
    Ctx,
)

PARTITIONS = 4  # write partitions of the PostgreSQL and Kafka sinks (their default)


@dataclass
class Services:
    """The embedded PostgreSQL server and Kafka broker shared by every run."""

    pg_url: str
    bootstrap: str
    engine: Any = None  # SQLAlchemy engine for verification and cleanup
    admin: Any = None  # confluent_kafka AdminClient
    pg_pid: int | None = None  # the postmaster (its tree: every backend)
    kafka_pid: int | None = None  # the Tansu broker
    counter: int = 0
    kafka: Any = None  # the EmbeddedKafka serving the current run
    lso_stuck: list[str] = field(default_factory=list)  # runs verified uncommitted only

    def fresh_broker(self) -> None:
        """Start a new, empty Tansu broker for the next run (and stop the last one).

        Tansu keeps every record in memory; once a broker holds a few million, some stop
        being served (a plain producer's topic, read uncommitted, lost 6,332 in
        bench_kafka). A broker per run keeps every run's verification about fanout, not
        about Tansu's memory. (Its stuck last stable offset happens with a fresh broker
        too: see :func:`verify_kafka`.)
        """
        from confluent_kafka.admin import AdminClient
        from fanout_kafka.driver_admins import close_admin
        from fanout_kafka.embedded import EmbeddedKafka

        if self.admin is not None:  # destroyed here, never by the garbage collector
            close_admin(self.admin)
        if self.kafka is not None:
            self.kafka.stop()
        self.kafka = EmbeddedKafka()
        self.bootstrap = self.kafka.start()
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        self.kafka_pid = self.kafka.process.pid if self.kafka.process is not None else None

    def unique(self, variant: str) -> str:
        self.counter += 1
        return f"{variant.replace('_', '')}{self.counter:03d}{uuid.uuid4().hex[:6]}"

    def create_topic(self, topic: str, partitions: int) -> None:
        from confluent_kafka.admin import NewTopic

        self.admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)

    def drop(self, tables: list[str], topics: list[str]) -> None:
        """Free the server's memory and disk after a verified run (best effort)."""
        from sqlalchemy import text

        with self.engine.begin() as conn:
            for table in tables:
                conn.execute(text(f'DROP TABLE IF EXISTS "{table}"'))
        if topics:
            for future in self.admin.delete_topics(topics).values():
                with contextlib.suppress(Exception):
                    future.result(30)


@dataclass
class Plan:
    """The names of one run: pipeline, Delta path, PostgreSQL table, Kafka topics."""

    run: Path
    pipeline: str
    delta_path: Path
    table: str
    topic: str
    marker_topic: str


def make_plan(ctx: Ctx, services: Services, variant: str) -> Plan:
    run = ctx.run_dir(variant)
    uid = services.unique(variant)
    plan = Plan(run, f"b3-{uid}", run / "delta", f"bench_{uid}", f"bench-{uid}", f"markers-{uid}")
    services.create_topic(plan.topic, PARTITIONS)  # explicitly, before anything produces
    services.create_topic(plan.marker_topic, 1)
    return plan


def make_sink(kind: str, plan: Plan, services: Services) -> Any:
    """One of fanout's own sinks; every variant builds them here, with the same options."""
    if kind == "delta":
        from fanout_delta.sink import DeltaSink

        return DeltaSink("delta", path=str(plan.delta_path), engine="rs", mode="append")
    if kind == "pg":
        from fanout_postgres import PostgresSink

        return PostgresSink(
            "pg",
            url=services.pg_url,
            table=plan.table,
            keys=["order_id"],
            create_table=True,
            partitions=PARTITIONS,
            batch_schema=SCHEMA,  # created at its first write (timed: one CREATE TABLE)
        )
    if kind == "kafka":
        from fanout_kafka import KafkaSink

        return KafkaSink(
            "kafka",
            bootstrap_servers=services.bootstrap,
            topic=plan.topic,
            key="order_id",
            partitions=PARTITIONS,
            marker_topic=plan.marker_topic,
        )
    raise ValueError(kind)


@dataclass
class SinkTimes:
    """Seconds of every ``sink.write`` call, per sink, appended from any thread."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sink: str, duration_s: float) -> None:
        with self.lock:
            self.seconds[sink].append(duration_s)

    def observer(self) -> object:
        """A fanout observer plugin recording each sink's write time (``fanout_sink_done``:
        ``sink.write`` alone, without the ledger mark)."""
        from fanout import hookimpl

        times = self

        class Observer:
            @hookimpl
            def fanout_sink_done(
                self, info: Any, sink: str, result: Any, duration_s: float
            ) -> None:
                times.add(sink, duration_s)

        return Observer()
