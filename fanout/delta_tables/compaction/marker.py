"""How far back a Delta table's history must be read for fanout's unchecked compactions,
told by its loaded snapshot, without reading that history: before its first compaction
of a table, fanout commits the app transaction :data:`MARK` (a commit of no file; a
compaction that can carry app transactions, the ledger's overwrite, carries it itself)
whose version is one up to which every fanout compaction of the table is checked: the
version its scan checked up to, which read the history back to the newest checked record
first (the mark's scan floor; ARCHITECTURE §4, "Compactions that race"). On a table fanout
never compacted that scan finds nothing, and the mark is the snapshot's version.

No mark does not mean no fanout compaction: a fanout built before the mark compacted
without one, and a table that expired app transactions (``delta.setTransactionRetentionDuration``,
set then removed) lost it at a checkpoint. So only a compaction commits a mark, after a
scan that read back to the newest checked record; an open, to stay cheap, reads nothing
of an unmarked table, and its unchecked compactions are checked at its next fanout
compaction (:func:`fanout.delta_tables.compaction.scan.since_checked`).

An app transaction lives in the table's state (every log checkpoint keeps it) and
``transaction_version`` reads it from the snapshot's log, no commit info. A table that
expires app transactions (``delta.setTransactionRetentionDuration`` set) does not trust
its mark: its history is read as before the mark existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fanout.delta_tables import io as deltaio
from fanout.delta_tables.compaction.tags import COMMIT_TAG
from fanout.delta_tables.retention import PROPERTY as TXN_RETENTION

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable

MARK = "fanout#compactions"
"""The app transaction marking a table fanout compacts (no fanout id has a ``#`` before a
``/``: pipelines' and sinks' are ``fanout/...``)."""


def expires_marks(table: DeltaTable) -> bool:
    """Whether ``table`` expires app transactions (its mark may be gone: not trusted)."""
    return TXN_RETENTION in (table.metadata().configuration or {})


def compactions_after(table: DeltaTable) -> int | None:
    """The version up to which every fanout compaction of ``table`` is checked, as its
    loaded snapshot tells: the mark's (at most the loaded version); ``None`` when it
    cannot tell: it holds no mark, or expires app transactions."""
    if expires_marks(table):
        return None
    after = deltaio.transaction_version(table, MARK)
    return None if after is None else min(after, table.version())


def with_mark(table: DeltaTable, metadata: Mapping[str, str], checked: int) -> CommitProperties:
    """The commit properties of a compaction committed from ``table``'s snapshot that can
    carry app transactions (an overwrite, not delta-rs' ``OPTIMIZE``): ``metadata``, and the
    mark at ``checked`` (the version up to which its scan checked every fanout compaction)
    when the snapshot holds none (no commit of its own then)."""
    unmarked = deltaio.transaction_version(table, MARK) is None
    return deltaio.commit_properties({MARK: checked} if unmarked else {}, metadata)


def mark_compacted(
    table: DeltaTable, storage_options: Mapping[str, str] | None, checked: int
) -> None:
    """Commit the mark at ``checked`` (the version up to which the compaction's scan
    checked every fanout compaction) before a fanout compaction of ``table`` (nothing when
    its snapshot holds it), on a snapshot of its own: the compaction still plans on
    ``table``'s, and commits after the mark all the same. A mark another process committed
    first (or meanwhile, failing this commit) is as good: its version too is one its scan
    checked up to.

    :raises Exception: delta-rs' error when the mark could not be committed nor found."""
    from deltalake import DeltaTable

    if deltaio.transaction_version(table, MARK) is not None:
        return
    own = DeltaTable(table.table_uri, storage_options=dict(storage_options or {}) or None)
    if deltaio.transaction_version(own, MARK) is not None:
        return
    tag = {COMMIT_TAG: "compactions from here"}
    try:
        own.create_write_transaction(
            [],
            "append",
            own.schema(),
            list(own.metadata().partition_columns),
            commit_properties=deltaio.commit_properties({MARK: checked}, tag),
        )
    except Exception:
        own.update_incremental()
        if deltaio.transaction_version(own, MARK) is None:
            raise
