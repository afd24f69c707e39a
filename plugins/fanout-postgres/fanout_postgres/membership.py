"""Append mode: the driver's check that a replay rebuilds the partitions that already
committed the batch (:mod:`fanout.partitioning`).

Each partition's progress mark records, in the transaction that writes its rows, the
partition count (``partitions``), the partitioning fingerprint (``fingerprint``) and the
digest of its input rows (``input_rows``, ``input_checksum``; migration
``0002_progress_plan``). Before any partition writes, :func:`check_replay` reads the marks
of the batch in one query; only when some exist does it re-plan the batch in one Spark job
and compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fanout.determinism import check_batch
from fanout.partitioning import (
    CommittedPartition,
    PartitionDigest,
    PartitionPlan,
    check_committed,
    plan_of,
    summarize,
    with_member_column,
)
from fanout.sink import Batch
from fanout_postgres.statements import progress_table


def committed_partitions(conn: Any, state_schema: str, scope: str, sink: str, batch_id: int
                         ) -> list[CommittedPartition]:  # fmt: skip
    """The progress marks of one batch of one sink."""
    import sqlalchemy as sa

    p = progress_table(state_schema)
    query = sa.select(
        p.c.partition, p.c.partitions, p.c.fingerprint, p.c.input_rows, p.c.input_checksum
    ).where(p.c.pipeline == scope, p.c.sink == sink, p.c.batch_id == batch_id)
    marks = []
    for partition, partitions, fingerprint, rows, checksum in conn.execute(query):
        digest = None if rows is None else PartitionDigest(int(rows), int(checksum or 0))
        marks.append(CommittedPartition(int(partition), int(partitions), fingerprint, digest))
    return marks


def check_replay(
    engine: Any,
    state_schema: str,
    scope: str,
    batch: Batch,
    projected: Any,
    parted: Any,
    hash_columns: Sequence[str],
    partitions: int,
    by: Sequence[str] | Literal["*"],
) -> tuple[Any, PartitionPlan]:
    """Refuse a non-deterministic partitioning, or a batch whose committed partitions
    were committed under another count, other columns, or with other rows; return
    ``parted`` with the member column, and the plan.

    :raises fanout.PartitioningError: naming the sink, the batch and what changed.
    """
    sink = batch.sink_name
    check_batch(projected, by, sink=sink, batch_id=batch.batch_id, query_id=batch.query_id)
    plan = plan_of(projected, hash_columns, partitions)
    with engine.connect() as conn:
        committed = committed_partitions(conn, state_schema, scope, sink, batch.batch_id)
    check_committed(
        committed, plan, lambda: summarize(parted, hash_columns), sink=sink,
        batch_id=batch.batch_id,
    )  # fmt: skip
    return with_member_column(parted, hash_columns), plan
