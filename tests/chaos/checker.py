"""The independent checker: reads every sink with its own client, none of fanout's code.

Per sink: expected, present, missing, duplicated (and wrong values where a row can be
compared).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SinkCheck:
    """What one sink holds compared with the input."""

    sink: str
    expected: int
    present: int
    missing: int
    duplicated: int
    wrong: int = 0

    @property
    def exact(self) -> bool:
        """Every row once, with the right values."""
        return self.missing == self.duplicated == self.wrong == 0 and self.present == self.expected


def _compare(
    sink: str, expected: dict[int, dict[str, Any]], got: Iterable[dict[str, Any]]
) -> SinkCheck:
    rows = list(got)
    counts = Counter(r["order_id"] for r in rows)
    wrong = sum(1 for r in rows if r["order_id"] in expected and r != expected[r["order_id"]])
    return SinkCheck(
        sink=sink,
        expected=len(expected),
        present=len(rows),
        missing=len(expected.keys() - counts.keys()),
        duplicated=sum(c - 1 for c in counts.values() if c > 1),
        wrong=wrong,
    )


def check_delta(path: Path, expected: dict[int, dict[str, Any]]) -> SinkCheck:
    """The Delta table, read with delta-rs."""
    from fanout.delta_tables.io import read_delta

    return _compare("lake (delta)", expected, read_delta(str(path)).to_pylist())


def libpq_url(sqlalchemy_url: str) -> str:
    """``postgresql+psycopg2://...`` as a libpq URI."""
    scheme, sep, rest = sqlalchemy_url.partition("://")
    return f"{scheme.split('+')[0]}{sep}{rest}"


def check_postgres(
    url: str, table: str, expected: dict[int, dict[str, Any]], label: str = "pg (postgres)"
) -> SinkCheck:
    """The PostgreSQL table, read with psycopg2."""
    import psycopg2
    import psycopg2.extras

    with (
        psycopg2.connect(libpq_url(url)) as conn,
        conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur,
    ):
        cur.execute(f'SELECT order_id, customer, amount, status FROM "{table}"')
        rows = [dict(r) for r in cur.fetchall()]
    return _compare(label, expected, rows)


STALL_S = 20.0
"""A Kafka read that got records but is still short stops after this long without one
(the topic was written before the check starts: once its consumer is assigned, a reader
from the earliest offset gets every record in seconds)."""


def check_kafka(
    bootstrap: str, topic: str, expected: dict[int, dict[str, Any]], timeout_s: float = 90
) -> SinkCheck:
    """The topic as a ``read_committed`` reader of Kafka sees it: on Kafka, read so until
    every expected record arrived and then a quiet spell (to see extras), or a timeout;
    never from watermarks.

    A broker that shows aborted records to read_committed readers (Tansu: its fetch
    responses list no aborted transaction) still writes the transactions' markers, so
    there the log is read raw and only committed transactions count
    (``kafka_log.committed_records``): the check is as exact as on Kafka, and a record
    written twice is a record committed twice."""
    from kafkatools import broker_hides_aborted

    if not broker_hides_aborted(bootstrap):
        return _compare("bus (kafka) log markers", expected, _committed_in_log(bootstrap, topic))
    rows = _read_kafka(bootstrap, topic, len(expected), timeout_s)
    return _compare("bus (kafka)", expected, rows)


def _committed_in_log(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from kafka_log import committed_values

    return [_row(value) for value in committed_values(bootstrap, topic)]


def _row(value: bytes) -> dict[str, Any]:
    """A record's value as the input row it carries (the fields the input has)."""
    record = json.loads(value)
    return {k: record[k] for k in ("order_id", "customer", "amount", "status")}


def _read_kafka(
    bootstrap: str, topic: str, expected: int, timeout_s: float
) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-checker-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",  # where offset 0 is gone (not on Tansu)
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    # From offset 0, not from the broker's "earliest": Tansu answers that with the batch it
    # stored first by its wall clock, which a clock stepped back puts after offset 0.
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in sorted(partitions)])
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    last_seen = 0.0
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if len(rows) >= expected:
                    quiet_until = quiet_until or time.monotonic() + 3
                    if time.monotonic() > quiet_until:
                        break
                elif rows and time.monotonic() - last_seen > STALL_S:
                    break  # short, and nothing more comes: the log holds no more to read
                continue
            last_seen = time.monotonic()
            raw = message.value()
            if message.error() or raw is None:
                continue
            rows.append(_row(raw))
            quiet_until = None
    finally:
        consumer.close()
    return rows
