"""Partitions in the sink contract: how a sink's write hash-partitions a batch
(:class:`BatchPartitioning`, so fanout can partition it once for every sink that would do
the same), and what the per-partition commit hooks receive (``fanout_partition_commit`` and
``fanout_partition_committed``), on the executor writing the partition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

REPARTITIONED = (
    "a replay or retry would put rows in other partitions than the attempt that committed "
    "some of them (rows lost and duplicated)"
)
"""Why a sink skipping committed partitions on a replay needs deterministic partitioning."""


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
class StableColumns:
    """Batch columns a replay of the batch must compute again with the same values
    (:meth:`fanout.Sink.deterministic_columns`): fanout refuses a route (at
    ``FanOut(...)``) or a batch in which they, or a filter deciding which rows exist, are
    not deterministic (``uuid()``, ``rand()``, ``current_timestamp()``...).

    :param columns: the batch column names, or ``"*"`` for the whole row.
    :param role: what the sink does with them, for the refusal: ``"partitions by"``,
        ``"upserts by"``.
    :param why: what a replay computing other values would do, for the refusal.
    """

    columns: Sequence[str] | Literal["*"]
    role: str = "partitions by"
    why: str = REPARTITIONED


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
