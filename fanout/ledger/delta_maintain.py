"""``fanout ledger maintain`` on the ledger's Delta table (ARCHITECTURE §4: maintenance,
compactions that race): compact, vacuum, checkpoint and clean the log, each compaction
and vacuum again on a fresh snapshot when another writer's commit made delta-rs refuse it.

Runs under the lock of the ledger's shared :class:`fanout.ledger.delta_table.LedgerTable`
(the same object the marks commit under), and resets its count of added files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fanout.delta_tables.io import is_commit_conflict
from fanout.errors import LedgerError
from fanout.ledger.delta_table import LedgerTable
from fanout.ledger.entry import MaintenanceReport

if TYPE_CHECKING:
    from deltalake import DeltaTable


MAINTAIN_COMPACTION_ATTEMPTS = 5
"""How many times ``maintain`` compacts on a fresh snapshot before giving up."""


def maintain(
    ledger: LedgerTable,
    *,
    checkpoint: bool,
    compact: bool,
    vacuum_retention_hours: int | None,
    cleanup_logs: bool,
) -> MaintenanceReport:
    """:meth:`fanout.ledger.delta.DeltaLedger.maintain` on ``ledger``."""
    with ledger.lock:
        table = ledger.fresh()
        before = table.version()
        compacted = 0
        if compact:
            table, compacted = _compact_retrying(ledger, table)
            table.update_incremental()
            ledger.files_added = 0
        vacuumed: list[str] = []
        if vacuum_retention_hours is not None:
            table, vacuumed = _vacuum_retrying(ledger, table, vacuum_retention_hours, compact)
        if checkpoint:
            table.create_checkpoint()
        if cleanup_logs:
            table.cleanup_metadata()
        table.update_incremental()
        return MaintenanceReport(
            version_before=before,
            version_after=table.version(),
            checkpoint_created=checkpoint,
            files_compacted=compacted,
            files_vacuumed=list(vacuumed),
        )


def _compact_retrying(ledger: LedgerTable, table: DeltaTable) -> tuple[DeltaTable, int]:
    """Compact, on a fresh snapshot again when another writer's commit (a mark, another
    maintenance) made delta-rs refuse this one: a compaction rewrites what it read, so
    trying again on what is there now is safe (caller holds the lock)."""
    for attempt in range(1, MAINTAIN_COMPACTION_ATTEMPTS + 1):
        try:
            return table, ledger.compaction(table).files_removed
        except Exception as exc:
            if not is_commit_conflict(exc):
                raise
            if attempt == MAINTAIN_COMPACTION_ATTEMPTS:
                raise LedgerError(
                    f"{ledger.where}: other writers committed while each of {attempt} "
                    f"compactions ran, and delta-rs refused every one ({ledger.masked(exc)}); "
                    "nothing was lost: run `fanout ledger maintain` again"
                ) from exc
            table = ledger.fresh()
    raise AssertionError("unreachable")


def _vacuum_retrying(
    ledger: LedgerTable, table: DeltaTable, hours: int, compacted: bool
) -> tuple[DeltaTable, list[str]]:
    """Vacuum, on a fresh snapshot again when delta-rs refused its commit (delta-rs
    commits a vacuum: a mark or a compaction committed since the snapshot, a running
    pipeline's own compaction, refuses it before it deletes anything); caller holds
    the lock. Before, its bare ``CommitFailedError`` ended ``fanout ledger maintain``
    with a traceback. ``compacted``: a compaction ran before it (the error says it
    stays)."""
    for attempt in range(1, MAINTAIN_COMPACTION_ATTEMPTS + 1):
        try:
            done = table.vacuum(
                retention_hours=hours, dry_run=False, enforce_retention_duration=False
            )
            return table, list(done)
        except Exception as exc:
            if not is_commit_conflict(exc) or attempt == MAINTAIN_COMPACTION_ATTEMPTS:
                why = (
                    f"other writers committed while each of {attempt} vacuums ran"
                    if is_commit_conflict(exc)
                    else "its vacuum failed"
                )
                raise LedgerError(
                    f"{ledger.where}: {why} ({ledger.masked(exc)}); "
                    f"{'the compaction before it stays, ' if compacted else ''}nothing "
                    "was lost: run `fanout ledger maintain` again"
                ) from exc
            table = ledger.fresh()
    raise AssertionError("unreachable")
