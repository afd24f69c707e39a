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
    duplicated_ids: tuple[int, ...] = ()

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
        duplicated_ids=tuple(sorted(i for i, c in counts.items() if c > 1)),
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
    """The topic, read by a ``read_committed`` consumer until every expected record
    arrived and then a quiet spell (to see extras), or a timeout; never from watermarks.

    On a broker that shows aborted records to read_committed readers (Tansu), a
    read_committed read that comes up short is repeated ``read_uncommitted``: there the
    two differ only in where the last stable offset stands, and Tansu's sometimes stops
    moving (plugins/fanout-kafka/README.md). The check is then named
    ``bus (kafka) LSO stuck: uncommitted read`` and is just as exact."""
    from kafkatools import broker_hides_aborted

    rows = _read_kafka(bootstrap, topic, len(expected), "read_committed", timeout_s)
    if len(rows) < len(expected) and not broker_hides_aborted(bootstrap):
        rows = _read_kafka(bootstrap, topic, len(expected), "read_uncommitted", timeout_s)
        return _compare("bus (kafka) LSO stuck: uncommitted read", expected, rows)
    return _compare("bus (kafka)", expected, rows)


def _read_kafka(
    bootstrap: str, topic: str, expected: int, isolation: str, timeout_s: float
) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-checker-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.subscribe([topic])
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
            value = json.loads(raw)
            rows.append({k: value[k] for k in ("order_id", "customer", "amount", "status")})
            quiet_until = None
    finally:
        consumer.close()
    return rows
