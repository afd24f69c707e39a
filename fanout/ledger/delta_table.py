"""The ledger's Delta table as one process holds it (ARCHITECTURE §4): opened
(:mod:`fanout.ledger.delta_open`), loaded and brought up to date under one lock, appended
to, and compacted after its own appends.

:class:`LedgerTable` is the one owner of that state. Every collaborator of
:class:`fanout.ledger.delta.DeltaLedger` (:mod:`fanout.ledger.delta_marks`,
:mod:`fanout.ledger.delta_epochs`, :mod:`fanout.ledger.delta_maintain`) is handed the same
:class:`LedgerTable` object and asks it for the loaded table at each use
(:meth:`LedgerTable.loaded`, :meth:`LedgerTable.fresh`), never keeping a table of its own,
so a reload leaves nobody holding a stale one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.locations import shown_location
from fanout.delta_tables.compaction import Compaction
from fanout.delta_tables.compaction import compact as compact_table
from fanout.delta_tables.io import (
    COMMIT_ATTEMPTS,
    commit_properties,
    is_commit_conflict,
    read_arrow,
    refuse_unusable_location,
    transaction_version,
)
from fanout.delta_tables.retention import check_ledger_retention
from fanout.errors import CompactionError, LedgerError
from fanout.ledger.delta_open import (
    check_is_ledger,
    keep_log_short,
    load_or_create,
    log_retention_change,
    masked_error,
    open_ledger,
)
from fanout.ledger.entry import LedgerEntry, entries_to_arrow

if TYPE_CHECKING:
    from deltalake import DeltaTable


log = logging.getLogger("fanout.ledger.delta")  # the name its logs always had


class LedgerTable:
    """The ledger's Delta table at ``path`` and what this process knows of it.

    The configuration is :class:`~fanout.ledger.delta.DeltaLedger`'s (its attributes of
    the same names read and write these). The live state, never pickled: :attr:`lock`
    (one ledger commit or refresh at a time), the table as loaded, the transaction
    versions known at its version, and :attr:`files_added`, the data files committed since
    opening or compacting.
    """

    def __init__(
        self,
        path: str,
        storage_options: dict[str, str],
        checkpoint_interval: int,
        compact_after_files: int | None,
        log_retention: str | None,
    ) -> None:
        self.path = path
        self.storage_options = storage_options
        self.checkpoint_interval = checkpoint_interval
        self.compact_after_files = compact_after_files
        self.log_retention = log_retention
        self.files_added = 0
        self.lock = threading.Lock()
        self._delta: DeltaTable | None = None
        self._txns = KnownTransactions()

    @property
    def shown(self) -> str:
        """The ledger's location as its errors and logs name it (a password masked)."""
        return shown_location(self.path)

    @property
    def where(self) -> str:
        """``ledger at <location>``, as errors name it."""
        return f"ledger at {self.shown}"

    def masked(self, exc: BaseException) -> str:
        """``exc``'s text on one line, the location's password masked (the store's own
        error names the location as written)."""
        return masked_error(self.path, exc)

    # -- opening (fanout.ledger.delta_open) -------------------------------------------

    def open(self) -> None:
        """:meth:`fanout.ledger.delta.DeltaLedger.open`."""
        refuse_unusable_location(self.path, self.where, self.storage_options)
        with self.lock:
            self._delta = load_or_create(
                self.path, self.storage_options, self.checkpoint_interval, self.log_retention
            )
            keep_log_short(self._delta, self.path, self.storage_options, self.log_retention)
            self.files_added = len(self._delta.file_uris())  # a long uncompacted ledger
        # the ledger's transaction ids are its marks: refuse a table that expires them
        check_ledger_retention(self._delta.metadata().configuration, self.where)

    def exists(self) -> bool:
        """:meth:`fanout.ledger.delta.DeltaLedger.exists`."""
        refuse_unusable_location(self.path, self.where, self.storage_options)
        return open_ledger(self.path, self.storage_options) is not None

    def check(self) -> list[str]:
        """:meth:`fanout.ledger.delta.DeltaLedger.check`."""
        refuse_unusable_location(self.path, self.where, self.storage_options)
        table = open_ledger(self.path, self.storage_options)
        if table is None:
            return ["create the ledger table"]
        check_is_ledger(table, self.shown)
        check_ledger_retention(table.metadata().configuration, self.where)
        return log_retention_change(table, self.log_retention)

    # -- the loaded table -----------------------------------------------------------

    def snapshot(self) -> DeltaTable:
        """The ledger table at its latest version, refreshed under the lock: for a read
        made after the lock is let go (a filtered scan of one version)."""
        with self.lock:
            return self.fresh()

    def fresh(self) -> DeltaTable:
        """The ledger table at its latest version (caller holds the lock)."""
        return self.loaded(refresh=True)

    def loaded(self, *, refresh: bool) -> DeltaTable:
        """The ledger table as loaded, brought to its latest version when ``refresh``
        (caller holds the lock)."""
        if self._delta is None:
            refuse_unusable_location(self.path, self.where, self.storage_options)
            table = open_ledger(self.path, self.storage_options)
            if table is None:
                raise LedgerError(
                    f"no ledger at {self.shown}: a FanOut creates it when it starts; check the path"
                )
            check_is_ledger(table, self.shown)
            self._delta = table
        elif refresh:
            try:
                self._delta.update_incremental()
            except Exception as exc:  # the store unreachable: name the ledger, mask it
                raise LedgerError(
                    f"cannot read the {self.where}: {self.masked(exc)}; check that its "
                    "store is reachable, then run again (a query: restart it; Spark replays "
                    "the batch, and each sink whose mark of it is missing writes it again, "
                    "which the sink's own records of the batch make a no-op)"
                ) from exc
        return self._delta

    def version(self, table: DeltaTable, app_id: str) -> int | None:
        """``transaction_version`` of ``app_id`` on ``table``, remembered for its version."""
        return self._txns.get(table, app_id)

    # -- appends, and the compaction after them -------------------------------------

    def append_retrying(self, entries: Sequence[LedgerEntry], txns: Mapping[str, int]) -> None:
        """Append ``entries`` with ``txns`` in one commit, again on the fresh snapshot when
        delta-rs refuses it (another writer's commit meanwhile: a compaction of the ledger
        planned after this snapshot removed the files it was based on)."""
        with self.lock:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    self.append(self.fresh(), entries, txns)
                    return
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise

    def append(
        self, table: DeltaTable, entries: Sequence[LedgerEntry], txns: Mapping[str, int]
    ) -> None:
        """Append ``entries`` to ``table`` with the transactions ``txns``, in one commit
        (caller holds the lock); then compact, once the ledger's own added files reach
        ``compact_after_files``."""
        from deltalake import write_deltalake

        base = table.version()
        try:
            write_deltalake(
                table,
                entries_to_arrow(entries),
                mode="append",
                schema_mode="merge",  # a ledger made by an older fanout gains new columns
                commit_properties=commit_properties(txns) if txns else None,
            )
        except Exception as exc:
            raise LedgerError(
                f"cannot write to the ledger at {self.shown}: {self.masked(exc)}"
            ) from exc
        # write_deltalake advances `table` to the version it committed: no refresh needed
        self._txns.committed(table, base, txns)
        self.files_added += len({entry.pipeline for entry in entries})  # one per partition
        if self.compact_after_files is not None and self.files_added >= self.compact_after_files:
            self.compact(table)

    def compact(self, table: DeltaTable) -> None:
        """Rewrite the table's small files (caller holds the lock): :meth:`compaction`.
        A failure (another writer compacted first) is logged: the marks are committed,
        and the next compaction tries again."""
        base = table.version()
        try:
            done = self.compaction(table)
        except CompactionError as exc:  # rows stay duplicated: say so loudly
            log.error("ledger %s: %s", self.shown, self.masked(exc))
            table.update_incremental()
        except Exception as exc:
            log.warning(
                "ledger %s: compacting its small files failed: %s", self.shown, self.masked(exc)
            )  # to an application's handlers too: masked
            table.update_incremental()  # the known transactions follow its version
        else:
            log.debug("ledger %s: compacted %s small files", self.shown, done.files_removed)
            self._txns.committed(table, base, {})  # carries no transaction
        self.files_added = 0

    def compaction(self, table: DeltaTable) -> Compaction:
        """Compact the ledger by overwriting it with its own rows, one file per pipeline,
        rather than by delta-rs' ``OPTIMIZE`` (ARCHITECTURE §4). delta-rs commits an
        ``OPTIMIZE`` whose files another compaction removed first (it only refuses what
        removed files with ``dataChange=true``), duplicating every row both rewrote; an
        overwrite removes them with ``dataChange=true``, so delta-rs refuses any
        compaction of the ledger planned before it and committed after it (an overwrite
        or an ``OPTIMIZE``). Marks committed meanwhile stay (delta-rs keeps the files the
        overwrite did not read), and so do all the transactions (the marks): they live in
        the log, not in the files. The one race left, an ``OPTIMIZE`` by another program
        committed between this compaction's snapshot and its commit, is taken back
        (:func:`fanout.delta_tables.compaction.compact`). Nobody streams the ledger, so
        its compaction may be a data change."""
        return compact_table(
            table,
            self.where,
            self.storage_options,
            rewrite=overwrite_with_own_rows,
            data_change=True,
        )

    def refused_compaction(self) -> str | None:
        """:meth:`fanout.ledger.delta.DeltaLedger.refused_compaction`."""
        from fanout.delta_tables.compaction import refused_compaction

        table = open_ledger(self.path, self.storage_options)
        if table is None:
            return None
        return refused_compaction(table, self.where, self.storage_options)


