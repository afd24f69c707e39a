"""The pluggy plugin module registered under the ``fanout`` entry-point group.

It provides the ``kafka`` sink type and the embedded Kafka-protocol broker of
``fanout demo`` and ``fanout dev``. Heavy modules are imported only when a hook asks for
what they hold, so ``fanout --help`` stays quick.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from fanout.contract.sink import Sink
from fanout.hooks.services import EmbeddedService
from fanout.hooks.specs import hookimpl


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """Provide the ``kafka`` sink type (:class:`fanout_kafka.KafkaSink`)."""
    from fanout_kafka.sink import KafkaSink

    return {"kafka": KafkaSink}


@hookimpl
def fanout_embedded_services() -> list[EmbeddedService]:
    """Provide the embedded broker (``pip install 'fanout-kafka[embedded]'``)."""
    return [EmbeddedService("kafka", "Kafka", "FANOUT_KAFKA_BOOTSTRAP", start=embedded_broker)]


def embedded_broker(root: Path) -> AbstractContextManager[str]:
    """A Tansu broker in memory on a free loopback port (``root`` is not used); entering it
    yields its bootstrap address."""
    from fanout_kafka.embedded import EmbeddedKafka

    return EmbeddedKafka()
