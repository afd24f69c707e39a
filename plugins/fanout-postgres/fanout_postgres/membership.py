"""Append mode: the driver's check that a replay rebuilds the partitions that already
committed the batch (:mod:`fanout.partitioned.membership`).

Each partition's progress mark records, in the transaction that writes its rows, the
partition count (``partitions``), the partitioning fingerprint (``fingerprint``) and the
digest of its input rows (``input_rows``, ``input_checksum``; migration
``0002_progress_plan``). Before any partition writes, :func:`check_replay` reads the marks
of the batch in one query; only when some exist does it re-plan the batch in one Spark job
and compare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fanout.contract.batch import Batch
from fanout.partitioned.determinism import check_batch
from fanout.partitioned.membership import (
    WHOLE_ROW,
    CommittedPartition,
    PartitionDigest,
    check_committed,
    plan_of,
    summarize,
    with_member_column,
)
from fanout_postgres.plan import WritePlan
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


def partition_columns(
    mode: str, keys: Sequence[str], columns: Sequence[str] | Mapping[str, str] | None
) -> Sequence[str] | Literal["*"] | None:
    """What an append sink hashes, in batch column names: its keys, the columns it writes
    when it selects some, else the whole row; ``None`` in upsert mode (a key written twice
    is idempotent whichever partition writes it)."""
    if mode != "append":
        return None
    renamed = {t: s for s, t in columns.items()} if isinstance(columns, Mapping) else {}
    if not keys:
        if columns is None:
            return WHOLE_ROW
        keys = list(columns.values()) if isinstance(columns, Mapping) else list(columns)
    return [renamed.get(k, k) for k in keys]


def check_replay(
    engine: Any,
    state_schema: str,
    scope: str,
    batch: Batch,
    projected: Any,
    parted: Any,
    plan: WritePlan,
) -> tuple[Any, str]:
    """Refuse a non-deterministic partitioning, or a batch whose committed partitions
    were committed under another count, other columns, or with other rows; return
    ``parted`` with the member column, and the partitioning's fingerprint.

    :param projected: the batch under the target's column names, before the repartition.
    :param parted: ``projected.repartition(plan.partitions, *plan.hash_columns)``.
    :raises fanout.PartitioningError: naming the sink, the batch and what changed.
    """
    sink, columns = batch.sink_name, list(plan.hash_columns)
    keyed = bool(plan.keys) and plan.hash_columns == plan.keys
    check_batch(projected, columns if keyed else WHOLE_ROW, sink=sink, batch_id=batch.batch_id,
                query_id=batch.query_id)  # fmt: skip
    partitioning = plan_of(projected, columns, plan.partitions)
    with engine.connect() as conn:
        committed = committed_partitions(conn, state_schema, scope, sink, batch.batch_id)
    check_committed(
        committed, partitioning, lambda: summarize(parted, columns), sink=sink,
        batch_id=batch.batch_id,
    )  # fmt: skip
    return with_member_column(parted, columns), partitioning.fingerprint
