"""The function Spark runs for every partition of a batch (``mapInArrow``), and the
outcome rows it sends back to the driver."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from fanout.partitioned.membership import MemberDigest
from fanout_kafka.settings import WriterSettings
from fanout_kafka.transaction import PartitionHooks, PartitionOutcome, PartitionWriter

RESULT_SCHEMA = (
    "partition INT, status STRING, rows BIGINT, written BIGINT, dead_letter_count BIGINT, "
    "error_kind STRING, error STRING, transient BOOLEAN"
)
"""One row per partition (Spark DDL)."""

ARROW_RESULT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("status", pa.string()),
        ("rows", pa.int64()),
        ("written", pa.int64()),
        ("dead_letter_count", pa.int64()),
        ("error_kind", pa.string()),
        ("error", pa.string()),
        ("transient", pa.bool_()),
    ]
)


@dataclass(frozen=True)
class PartitionTask:
    """Pickled to the executors: writes the partition Spark hands it and yields one
    outcome row. Holds configuration only; producers are created inside the call."""

    settings: WriterSettings
    hooks: PartitionHooks
    batch_id: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Write this task's partition (its index is the Spark partition id)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        digest = MemberDigest()
        writer = PartitionWriter(self.settings, partition, self.batch_id, self.hooks, digest)
        outcome = writer.run(digest.strip(batches))
        yield pa.RecordBatch.from_pylist([to_row(outcome)], schema=ARROW_RESULT_SCHEMA)


def to_row(outcome: PartitionOutcome) -> dict[str, Any]:
    """An outcome as a result row."""
    return {
        "partition": outcome.partition,
        "status": outcome.status,
        "rows": outcome.rows,
        "written": outcome.written,
        "dead_letter_count": outcome.dead_letter_count,
        "error_kind": outcome.error_kind,
        "error": outcome.error,
        "transient": outcome.transient,
    }


def from_row(row: Any) -> PartitionOutcome:
    """A result row (a Spark ``Row`` or a dict) back as an outcome."""
    data = row.asDict() if hasattr(row, "asDict") else dict(row)
    return PartitionOutcome(**data)
