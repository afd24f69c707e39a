"""The demo's proof: each sink read back with its own client, compared with the input.

Each check returns a table row: sink, mode, expected, present, missing, duplicated, wrong.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]


def compare(
    sink: str, mode: str, expected: Mapping[Any, Row], got: Iterable[Row], key: str
) -> list[Any]:
    """The table row of one sink: ``expected`` maps each key to the row it must hold."""
    rows = list(got)
    counts = Counter(r[key] for r in rows)
    wrong = sum(1 for r in rows if r[key] in expected and dict(r) != dict(expected[r[key]]))
    return [
        sink,
        mode,
        len(expected),
        len(rows),
        len(expected.keys() - counts.keys()),
        sum(c - 1 for c in counts.values() if c > 1),
        wrong,
    ]


def latest_per(rows: Iterable[Row], key: str, order: str) -> dict[Any, Row]:
    """Each key's row with the greatest ``order`` value: what an upsert must end with."""
    winners: dict[Any, Row] = {}
    for row in rows:
        if row[key] not in winners or row[order] > winners[row[key]][order]:
            winners[row[key]] = row
    return winners


def delta_rows(path: Path) -> list[dict[str, Any]]:
    """A Delta table's rows, read with delta-rs."""
    from fanout.delta_tables.io import read_delta

    return read_delta(str(path)).to_pylist()


def postgres_rows(url: str, table: str, columns: Iterable[str]) -> list[dict[str, Any]]:
    """A PostgreSQL table's rows, read with SQLAlchemy (identifiers quoted by it)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        target = sa.Table(table, sa.MetaData(), autoload_with=engine)
        with engine.connect() as conn:
            query = sa.select(*[target.c[c] for c in columns])
            return [dict(r._mapping) for r in conn.execute(query)]
    finally:
        engine.dispose()


def from_offset_zero(consumer: Any, topic: str) -> list[Any]:
    """Every partition of ``topic``, to be read from offset 0 rather than from the offset
    the broker calls its beginning: the embedded broker (Tansu) answers "earliest" with the
    batch it stored first by its wall clock, so a clock stepped back while it stored a
    partition hides that partition's first records from a reader that starts there. A
    broker whose log no longer holds offset 0 answers "out of range", and the consumer's
    ``auto.offset.reset = earliest`` starts it at its real beginning."""
    from confluent_kafka import TopicPartition

    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    return [TopicPartition(topic, p, 0) for p in sorted(partitions)]


def kafka_rows(
    bootstrap: str,
    topic: str,
    expected: int,
    timeout_s: float = 30,
    isolation: str = "read_committed",
) -> list[dict[str, Any]]:
    """The topic's records (JSON values) as a ``read_committed`` consumer (or
    ``isolation``) sees them, every partition read from offset 0 (:func:`from_offset_zero`):
    read until ``expected`` arrived and the topic stays quiet for 2 s, or ``timeout_s``."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fanout-demo-check-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign(from_offset_zero(consumer, topic))
    rows: list[dict[str, Any]] = []
    deadline, quiet_since = time.monotonic() + timeout_s, None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.3)
            if message is None or message.error():
                if len(rows) >= expected:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 2:
                        break
                continue
            rows.append(json.loads(message.value() or b"null"))
            quiet_since = None
    finally:
        consumer.close()
    return rows