def overwrite_with_own_rows(table: DeltaTable, commit: Any) -> dict[str, int]:
    """Overwrite ``table`` with its rows as its loaded snapshot holds them (one file per
    partition); nothing when it has fewer than two files."""
    from deltalake import write_deltalake

    files = len(table.file_uris())
    if files < 2:
        return {"numFilesRemoved": 0, "numFilesAdded": 0}
    rows = read_arrow(table)
    write_deltalake(
        table,
        rows,
        mode="overwrite",
        partition_by=list(table.metadata().partition_columns) or None,
        commit_properties=commit,
    )
    return {"numFilesRemoved": files, "numFilesAdded": len(table.file_uris())}


class KnownTransactions:
    """Transaction versions known at one version of the ledger table.

    A Delta version is immutable, so what was read from it, or committed to make it, holds
    as long as the table stays at that version: a lookup after the driver's own commit, with
    no other writer in between, reads nothing from the log. (Each ``transaction_version``
    call replays the log's transactions: about 0.3-1 ms, five or more per batch.)
    """

    def __init__(self) -> None:
        self._at: int | None = None
        self._known: dict[str, int | None] = {}

    def get(self, table: DeltaTable, app_id: str) -> int | None:
        """``app_id``'s version on ``table``, read from its log the first time."""
        self._follow(table.version())
        if app_id not in self._known:
            self._known[app_id] = transaction_version(table, app_id)
        return self._known[app_id]

    def committed(self, table: DeltaTable, base: int, txns: Mapping[str, int]) -> None:
        """``table`` was advanced from version ``base`` by a commit of ``txns``."""
        version = table.version()
        if self._at == base and version == base + 1:  # our commit alone: extend
            self._known.update(txns)
            self._at = version
        else:  # other commits in between, whose transactions are unknown
            self._follow(version)

    def _follow(self, version: int) -> None:
        if version != self._at:
            self._at, self._known = version, {}
