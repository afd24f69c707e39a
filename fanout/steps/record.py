"""Step 6 of a batch: record each sink's outcome in the ledger.

A ``committed`` mark is what makes a later replay skip the sink, so it is retried like the
sink's write (a lost mark costs a rewrite, which the sink's idempotency absorbs); a
``failed`` row is best effort, for ``fanout status``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.errors import CheckpointError
from fanout.ledger.entry import MARK_HOLD, Ledger, LedgerEntry, Status, now_utc
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import redact_printed
from fanout.retry import RetryPolicy

log = logging.getLogger("fanout")


@dataclass(eq=False)
class Recorder:
    """Writes one pipeline's ledger rows for its sinks' attempts.

    :param ledger: the pipeline's ledger.
    :param retry: how often, and how far apart, a failed ``committed`` mark is retried.
    :param secrets: every secret of the pipeline (its locations' passwords and all its
        sinks' :meth:`fanout.Sink.secret_values`), masked in the error a failed row records
        as printed text masks them (:func:`fanout.observe.secrets.redact_printed`): one
        sink's error may quote another's password or a location's; the failing sink's own,
        masked wherever they stand alone, are masked before (``steps/write._named``).
        Replaced whole when a sink opened late adds one (:meth:`fanout.FanOut` regathers).
    """

    ledger: Ledger
    retry: RetryPolicy
    secrets: tuple[str, ...] = ()
    # (sink, epoch) of each committed mark this recorder wrote (marked_here)
    _marked: set[tuple[str, int]] = field(default_factory=set, init=False, repr=False)

    def marked_here(self, sink: str, epoch: int) -> bool:
        """Whether this recorder (one per :class:`fanout.FanOut`) marked a batch of
        ``epoch`` committed for ``sink``. Its later batches of the epoch are then none that
        another process attempted: a sink receives its batches in order, live or caught
        up, each only after the one before it was marked, and an earlier process's
        attempt left at most the one after its mark unmarked, which a replay hands this
        process first."""
        return (sink, epoch) in self._marked

    def committed(
        self,
        batch: Batch,
        attempt: int,
        started: datetime,
        duration_s: float,
        result: SinkResult,
        writing: SinkWriting | None = None,
    ) -> None:
        """Mark ``batch`` committed for its sink; raises what the last try raised.

        ``writing``: the sink's place among its batch's sinks still writing; the mark may
        wait for theirs to share one ledger commit (:class:`fanout.ledger.entry.MarkHold`).
        """
        token = MARK_HOLD.set(writing)
        try:
            self._committed(batch, attempt, started, duration_s, result)
        finally:
            MARK_HOLD.reset(token)
        self._marked.add((batch.sink_name, batch.info.epoch))

    def _committed(
        self, batch: Batch, attempt: int, started: datetime, duration_s: float, result: SinkResult
    ) -> None:
        entry = replace(
            self.entry(batch, "committed", attempt, started, duration_s),
            rows=result.rows,
            dead_lettered=result.dead_lettered,
        )
        for try_number in range(1, self.retry.retries + 2):
            try:
                self.ledger.mark_committed(entry)
                return
            except Exception as exc:
                # a mark the ledger refuses as another epoch's (a zombie query's batch) says
                # the same at every try
                if try_number > self.retry.retries or isinstance(exc, CheckpointError):
                    raise
                log.warning(
                    "pipeline %s, batch %s, sink %s: ledger mark failed (%s); retrying",
                    entry.pipeline,
                    entry.batch_id,
                    entry.sink,
                    exc,
                    extra=batch_fields(entry.pipeline, entry.batch_id, entry.sink),
                )
                time.sleep(self.retry.delay(try_number))

    def failed(
        self,
        batch: Batch,
        attempt: int,
        started: datetime,
        duration_s: float,
        error: BaseException,
    ) -> None:
        """Record a failed attempt; never raises (a warning says when it cannot)."""
        entry = self.entry(batch, "failed", attempt, started, duration_s)
        try:
            said = redact_printed(f"{type(error).__name__}: {error}", self.secrets)
            self.ledger.record_failure(replace(entry, error=said))
        except Exception as exc:  # best effort: the sink's own log line already tells
            log.warning(
                "pipeline %s: cannot record the failed attempt in the ledger: %s",
                batch.pipeline,
                exc,
                extra=batch_fields(batch.pipeline, batch.batch_id, batch.sink_name),
            )

    @staticmethod
    def entry(
        batch: Batch, status: Status, attempt: int, started: datetime, duration_s: float
    ) -> LedgerEntry:
        """The ledger row of one attempt of ``batch``'s sink."""
        info = batch.info
        return LedgerEntry(
            pipeline=info.pipeline,
            sink=batch.sink_name,
            batch_id=info.batch_id,
            status=status,
            query_id=info.query_id,
            attempt=attempt,
            started_at=started,
            finished_at=now_utc(),
            duration_ms=int(duration_s * 1000),
            source_offsets=None if info.source_offsets is None else json.dumps(info.source_offsets),
            epoch=info.epoch,
            batch_timestamp_ms=info.batch_timestamp_ms,
        )


class WritingSinks:
    """The sinks of one batch writing right now, counted so that a written sink's ledger
    mark can wait for the marks of those finishing next (one ledger commit per batch)."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    def member(self) -> SinkWriting:
        """A new sink's place in the count (not writing yet)."""
        return SinkWriting(self)

    def _add(self, delta: int) -> None:
        with self._changed:
            self._count += delta
            if self._count == 0:
                self._changed.notify_all()

    def _wait_idle(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._count == 0, timeout)


class SinkWriting:
    """One sink's place among its batch's :class:`WritingSinks`: a
    :class:`fanout.ledger.entry.MarkHold`."""

    def __init__(self, group: WritingSinks) -> None:
        self._group = group
        self._writing = False

    def start(self) -> None:
        """The sink starts an attempt."""
        if not self._writing:
            self._writing = True
            self._group._add(1)

    def release(self) -> None:
        """The sink is not writing (done, failed, or waiting to retry)."""
        if self._writing:
            self._writing = False
            self._group._add(-1)

    def release_and_wait(self, timeout: float) -> None:
        """Release; return once no other sink of the batch is writing, or after
        ``timeout`` seconds."""
        self.release()
        if timeout > 0:
            self._group._wait_idle(timeout)
