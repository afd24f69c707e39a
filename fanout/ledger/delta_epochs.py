"""A pipeline's epochs in the ledger's Delta table (ARCHITECTURE §4, §5): starting one, the
``fanout recover`` reports a start begins from, and the late marks of an epoch a later
one replaced.

:class:`EpochStarts` shares :class:`fanout.ledger.delta_table.LedgerTable` (its lock, its
loaded table, its known transactions) with the ledger's other collaborators, and keeps
one cache of its own: the reports read, whose rows never change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from fanout.delta_tables.io import COMMIT_ATTEMPTS, is_commit_conflict, read_arrow
from fanout.errors import CheckpointResetError, LedgerError, ZombieBatchError
from fanout.ledger.delta_reads import committed_as_of_log, owners
from fanout.ledger.delta_table import LedgerTable
from fanout.ledger.entry import (
    LedgerEntry,
    entries_from_arrow,
    epoch_app_id,
    epoch_follows,
    epoch_taken_message,
    ledger_location,
    pipeline_app_id,
)
from fanout.ledger.recovery import (
    RECOVERY,
    RecoveryReport,
    late_mark,
    recovery_app_id,
    refused_start,
    report_entries,
    report_of,
    started_from_app_id,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable


class EpochStarts:
    """Epoch starts and ``fanout recover`` reports on ``table`` (the ledger's shared
    :class:`~fanout.ledger.delta_table.LedgerTable`, never a copy: its lock orders these
    commits with the marks)."""

    def __init__(self, table: LedgerTable) -> None:
        self._table = table
        self._reports: dict[tuple[str, int], RecoveryReport | None] = {}  # immutable rows

    def start(self, entry: LedgerEntry) -> None:
        """:meth:`fanout.ledger.delta.DeltaLedger.start_epoch`."""
        app_id = epoch_app_id(entry.pipeline)
        with self._table.lock:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                table = self._table.fresh()
                current = self._table.version(table, app_id)
                if attempt > 1 and current == entry.epoch and self._started_by(table, entry):
                    return  # the commit reported as failed had landed
                if not epoch_follows(entry.epoch, current):  # another query came first
                    raise CheckpointResetError(epoch_taken_message(entry, current))
                txns = {app_id: entry.epoch, **self.from_report(table, entry)}
                try:
                    self._table.append(table, [entry], txns)
                    return
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise

    def check_start(self, entry: LedgerEntry) -> None:
        """:meth:`fanout.ledger.delta.DeltaLedger.check_start`."""
        with self._table.lock:
            table = self._table.fresh()
            current = self._table.version(table, epoch_app_id(entry.pipeline))
            if not epoch_follows(entry.epoch, current):
                raise CheckpointResetError(epoch_taken_message(entry, current))
            self.from_report(table, entry)

    def from_report(self, table: DeltaTable, entry: LedgerEntry) -> dict[str, int]:
        """The transactions starting ``entry.epoch`` from the pipeline's newest report, when
        that report is of the epoch before (none otherwise: no report to start from).
        Raises :class:`fanout.ZombieBatchError` when ``table`` holds a batch of the old epoch
        the report did not count. The commit carries the report's number, and the old
        epoch's high-water transaction at its version: a mark of the old epoch committed
        after this snapshot makes delta-rs refuse the start (checked again on the fresh
        snapshot), and one committed after the start is refused first, and then fails as a
        late mark (:meth:`late_mark`)."""
        if entry.epoch == 0:
            return {}
        number = self._table.version(table, recovery_app_id(entry.pipeline))
        report = None if number is None else self.report(table, entry.pipeline, number)
        if report is None or report.epoch != entry.epoch - 1:
            return {}
        rows = committed_as_of_log(table, entry.pipeline, report.resume_after + 1, report.epoch)
        since = report.since(rows)
        if since:
            raise refused_start(report, entry, since, ledger_location(self._table))
        txns = {started_from_app_id(entry.pipeline, entry.epoch): report.number}
        old_high = pipeline_app_id(entry.pipeline, report.epoch)
        high = self._table.version(table, old_high)
        if high is not None:
            txns[old_high] = high
        return txns

    def report(self, table: DeltaTable, pipeline: str, number: int) -> RecoveryReport | None:
        """Report ``number`` of ``pipeline`` (its rows never change: read once)."""
        key = (pipeline, number)
        if key not in self._reports:
            rows = read_arrow(
                table,
                filters=[
                    ("pipeline", "=", pipeline),
                    ("status", "=", RECOVERY),
                    ("attempt", "=", number),
                ],
            )
            self._reports[key] = report_of(pipeline, number, entries_from_arrow(rows))
        return self._reports[key]

    def record_recovery(
        self, resume: LedgerEntry, counted: Mapping[str, LedgerEntry]
    ) -> RecoveryReport:
        """:meth:`fanout.ledger.delta.DeltaLedger.record_recovery`."""
        app_id = recovery_app_id(resume.pipeline)
        with self._table.lock:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                table = self._table.fresh()
                number = (self._table.version(table, app_id) or 0) + 1
                entries = report_entries(number, resume, counted)
                try:
                    self._table.append(table, entries, {app_id: number})
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise
                    continue
                report = report_of(resume.pipeline, number, entries)
                assert report is not None
                self._reports[(resume.pipeline, number)] = report
                return report
        raise AssertionError("unreachable")

    def late_mark(
        self, table: DeltaTable, entry: LedgerEntry, version: Callable[[str], int | None]
    ) -> ZombieBatchError | None:
        """The failure of the mark ``entry`` when it is of an epoch a later one replaced,
        started from a report that did not count its batch (``None``: a mark of the
        current epoch, the common path, reads nothing more: the epoch's version is the
        lookup's). Caller holds the lock."""
        current = version(epoch_app_id(entry.pipeline))
        if current is None or entry.epoch >= current:
            return None
        number = version(started_from_app_id(entry.pipeline, entry.epoch + 1))
        report = None if number is None else self.report(table, entry.pipeline, number)
        if report is None or not report.beyond(entry):
            return None
        high = version(pipeline_app_id(entry.pipeline, 0))
        owner = owners(table, entry.pipeline, high).get(entry.epoch + 1)
        return late_mark(report, entry, owner, ledger_location(self._table))

    def _started_by(self, table: DeltaTable, entry: LedgerEntry) -> bool:
        """Whether ``table`` holds ``entry``'s epoch row: its query started the epoch."""
        high = self._table.version(table, pipeline_app_id(entry.pipeline, 0))
        return owners(table, entry.pipeline, high).get(entry.epoch) == entry.query_id
