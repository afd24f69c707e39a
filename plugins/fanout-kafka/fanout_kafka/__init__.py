"""fanout's Kafka sink: every micro-batch lands exactly once in a Kafka topic.

One transactional producer per Spark partition writes the partition's records and, in the
same transaction, a marker offset (``batch_id + 1``) for a consumer group of its own, so a
replayed batch skips the partitions that already committed. See :class:`KafkaSink`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fanout.contract.lazy import lazy_names
from fanout_kafka.errors import (
    EpochFencedError,
    KafkaAbortedError,
    KafkaBadRecordError,
    KafkaFencedError,
)

if TYPE_CHECKING:
    from fanout_kafka.sink import KafkaSink

__getattr__ = lazy_names(
    __name__,
    {
        "KafkaSink": "fanout_kafka.sink",
    },
    globals(),
)
"""Imported on first use: importing the package, as the plugin's entry point does, must not
import the sink's driver libraries; a command using no such sink never does."""


__all__ = [
    "EpochFencedError",
    "KafkaAbortedError",
    "KafkaBadRecordError",
    "KafkaFencedError",
    "KafkaSink",
]
