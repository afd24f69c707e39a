"""The Kafka sink's partition writer on the kit (:mod:`fanout.partitioned.task`): one
transaction per partition, written by :class:`fanout_kafka.transaction.PartitionWriter`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fanout_kafka.settings import WriterSettings
from fanout_kafka.transaction import PartitionWriter

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.partitioned.membership import MemberDigest
    from fanout.partitioned.outcome import PartitionOutcome
    from fanout.partitioned.task import CommitHooks


@dataclass(frozen=True)
class KafkaPartitionWriter:
    """Pickled to the executors: configuration only; the producer is made per partition.

    :param settings: the batch's writer settings (with its partition plan).
    :param batch_id: the micro-batch id (the marker becomes ``batch_id + 1``).
    """

    settings: WriterSettings
    batch_id: int

    def write_partition(
        self,
        partition: int,
        batches: Iterator[pa.RecordBatch],
        hooks: CommitHooks,
        digest: MemberDigest,
    ) -> PartitionOutcome:
        """Encode and skip or write the partition in one transaction."""
        writer = PartitionWriter(self.settings, partition, self.batch_id, hooks, digest)
        return writer.run(batches)
