"""Partitions in the sink contract: how a sink's write hash-partitions a batch
(:class:`BatchPartitioning`, so fanout can partition it once for every sink that would do
the same), and what the per-partition commit hooks receive (``fanout_partition_commit`` and
``fanout_partition_committed``), on the executor writing the partition."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPartitioning:
    """A hash partitioning of a batch: Spark's ``df.repartition(partitions, *columns)``.

    :param partitions: the number of partitions.
    :param columns: the batch's columns hashed, in order (the order changes the hash).
    """

    partitions: int
    columns: tuple[str, ...]

    def describe(self) -> str:
        """``"4 partitions by order_id"``."""
        return f"{self.partitions} partitions by {', '.join(self.columns)}"


@dataclass(frozen=True)
class PartitionCommit:
    """One partition of one batch of one sink, about to commit or just committed.

    :param pipeline: the pipeline name.
    :param sink: the sink name.
    :param batch_id: the micro-batch id.
    :param partition: the write partition (the Spark partition id, ``0..partitions-1``).
    :param rows: the partition's rows.
    :param written: what the partition writes (rows upserted, records produced), without
        the dead letters.
    :param epoch: the pipeline's epoch (0 until a checkpoint reset is accepted).
    """

    pipeline: str
    sink: str
    batch_id: int
    partition: int
    rows: int
    written: int
    epoch: int = 0
