"""Whether fanout ever compacted a Delta table, told by its loaded snapshot, without reading
its history: before its first compaction of a table, fanout commits the app transaction
:data:`MARK` (a commit of no file; a compaction that can carry app transactions, the
ledger's overwrite, carries it itself) at the version of a snapshot holding none. Every
fanout compaction commits after such a commit (or is one), and that snapshot held no mark,
so its version is below the first mark's commit: a table without the mark holds no fanout
compaction, and one with it none at or before its version (the scan's floor; ARCHITECTURE
§4, "Compactions that race").

An app transaction lives in the table's state (every log checkpoint keeps it) and
``transaction_version`` reads it from the snapshot's log, no commit info. Only a table that
expires app transactions (``delta.setTransactionRetentionDuration`` set: an expired mark
looks like none) cannot tell: its history is read as before the mark existed.
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


def compactions_after(table: DeltaTable) -> int | None:
    """The version after which every fanout compaction of ``table`` lies, as far as its
    loaded snapshot tells: the mark's; the loaded version when the table holds no mark
    (no fanout compaction at all); ``None`` when it cannot tell (it expires app
    transactions)."""
    if TXN_RETENTION in (table.metadata().configuration or {}):
        return None
    after = deltaio.transaction_version(table, MARK)
    return table.version() if after is None else min(after, table.version())


def with_mark(table: DeltaTable, metadata: Mapping[str, str]) -> CommitProperties:
    """The commit properties of a compaction committed from ``table``'s snapshot that can
    carry app transactions (an overwrite, not delta-rs' ``OPTIMIZE``): ``metadata``, and the
    mark when the snapshot holds none (no commit of its own then)."""
    unmarked = deltaio.transaction_version(table, MARK) is None
    return deltaio.commit_properties({MARK: table.version()} if unmarked else {}, metadata)


def mark_compacted(table: DeltaTable, storage_options: Mapping[str, str] | None) -> None:
    """Commit the mark before fanout's first compaction of ``table`` (nothing when its
    snapshot holds it), on a snapshot of its own: the compaction still plans on ``table``'s,
    and commits after the mark all the same. A mark another process committed first (or
    meanwhile, failing this commit) is as good: its version too is one of a snapshot
    holding none, before this compaction's.

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
            commit_properties=deltaio.commit_properties({MARK: own.version()}, tag),
        )
    except Exception:
        own.update_incremental()
        if deltaio.transaction_version(own, MARK) is None:
            raise
