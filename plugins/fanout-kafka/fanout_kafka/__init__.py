"""fanout's Kafka sink: every micro-batch lands exactly once in a Kafka topic.

One transactional producer per Spark partition writes the partition's records and, in the
same transaction, a marker offset (``batch_id + 1``) for a consumer group of its own, so a
replayed batch skips the partitions that already committed. See :class:`KafkaSink`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fanout_kafka.errors import (
    EpochFencedError,
    KafkaAbortedError,
    KafkaBadRecordError,
    KafkaFencedError,
)

if TYPE_CHECKING:
    from fanout_kafka.sink import KafkaSink

_LAZY = {
    "KafkaSink": "fanout_kafka.sink",
}
"""Names imported on first use (PEP 562): importing the package, as the plugin's entry point
does, must not import the sink's driver libraries; a command using no such sink never does."""


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY``, imported from its module when first asked for."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EpochFencedError",
    "KafkaAbortedError",
    "KafkaBadRecordError",
    "KafkaFencedError",
    "KafkaSink",
]
