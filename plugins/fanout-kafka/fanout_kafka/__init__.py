"""fanout's Kafka sink: every micro-batch lands exactly once in a Kafka topic.

One transactional producer per Spark partition writes the partition's records and, in the
same transaction, a marker offset (``batch_id + 1``) for a consumer group of its own, so a
replayed batch skips the partitions that already committed. See :class:`KafkaSink`.
"""

from __future__ import annotations

from fanout_kafka.errors import (
    EpochFencedError,
    KafkaAbortedError,
    KafkaBadRecordError,
    KafkaFencedError,
)
from fanout_kafka.sink import KafkaSink

__all__ = [
    "EpochFencedError",
    "KafkaAbortedError",
    "KafkaBadRecordError",
    "KafkaFencedError",
    "KafkaSink",
]
