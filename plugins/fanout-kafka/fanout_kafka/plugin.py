"""The pluggy plugin module registered under the ``fanout`` entry-point group.

It provides the ``kafka`` sink type and dead-letter kind, and the embedded Kafka-protocol
broker of ``fanout demo`` and ``fanout dev``.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from fanout.contract.sink import Sink
from fanout.deadletters.target import DeadLetterKind
from fanout.errors import ConfigurationError
from fanout.hooks.services import EmbeddedService
from fanout.hooks.specs import hookimpl
from fanout_kafka.deadletter import KAFKA, KafkaDeadLetters
from fanout_kafka.options import check_topic_name


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink] | str]:
    """Provide the ``kafka`` sink type (:class:`fanout_kafka.KafkaSink`), as a lazy
    reference: its module (confluent-kafka) is imported only when a sink of the type is
    used."""
    return {"kafka": "fanout_kafka.sink:KafkaSink"}


@hookimpl
def fanout_dead_letter_kinds() -> Mapping[str, DeadLetterKind]:
    """Provide the ``kafka`` dead-letter kind: a topic of a Kafka sink's cluster."""
    return {KAFKA: kafka_target}


def kafka_target(location: str, sink: Sink) -> KafkaDeadLetters:
    """The ``kafka`` kind's factory: a topic of ``sink``'s cluster; only a Kafka sink has
    one."""
    from fanout_kafka.sink import KafkaSink

    if not isinstance(sink, KafkaSink):
        raise ConfigurationError(
            f"sink {sink.name!r}: dead_letter 'kafka:{location}' is a topic of a Kafka sink's "
            "cluster; this sink has none (a Delta table path works for every sink)"
        )
    check_topic_name(sink.name, "dead_letter", location)
    return KafkaDeadLetters(location, sink.settings)


@hookimpl
def fanout_embedded_services() -> list[EmbeddedService]:
    """Provide the embedded broker (``pip install 'fanout-kafka[embedded]'``)."""
    return [
        EmbeddedService(
            "kafka", "Kafka", "FANOUT_KAFKA_BOOTSTRAP", start=embedded_broker, answers=answers
        )
    ]


def answers(bootstrap: str, timeout_s: float = 5.0) -> str | None:
    """``None`` when the first broker of ``bootstrap`` (``host:port,...``) accepts a TCP
    connection within ``timeout_s`` seconds, else why not."""
    import socket

    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def embedded_broker(root: Path) -> AbstractContextManager[str]:
    """A Tansu broker in memory on a free loopback port (``root`` is not used); entering it
    yields its bootstrap address."""
    from fanout_kafka.embedded import EmbeddedKafka

    return EmbeddedKafka()
