"""Small helpers over delta-rs shared by the ledger and the Delta sink plugin.

Delta's idempotent writes pair an application id with a monotonically increasing version
(``txn`` actions in the log). delta-rs records them but does not skip by itself, so every
writer checks :func:`transaction_version` first.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 3
"""How often a check-then-write runs again after losing a commit race before giving up
(the caller then reports the conflict as transient)."""

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable


def open_table(path: str, storage_options: Mapping[str, str] | None = None) -> DeltaTable | None:
    """Open the Delta table at ``path``, or return ``None`` when there is none yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path, storage_options=dict(storage_options or {}) or None)
    except TableNotFoundError:
        return None


def transaction_version(table: DeltaTable | None, app_id: str) -> int | None:
    """The last version recorded for ``app_id`` in the table's log, or ``None``.

    A log lookup (checkpoint plus the commits after it), never a scan of the data files.
    """
    if table is None:
        return None
    version = table.transaction_version(app_id)
    return None if version is None else int(version)


def commit_properties(
    transactions: Mapping[str, int], metadata: Mapping[str, str] | None = None
) -> CommitProperties:
    """Commit properties carrying one idempotent-write transaction per ``app_id: version``.

    Every transaction carries ``lastUpdated`` (now, in epoch milliseconds), as delta-spark
    writes it: under a table's ``delta.setTransactionRetentionDuration`` delta-spark drops a
    transaction without it at the next checkpoint, however recent, which would let a
    replayed batch be written twice (see :mod:`fanout.txn_retention`).
    """
    import time

    from deltalake import CommitProperties, Transaction

    now_ms = int(time.time() * 1000)
    return CommitProperties(
        app_transactions=[
            Transaction(app_id=app_id, version=version, last_updated=now_ms)
            for app_id, version in transactions.items()
        ],
        custom_metadata=dict(metadata) if metadata else None,
    )


def is_commit_conflict(error: BaseException) -> bool:
    """Whether ``error`` is delta-rs refusing a commit because another writer committed
    first (on the same transaction app id, on data a merge read, or by creating the table
    a create-if-missing write expected absent). The snapshot is stale: re-check, retry."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    text = str(error).lower()
    if isinstance(error, CommitFailedError):
        return "concurrent" in text or "version already exists" in text
    return isinstance(error, DeltaError) and "already exists" in text


def append_once(
    path: str,
    data: pa.Table,
    app_id: str,
    version: int,
    storage_options: Mapping[str, str] | None = None,
) -> bool:
    """Append ``data`` to the Delta table at ``path`` (created when missing) in a commit
    carrying the transaction ``(app_id, version)``, unless the table's log already records
    that version or a later one for ``app_id``. Returns whether it appended.

    The check and the commit use one snapshot: a writer committing the same app id in
    between makes the commit fail (delta-rs' conflict check), and the check runs again on
    the fresh snapshot. This is how per-batch side tables (dead letters) stay exactly once
    across replays and zombie drivers.
    """
    from deltalake import write_deltalake

    commit = commit_properties({app_id: version})
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = open_table(path, storage_options)
        done = transaction_version(table, app_id)
        if done is not None and done >= version:
            return False
        try:
            if table is not None:
                write_deltalake(table, data, mode="append", commit_properties=commit)
            else:
                options = dict(storage_options) if storage_options else None
                # "error": a table created by another writer since the check is a conflict
                write_deltalake(
                    path, data, mode="error", storage_options=options, commit_properties=commit
                )
            return True
        except Exception as exc:
            if not is_commit_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                raise
            log.info("%s: lost a commit race for %s@%d, checking again: %s",
                     path, app_id, version, exc)  # fmt: skip
    raise AssertionError("unreachable")
