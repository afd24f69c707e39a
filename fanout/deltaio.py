"""Small helpers over delta-rs shared by the ledger and the Delta sink plugin.

Delta's idempotent writes pair an application id with a monotonically increasing version
(``txn`` actions in the log). delta-rs records them but does not skip by itself, so every
writer checks :func:`transaction_version` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

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
    """Commit properties carrying one idempotent-write transaction per ``app_id: version``."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        app_transactions=[
            Transaction(app_id=app_id, version=version) for app_id, version in transactions.items()
        ],
        custom_metadata=dict(metadata) if metadata else None,
    )


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

    This is how per-batch side tables (dead letters) stay exactly once across replays.
    """
    from deltalake import write_deltalake

    table = open_table(path, storage_options)
    done = transaction_version(table, app_id)
    if done is not None and done >= version:
        return False
    commit = commit_properties({app_id: version})
    if table is not None:
        write_deltalake(table, data, mode="append", commit_properties=commit)
    else:
        options = dict(storage_options) if storage_options else None
        write_deltalake(
            path, data, mode="append", storage_options=options, commit_properties=commit
        )
    return True
