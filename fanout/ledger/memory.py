"""A ledger in memory, for unit tests and benchmarks."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

from fanout.contract.batch import pipeline_scope
from fanout.errors import CheckpointResetError
from fanout.ledger.begun import BEGUN
from fanout.ledger.entry import (
    LedgerEntry,
    LedgerView,
    as_of_log,
    epoch_follows,
    epoch_owners,
    epoch_taken_message,
    replaces_lost,
)
from fanout.ledger.gaps import is_skip, written_beside_skip
from fanout.ledger.refusals import ADMITTED, REFUSED
from fanout.ledger.target_records import TargetRecord, since_code, target_digest


class MemoryLedger:
    """A ledger in memory, with :class:`DeltaLedger`'s semantics; for tests and benchmarks.

    Marks vanish with the process, so it gives no protection across restarts. ``entries``
    holds the rows as written (tests read them); fanout reads them through
    :meth:`committed_entries` and the others, as of the log.
    """

    def __init__(self) -> None:
        self.entries: list[LedgerEntry] = []
        self._marks: dict[tuple[str, str], int] = {}  # (scope, sink) -> batch id
        self._epochs: dict[str, int] = {}
        self.dead_letters: dict[tuple[str, str], list[TargetRecord]] = {}
        """Each (pipeline, sink)'s recorded dead-letter targets, apart from
        :attr:`entries` (:mod:`fanout.deadletters.moved`)."""
        self._lock = threading.Lock()

    def open(self) -> None:
        """Nothing to create."""

    def last_committed(
        self, pipeline: str, sinks: Iterable[str], epoch: int = 0
    ) -> dict[str, int | None]:
        """The last batch id each sink committed."""
        scope = pipeline_scope(pipeline, epoch)
        with self._lock:
            return {s: self._marks.get((scope, s)) for s in sinks}

    def high_water(self, pipeline: str, epoch: int = 0) -> int | None:
        """The highest batch id any sink of ``pipeline`` committed."""
        scope = pipeline_scope(pipeline, epoch)
        with self._lock:
            marks = [v for (p, _), v in self._marks.items() if p == scope]
            return max(marks) if marks else None

    def current_epoch(self, pipeline: str) -> int:
        """The pipeline's epoch."""
        with self._lock:
            return self._epochs.get(pipeline, 0)

    def lookup(self, pipeline: str, sinks: Iterable[str]) -> LedgerView:
        """Epoch, high-water mark and marks of the current epoch."""
        epoch = self.current_epoch(pipeline)
        with self._lock:
            recorded = pipeline in self._epochs
        return LedgerView(
            epoch,
            self.high_water(pipeline, epoch),
            self.last_committed(pipeline, sinks, epoch),
            owner_recorded=recorded,
        )

    def start_epoch(self, entry: LedgerEntry) -> None:
        """Start the entry's epoch."""
        with self._lock:
            current = self._epochs.get(entry.pipeline)
            if not epoch_follows(entry.epoch, current):
                raise CheckpointResetError(epoch_taken_message(entry, current))
            self._epochs[entry.pipeline] = entry.epoch
            self.entries.append(entry)

    def check_start(self, entry: LedgerEntry) -> None:
        """Raise what :meth:`start_epoch` would for the ``epoch`` row ``entry``, without
        writing (:meth:`DeltaLedger.check_start <fanout.ledger.delta.DeltaLedger.check_start>`;
        this ledger keeps no ``fanout recover`` report, so no zombie batch to find)."""
        if entry.status != "epoch":
            raise ValueError("check_start takes an epoch entry")
        with self._lock:
            current = self._epochs.get(entry.pipeline)
        if not epoch_follows(entry.epoch, current):
            raise CheckpointResetError(epoch_taken_message(entry, current))

    def sink_names(self, pipeline: str) -> list[str]:
        """The sinks ``pipeline``'s marks and failed attempts name (any epoch), sorted."""
        with self._lock:
            return sorted({e.sink for e in self.entries if e.pipeline == pipeline
                           and e.status in ("committed", "failed")})  # fmt: skip

    def mark_committed(self, entry: LedgerEntry) -> bool:
        """Record the mark unless it exists (or it replaces a lost mark of its batch,
        :func:`fanout.ledger.entry.replaces_lost`, or it is a write's own mark of a batch
        only a skip's mark holds, :func:`fanout.ledger.gaps.written_beside_skip`)."""
        key = (pipeline_scope(entry.pipeline, entry.epoch), entry.sink)
        with self._lock:
            done = self._marks.get(key)
            if (
                done is not None
                and done >= entry.batch_id
                and not (done == entry.batch_id and replaces_lost(entry, self.entries))
            ):
                marks = [
                    (e.batch_id, is_skip(e))
                    for e in as_of_log(self.entries)
                    if e.pipeline == entry.pipeline and e.sink == entry.sink
                    and e.epoch == entry.epoch and e.status == "committed"
                ]  # fmt: skip
                if not written_beside_skip(entry, marks):
                    return False
                self.entries.append(entry)  # the sink's mark stays at the skip's batch
                return True
            self._marks[key] = entry.batch_id
            self.entries.append(entry)
            return True

    def record_failure(self, entry: LedgerEntry) -> None:
        """Keep the failed attempt."""
        with self._lock:
            self.entries.append(entry)

    def record_refusal_row(self, entry: LedgerEntry) -> None:
        """Keep a ``refused`` or ``admitted`` row (:mod:`fanout.ledger.refusals`)."""
        if entry.status not in (REFUSED, ADMITTED):
            raise ValueError("record_refusal_row takes a refused or admitted entry")
        with self._lock:
            self.entries.append(entry)

    def refusal_rows(self, pipeline: str, epoch: int, batch_id: int) -> list[LedgerEntry]:
        """The ``refused`` and ``admitted`` rows of one batch of one epoch."""
        with self._lock:
            return [e for e in self.entries if e.pipeline == pipeline and e.epoch == epoch
                    and e.batch_id == batch_id and e.status in (REFUSED, ADMITTED)]  # fmt: skip

    def record_begun(self, entry: LedgerEntry) -> None:
        """Keep a ``begun`` row (:mod:`fanout.ledger.begun`)."""
        if entry.status != BEGUN:
            raise ValueError("record_begun takes a begun entry")
        with self._lock:
            self.entries.append(entry)

    def begun(self, pipeline: str, sink: str, epoch: int, batch_id: int) -> bool:
        """Whether a ``begun`` row of the batch and sink is kept."""
        with self._lock:
            return any(e.pipeline == pipeline and e.sink == sink and e.epoch == epoch
                       and e.batch_id == batch_id and e.status == BEGUN
                       for e in self.entries)  # fmt: skip

    def dead_letter_marks(self, pipeline: str, sinks: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Per sink with a recorded dead-letter target: its last one's digest and first
        batch, coded."""
        with self._lock:
            found = {s: self.dead_letters[(pipeline, s)][-1] for s in sinks
                     if self.dead_letters.get((pipeline, s))}  # fmt: skip
        return {s: (target_digest(r.target), since_code(r.since)) for s, r in found.items()}

    def dead_letter_records(self, pipeline: str, sink: str) -> list[TargetRecord]:
        """Every dead-letter target recorded for ``sink``, in order."""
        with self._lock:
            return list(self.dead_letters.get((pipeline, sink), []))

    def record_dead_letters(self, pipeline: str, records: Mapping[str, TargetRecord]) -> None:
        """Record one dead-letter target per sink."""
        with self._lock:
            for sink, record in records.items():
                self.dead_letters.setdefault((pipeline, sink), []).append(record)

    def pipelines(self) -> list[str]:
        """The names of the pipelines the ledger holds rows of, sorted."""
        with self._lock:
            return sorted({e.pipeline for e in self.entries})

    def committed_entries(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """Committed entries of ``pipeline`` at or after ``min_batch_id`` (of ``epoch``),
        as of the log (:func:`fanout.ledger.entry.as_of_log`)."""
        return as_of_log(self._committed(pipeline, min_batch_id, epoch))

    def failed_batches(
        self, pipeline: str, min_batch_id: int, epoch: int, *, sink: str | None = None,
        error: str | None = None,
    ) -> list[int]:  # fmt: skip
        """The batches of ``epoch`` from ``min_batch_id`` on that a failed row names (of
        ``sink``, its error beginning with ``error``, when given)."""
        with self._lock:
            return sorted(
                {
                    e.batch_id
                    for e in self.entries
                    if e.pipeline == pipeline
                    and e.status == "failed"
                    and e.batch_id >= min_batch_id
                    and (e.epoch or 0) == epoch
                    and (sink is None or e.sink == sink)
                    and (error is None or (e.error or "").startswith(error))
                }
            )

    def committed_entries_with_replaced(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """:meth:`committed_entries` as written: with the lost marks own marks replaced."""
        return self._committed(pipeline, min_batch_id, epoch)

    def _committed(self, pipeline: str, min_batch_id: int, epoch: int | None) -> list[LedgerEntry]:
        with self._lock:
            return [
                e
                for e in self.entries
                if e.pipeline == pipeline
                and e.status == "committed"
                and e.batch_id >= min_batch_id
                and (epoch is None or e.epoch == epoch)
            ]

    def epoch_start(self, pipeline: str, epoch: int) -> int | None:
        """The batch of ``epoch``'s ``epoch`` row (``None``: none)."""
        with self._lock:
            starts = [
                e.batch_id
                for e in self.entries
                if e.pipeline == pipeline and e.status == "epoch" and e.epoch == epoch
            ]
        return min(starts, default=None)

    def epoch_owners(self, pipeline: str) -> dict[int, str]:
        """Per epoch of ``pipeline``, the query id it belongs to."""
        with self._lock:
            return epoch_owners(as_of_log(e for e in self.entries if e.pipeline == pipeline))
