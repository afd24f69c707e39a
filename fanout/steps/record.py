"""Step 6 of a batch: record each sink's outcome in the ledger.

A ``committed`` mark is what makes a later replay skip the sink, so it is retried like the
sink's write (a lost mark costs a rewrite, which the sink's idempotency absorbs); a
``failed`` row is best effort, for ``fanout status``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime

from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.ledger.entry import Ledger, LedgerEntry, Status, now_utc
from fanout.observe.logs import batch_fields
from fanout.retry import RetryPolicy

log = logging.getLogger("fanout")


@dataclass(frozen=True)
class Recorder:
    """Writes one pipeline's ledger rows for its sinks' attempts.

    :param ledger: the pipeline's ledger.
    :param retry: how often, and how far apart, a failed ``committed`` mark is retried.
    """

    ledger: Ledger
    retry: RetryPolicy

    def committed(
        self, batch: Batch, attempt: int, started: datetime, duration_s: float, result: SinkResult
    ) -> None:
        """Mark ``batch`` committed for its sink; raises what the last try raised."""
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
                if try_number > self.retry.retries:
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
            self.ledger.record_failure(replace(entry, error=f"{type(error).__name__}: {error}"))
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
