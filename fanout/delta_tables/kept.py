"""A Delta table's snapshot kept from one batch to the next (:class:`KeptTable`).

Opening a table reads its log from the last checkpoint: its ``_last_checkpoint`` file,
the checkpoint, and every commit since (~6-10 ms on a local disk, growing with the commits
since the checkpoint; a listing and a request per file on an object store). A sink writes
its table every batch, and between two batches the log gains its own commit and rarely
another: bringing the last batch's snapshot up to date (``update_incremental``) reads only
those (~1-3 ms locally).

A kept snapshot is checked before it is trusted: after the update, the log must still hold
the commit of the snapshot's version (one file's metadata: a ``stat`` on a local disk, a
``HEAD`` on an object store), else the table is opened afresh. A table deleted since, or
deleted and made again with fewer commits, lacks it; delta-rs' update alone does not always
notice (a deleted log updates to nothing and still describes the old table, whose next
commit would start a log with no version 0). The latest commit's file is never removed by
log cleanup, which only removes commits older than a checkpoint.

A table deleted and made again with at least as many commits as the snapshot had, between
two batches, cannot be told from the same table by its log alone; deleting a sink's table
under a running stream loses its batches anyway.

A snapshot far behind (another writer's hundreds of commits since, or a long pause) is
slower to bring up to date than a fresh open, which starts from the newer checkpoint: 350
commits took ~17 ms against ~9 locally. The batch that finds it so pays that once; telling
beforehand would cost a read of ``_last_checkpoint`` every batch.

Only one caller uses a kept snapshot at a time (:meth:`KeptTable.latest` takes it,
:meth:`KeptTable.keep` gives one back): a second caller meanwhile opens its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fanout.delta_tables import io
from fanout.delta_tables.datafiles import table_filesystem

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger("fanout")


class KeptTable:
    """The latest snapshot of the Delta table at ``path`` that its writer saw, kept
    between batches and brought up to date instead of opened again (see the module
    docstring). Picklable: a copy keeps nothing."""

    def __init__(self, path: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.storage_options = storage_options
        self._lock = threading.Lock()
        self._table: DeltaTable | None = None
        self._log: Any = None  # the filesystem the log is read from, made on first use

    def latest(self) -> DeltaTable | None:
        """The table at its latest version, now the caller's (``None``: no table there):
        the kept snapshot brought up to date, or the table opened."""
        with self._lock:
            table, self._table = self._table, None
        if table is not None:
            try:
                table.update_incremental()
                if self._holds_commit(table.version()):
                    return table
                log.info(
                    "Delta table %s: the kept snapshot's commit %d is gone (the table was "
                    "deleted or made again): opened again", self.path, table.version(),
                )  # fmt: skip
            except Exception as exc:  # made again, or unreadable: a fresh open decides
                log.info("Delta table %s: kept snapshot not updated (%s): opened again",
                         self.path, exc)  # fmt: skip
        return io.open_table(self.path, self.storage_options)

    def keep(self, table: DeltaTable | None) -> None:
        """Keep ``table`` (a snapshot of this path its caller is done with) for the next
        :meth:`latest`; ``None`` keeps nothing."""
        if table is None:
            return
        with self._lock:
            self._table = table

    def forget(self) -> None:
        """Drop the kept snapshot (the next :meth:`latest` opens the table)."""
        with self._lock:
            self._table = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["storage_options"])  # type: ignore[misc]

    def _holds_commit(self, version: int) -> bool:
        """Whether the table's log holds the commit file of ``version``."""
        import pyarrow.fs as pafs

        if self._log is None:
            self._log = table_filesystem(self.path, self.storage_options)
        filesystem, base = self._log
        name = f"_delta_log/{version:020d}.json"
        found = filesystem.get_file_info(f"{base}/{name}" if base else name)
        return bool(found.type == pafs.FileType.File)
