"""The ledger's marks, grouped into Delta commits (ARCHITECTURE §4: group commit, no
refresh before a mark).

:class:`MarkQueue` owns the queue of marks waiting for a commit and the lock guarding it,
and shares :class:`fanout.ledger.delta_table.LedgerTable` (the commit lock, the loaded
table, the known transactions) and :class:`fanout.ledger.delta_epochs.EpochStarts` (the
late marks of a replaced epoch) with the ledger: the same objects, never copies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fanout.contract.batch import txn_app_id
from fanout.delta_tables.io import COMMIT_ATTEMPTS, is_commit_conflict
from fanout.errors import LedgerError, ZombieBatchError
from fanout.ledger.delta_epochs import EpochStarts
from fanout.ledger.delta_reads import committed_as_of_log
from fanout.ledger.delta_table import LedgerTable
from fanout.ledger.entry import (
    MARK_HOLD,
    LedgerEntry,
    lost_app_id,
    pipeline_app_id,
    replaced_app_id,
    skip_app_id,
)
from fanout.ledger.gaps import is_skip, written_beside_skip

if TYPE_CHECKING:
    from deltalake import DeltaTable


log = logging.getLogger("fanout.ledger.delta")  # the name its logs always had


class MarkQueue:
    """Marks queued for the next commit on ``table``, made under its lock by whichever
    caller takes it first; :attr:`queued` is guarded by its own lock, taken briefly."""

    def __init__(self, table: LedgerTable, epochs: EpochStarts) -> None:
        self._table = table
        self._epochs = epochs
        self.queue_lock = threading.Lock()
        self.queued: list[MarkRequest] = []

    def mark(self, entry: LedgerEntry, linger_s: float) -> bool:
        """:meth:`fanout.ledger.delta.DeltaLedger.mark_committed`, a queued mark waiting at
        most ``linger_s`` for the other sinks of its batch."""
        request = MarkRequest(entry)
        with self.queue_lock:
            self.queued.append(request)
        hold = MARK_HOLD.get()
        if hold is not None:
            hold.release_and_wait(linger_s)
        with self._table.lock:
            if not request.settled:
                self._commit_queued()
        return request.outcome()

    def _commit_queued(self) -> None:
        """Commit every queued mark in one Delta commit (caller holds the lock).

        The marks are checked and committed on one snapshot: the one loaded, without listing
        the log again (the batch's lookup just did). Every mark commit carries the
        pipeline's high-water transaction, so when another writer (a zombie driver) has
        committed a mark of the same pipeline since, delta-rs refuses the commit; the marks
        are then checked again on the fresh snapshot, so a mark the other writer already
        recorded counts as done, never as a failure or a second row.
        """
        with self.queue_lock:
            requests, self.queued = self.queued, []
        try:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    self._commit_requests(
                        [r for r in requests if not r.settled], refresh=attempt > 1
                    )
                    return
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise
                    log.info(
                        "ledger %s: lost a commit race, checking the marks again: %s",
                        self._table.shown,
                        cause,
                    )
        except BaseException as exc:
            for request in requests:
                if not request.settled:
                    request.fail(exc)
            raise

    def _commit_requests(self, requests: Sequence[MarkRequest], *, refresh: bool) -> None:
        """Check ``requests`` on the loaded (``refresh``: latest) snapshot and commit those
        not yet recorded."""
        table = self._table.loaded(refresh=refresh)
        versions: dict[str, int | None] = {}

        def version(app_id: str) -> int | None:
            if app_id not in versions:
                versions[app_id] = self._table.version(table, app_id)
            return versions[app_id]

        accepted: list[MarkRequest] = []
        txns: dict[str, int] = {}
        late: list[tuple[MarkRequest, ZombieBatchError]] = []
        for request in requests:
            entry = request.entry
            sink_app = txn_app_id(entry.pipeline, entry.sink, entry.epoch)
            done = version(sink_app)
            replacing = done == entry.batch_id and _replaces_lost(entry, sink_app, version)
            beside = False
            if done is not None and done >= entry.batch_id and not replacing:
                beside = _beside_skip(table, entry, version(skip_app_id(sink_app)))
                if not beside:
                    # a late mark made again (the catch-up's next try of its spooled batch)
                    # passes: its first failed, and failing each try stalled the sink for good
                    request.settle(False)
                    continue
            error = self._epochs.late_mark(table, entry, version)
            if error is not None:  # recorded all the same: the sink holds the batch
                late.append((request, error))
            pipeline_app = pipeline_app_id(entry.pipeline, entry.epoch)
            high = version(pipeline_app)
            if not beside:  # beside a skip's mark: the sink's transaction stays at it
                versions[sink_app] = txns[sink_app] = entry.batch_id
            if is_skip(entry):  # a write's own mark of a batch it holds reads the marks
                versions[skip_app_id(sink_app)] = txns[skip_app_id(sink_app)] = entry.batch_id
            if entry.lost or replacing:  # §5: a write's own mark replaces a lost one
                app = lost_app_id(sink_app) if entry.lost else replaced_app_id(sink_app)
                versions[app] = txns[app] = entry.batch_id
            versions[pipeline_app] = txns[pipeline_app] = max(
                entry.batch_id, -1 if high is None else high
            )
            accepted.append(request)
        if accepted:
            self._table.append(table, [r.entry for r in accepted], txns)
        for request in accepted:
            request.settle(True)
        for request, error in late:
            request.fail(error)


def _beside_skip(table: DeltaTable, entry: LedgerEntry, skipped: int | None) -> bool:
    """Whether ``entry``, a mark its sink's transaction already holds, is a write's own
    mark of a batch the sink's marks hold only by a ``fanout ledger skip`` made while
    the write ran (:func:`fanout.ledger.gaps.written_beside_skip`). ``skipped``: the
    batch of the sink's last skip mark, from the log (:func:`skip_app_id`); the marks
    are read (one scan of the sink's marks of the epoch from the batch on) only when
    it is at or past the batch, so a mark made twice stays a look at the log."""
    if entry.error is not None or entry.lost:
        return False
    if skipped is None or skipped < entry.batch_id:
        return False
    marks = [
        (e.batch_id, is_skip(e))
        for e in committed_as_of_log(table, entry.pipeline, entry.batch_id, entry.epoch)
        if e.sink == entry.sink
    ]
    return written_beside_skip(entry, marks)


def _replaces_lost(entry: LedgerEntry, sink_app: str, version: Callable[[str], int | None]) -> bool:
    """Whether the mark ``entry``, its sink's transaction ``sink_app`` already at its batch,
    is a write's own mark replacing a lost one (:func:`fanout.ledger.entry.replaces_lost`),
    told from the log alone: the lost mark's commit set :func:`lost_app_id` at the batch,
    and no replacing mark set :func:`replaced_app_id` there yet."""
    if entry.error is not None:
        return False
    batch = entry.batch_id
    return version(lost_app_id(sink_app)) == batch and version(replaced_app_id(sink_app)) != batch


class MarkRequest:
    """One caller's mark waiting to be committed, alone or with others."""

    def __init__(self, entry: LedgerEntry) -> None:
        self.entry = entry
        self.settled = False
        self._written = False
        self._error: BaseException | None = None

    def settle(self, written: bool) -> None:
        """Its commit is done: ``written``, or it found the mark already there."""
        self._written, self.settled = written, True

    def fail(self, error: BaseException) -> None:
        """Its commit raised ``error`` (the caller raises it)."""
        self._error, self.settled = error, True

    def outcome(self) -> bool:
        """True when this call wrote the mark; raises what its commit raised."""
        if self._error is not None:
            raise self._error
        return self._written
