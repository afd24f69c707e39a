"""Embedded PostgreSQL and Kafka-protocol broker for the chaos runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def embedded_services(root: Path) -> Iterator[tuple[str, str]]:
    """``(postgres_url, kafka_bootstrap)`` of servers that live as long as the block."""
    from fanout_kafka.embedded import EmbeddedKafka
    from fanout_postgres.embedded import EmbeddedPostgres

    postgres = EmbeddedPostgres(root / "pgdata", database="chaos", delete=True)
    kafka = EmbeddedKafka()
    try:
        url = postgres.start()
        yield url, kafka.start()
    finally:
        kafka.stop()
        postgres.stop()
