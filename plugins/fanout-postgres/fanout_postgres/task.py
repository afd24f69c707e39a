"""On the executors: one Spark partition, one PostgreSQL transaction.

Upsert: first ``COPY`` straight into the target inside a savepoint, which holds when every
key is new (:mod:`fanout_postgres.direct`; the driver may skip this). Otherwise ``COPY``
into a temporary staging table (binary when the columns allow it), then one ``INSERT ...
SELECT DISTINCT ON (keys) ... ON CONFLICT (keys) DO UPDATE ... WHERE (target) IS DISTINCT
FROM (excluded)``; when the staged keys are unique and the server is
15+, the same upsert is first tried as a ``MERGE`` (cheaper), which falls back to it.
Append: first claim the partition's mark in fanout's progress table (a replay finds it and
skips), then ``COPY`` straight into the target; the mark and the rows commit together.

Rows the server rejects are isolated without giving up the transaction: a ``COPY`` error
names its line, so the row is set aside and the rest copied again; an error of the
``INSERT`` (a foreign key, a check, another unique index) is bisected over the staged rows
with savepoints. Set-aside rows go to the dead-letter target when one is configured, else
the partition rolls back and reports the first one (sink, batch, column, value, row).
Upsert with ``order_by``: only a refused row that wins its key (among all the batch's rows
of the key, refused or not) is set aside, and then no row of that key is written; a refused
row that loses to another row of its key is superseded (see :mod:`.transaction`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from fanout.errors import TransientSinkError
from fanout.observe.secrets import NO_SECRETS, SinkSecrets
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.outcome import PartitionFailure, PartitionOutcome
from fanout_postgres.connections import CONNECTIONS, close_quietly
from fanout_postgres.encode import (
    Rows,
)
from fanout_postgres.keyhash import HASHED
from fanout_postgres.plan import WritePlan
from fanout_postgres.sqlstate import HINTS, classify
from fanout_postgres.transaction import BatchMeta, PartitionTransaction, RowRejected

if TYPE_CHECKING:
    from fanout.partitioned.task import CommitHooks


@dataclass(frozen=True)
class PostgresPartitionWriter:
    """Writes one partition of one batch in one transaction (configuration only: the
    connection is made inside :meth:`write_partition`, on the executor).

    :param url: the resolved SQLAlchemy URL.
    :param direct: upsert: try a ``COPY`` straight into the target first
        (:mod:`fanout_postgres.direct`).
    :param idle_s: how long the worker keeps the connection at rest for its next
        partition (:mod:`fanout_postgres.connections`); 0: closed after the partition.
    :param secrets: masked in a refused row's reason (the server's message): the
        letter, the progress mark keeping it, the partition's failure.
    """

    url: Any
    plan: WritePlan
    meta: BatchMeta
    direct: bool = False
    idle_s: float = 0.0
    secrets: SinkSecrets = NO_SECRETS

    def write_partition(
        self,
        partition: int,
        batches: Iterator[pa.RecordBatch],
        hooks: CommitHooks,
        digest: MemberDigest,
    ) -> PartitionOutcome:
        """Write one partition in one transaction; never raises for database errors."""
        plan, meta = self.plan, self.meta
        rows = Rows(_without_hashes(batches) if plan.key_hashes else batches)
        first = rows.next_chunk()
        while first is not None and first.num_rows == 0:
            first = rows.next_chunk()
        if first is None:
            return PartitionOutcome(partition, "empty")
        name = f"fanout {meta.pipeline}/{plan.sink}/p{partition}"
        try:
            conn = CONNECTIONS.take(self.url, plan.settings, name, self.idle_s)
        except Exception as exc:
            return _failed(partition, exc)
        at_rest = False  # only a connection whose transaction ended cleanly is kept
        try:
            with conn.cursor() as cur:
                outcome = PartitionTransaction(
                    cur,
                    plan,
                    meta,
                    partition,
                    rows,
                    digest,
                    direct=self.direct,
                    secrets=self.secrets,
                ).run()
            if outcome.status == "committed":
                hooks.before(partition, outcome.rows, outcome.written)
            conn.commit()
            at_rest = True
        except RowRejected as rejected:
            conn.rollback()
            at_rest = True
            detail = rejected.detail
            failure = PartitionFailure("data", detail["reason"], details=detail)
            return PartitionOutcome(partition, "failed", failure=failure)
        except Exception as exc:
            _quietly(conn.rollback)
            return _failed(partition, exc)
        finally:
            if at_rest:
                CONNECTIONS.give_back(conn, self.url, plan.settings, self.idle_s)
            else:
                close_quietly(conn)
        if outcome.status == "committed":
            hooks.after(partition, outcome.rows, outcome.written)
        return outcome


def _without_hashes(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` without the columns folded keys were hashed on (``keyhash.hashed``)."""
    for batch in batches:
        names = batch.schema.names
        yield batch.select([i for i, name in enumerate(names) if not name.startswith(HASHED)])


def _failed(partition: int, exc: BaseException) -> PartitionOutcome:
    code = getattr(exc, "pgcode", None)
    reason = f"{type(exc).__name__}: {str(exc).strip()}"
    if code in HINTS:
        reason = f"{reason} (SQLSTATE {code}: {HINTS[code]})"
    kind = "transient" if isinstance(exc, TransientSinkError) else classify(exc)
    failure = PartitionFailure(kind, reason, kind == "transient", {"sqlstate": code})
    return PartitionOutcome(partition, "failed", failure=failure)


def _quietly(action: Callable[[], Any]) -> None:
    try:
        action()
    except Exception:
        pass
