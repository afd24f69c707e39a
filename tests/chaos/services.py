"""Embedded PostgreSQL and Kafka-protocol broker for the chaos runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def embedded_servers(root: Path) -> Iterator[tuple[Any, str, str]]:
    """``(postgres_server, postgres_url, kafka_bootstrap)`` of servers that live as long as
    the block; the PostgreSQL server may be stopped and started again (same URL)."""
    from fanout_kafka.embedded import EmbeddedKafka
    from fanout_postgres.embedded import EmbeddedPostgres

    postgres = EmbeddedPostgres(root / "pgdata", database="chaos", durable=False)
    kafka = EmbeddedKafka()
    try:
        url = postgres.start()
        yield postgres, url, kafka.start()
    finally:
        kafka.stop()
        postgres.stop()


@contextmanager
def embedded_services(root: Path) -> Iterator[tuple[str, str]]:
    """``(postgres_url, kafka_bootstrap)`` of servers that live as long as the block."""
    with embedded_servers(root) as (_server, url, bootstrap):
        yield url, bootstrap
