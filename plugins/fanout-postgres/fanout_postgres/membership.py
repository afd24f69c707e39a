"""Append mode: the marks the driver reads to check that a replay rebuilds the partitions
that already committed the batch (the check is the kit's: :mod:`fanout.partitioned.sink`).

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

from fanout.partitioned.membership import (
    WHOLE_ROW,
    CommittedPartition,
    PartitionDigest,
)
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
    if not keys:
        if columns is None:
            return WHOLE_ROW
        keys = list(columns.values()) if isinstance(columns, Mapping) else list(columns)
    return batch_names(keys, columns)


VOLATILE_KEYS = (
    "a replay or retry would compute other keys (or keep other rows), and the upsert would "
    "insert them beside the rows an earlier attempt wrote (every row written twice)"
)
"""Why an upsert sink needs deterministic keys (:meth:`PostgresSink.deterministic_columns`)."""


def batch_names(names: Sequence[str], columns: Sequence[str] | Mapping[str, str] | None
                ) -> list[str]:  # fmt: skip
    """Table columns ``names`` under their batch names (option ``columns`` may rename)."""
    renamed = {t: s for s, t in columns.items()} if isinstance(columns, Mapping) else {}
    return [renamed.get(k, k) for k in names]
