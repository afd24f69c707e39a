"""Steps 5 and 6 for one sink: write with retries, then mark the ledger."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from fanout.contract.batch import Batch
from fanout.contract.sink import DeadLetterWriter, Sink, SinkResult
from fanout.errors import LedgerError, SinkError, SinkWriteError
from fanout.hooks.caller import HookCaller
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import redact
from fanout.steps.retry import RetryPolicy

if TYPE_CHECKING:
    from fanout.deadletters.model import DeadLetter

log = logging.getLogger("fanout")


@dataclass(frozen=True)
class SinkOutcome:
    """How one sink fared with one batch: a result, or the error it failed with."""

    sink: str
    result: SinkResult | None = None
    error: BaseException | None = None


def as_result(value: object, sink: Sink) -> SinkResult:
    """Normalise what ``Sink.write`` returned: an int, a SinkResult, or an object with
    ``rows`` (and optionally ``details``)."""
    if isinstance(value, SinkResult):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return SinkResult(rows=value)
    rows = getattr(value, "rows", None)
    if isinstance(rows, int):
        return SinkResult(
            rows=rows,
            details=dict(getattr(value, "details", None) or {}),
            dead_lettered=int(getattr(value, "dead_lettered", 0) or 0),
        )
    raise TypeError(
        f"sink {sink.name!r}: write() must return the number of rows written or a "
        f"fanout.SinkResult, not {value!r}"
    )


@dataclass
class SinkRunner:
    """Writes one batch to one sink: attempts, retries, hooks, failure rows, the mark.

    :param letters: rows of the batch that failed the sink's route; written through
        ``dead_letters`` at the start of each attempt, counted in the result.
    :param blocked: an error found before any write (the route cannot be settled): the
        sink is not written, and this is its failure.
    :param explain: turns a final error into a clearer one (a route expression's
        failure named), or returns ``None`` to keep it.
    """

    sink: Sink
    batch: Batch
    ledger: Ledger
    retry: RetryPolicy
    hooks: HookCaller
    letters: Sequence[DeadLetter] = ()
    dead_letters: DeadLetterWriter | None = None
    blocked: Exception | None = None
    explain: Callable[[BaseException], Exception | None] | None = None

    def run(self) -> SinkOutcome:
        """Never raises for a sink's own failure: returns it in the outcome."""
        info, name = self.batch.info, self.sink.name
        if self.blocked is not None:
            return self._refuse(self.blocked)
        attempt = 0
        while True:
            attempt += 1
            batch = replace(self.batch, attempt=attempt)
            started, clock = now_utc(), time.perf_counter()
            self.hooks.call("fanout_sink_start", info=info, sink=name, attempt=attempt)
            try:
                routed = self._route_dead_letters(batch)
                result = as_result(self.sink.write(batch), self.sink)
                if routed:
                    result = replace(
                        result,
                        dead_lettered=result.dead_lettered + routed,
                        details={**result.details, "route_dead_lettered": routed},
                    )
            except Exception as exc:
                error = _named(exc, name, info.batch_id, self.sink.secret_values())
                will_retry = self._transient(exc) and attempt <= self.retry.retries
                if not will_retry and self.explain is not None:
                    error = self.explain(exc) or error
                self._failed(attempt, started, clock, error, will_retry)
                if not will_retry:
                    return SinkOutcome(name, error=error)
                time.sleep(self.retry.delay(attempt))
                continue
            duration = time.perf_counter() - clock
            self.hooks.call(
                "fanout_sink_done", info=info, sink=name, result=result, duration_s=duration
            )
            try:
                self._mark(attempt, started, duration, result)
            except Exception as exc:
                error = exc if isinstance(exc, LedgerError) else LedgerError(str(exc))
                log.error(
                    "pipeline %s, batch %s, sink %s: written but the ledger mark failed (%s); "
                    "the sink will be written again on replay",
                    info.pipeline,
                    info.batch_id,
                    name,
                    exc,
                    extra=batch_fields(info.pipeline, info.batch_id, name),
                )
                return SinkOutcome(name, error=error)
            log.info(
                "pipeline %s, batch %s, sink %s: %s rows in %.0f ms",
                info.pipeline,
                info.batch_id,
                name,
                result.rows,
                duration * 1000,
                extra=batch_fields(info.pipeline, info.batch_id, name),
            )
            return SinkOutcome(name, result=result)

    def _refuse(self, error: Exception) -> SinkOutcome:
        """Fail the sink without writing it (an error found before any write)."""
        info, name = self.batch.info, self.sink.name
        self.hooks.call("fanout_sink_start", info=info, sink=name, attempt=1)
        error = _named(error, name, info.batch_id, self.sink.secret_values())
        self._failed(1, now_utc(), time.perf_counter(), error, will_retry=False)
        return SinkOutcome(name, error=error)

    def _route_dead_letters(self, batch: Batch) -> int:
        """Write the rows that failed the route to the sink's dead-letter target (once per
        batch: the writer is idempotent); return how many the batch has."""
        if not self.letters or self.dead_letters is None:
            return 0
        count = self.dead_letters.write(batch, self.letters)
        log.warning(
            "pipeline %s, batch %s, sink %s: %s row(s) failing its route went to its "
            "dead-letter target; first: %s",
            batch.pipeline,
            batch.batch_id,
            self.sink.name,
            count,
            self.letters[0].reason,
            extra=batch_fields(batch.pipeline, batch.batch_id, self.sink.name),
        )
        return count

    def _transient(self, exc: BaseException) -> bool:
        try:
            return bool(self.sink.is_transient(exc))
        except Exception:
            log.exception(
                "sink %r: is_transient() raised; treating the error as final",
                self.sink.name,
                extra=batch_fields(self.batch.pipeline, self.batch.batch_id, self.sink.name),
            )
            return False

    def _entry(
        self, status: str, attempt: int, started: datetime, duration_s: float
    ) -> LedgerEntry:
        info = self.batch.info
        return LedgerEntry(
            pipeline=info.pipeline,
            sink=self.sink.name,
            batch_id=info.batch_id,
            status=status,  # type: ignore[arg-type]
            query_id=info.query_id,
            attempt=attempt,
            started_at=started,
            finished_at=now_utc(),
            duration_ms=int(duration_s * 1000),
            source_offsets=None if info.source_offsets is None else json.dumps(info.source_offsets),
            epoch=info.epoch,
            batch_timestamp_ms=info.batch_timestamp_ms,
        )

    def _mark(self, attempt: int, started: datetime, duration_s: float, result: SinkResult) -> None:
        """Write the ledger mark, retrying like the sink: a lost mark costs a rewrite."""
        entry = replace(
            self._entry("committed", attempt, started, duration_s),
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

    def _failed(
        self, attempt: int, started: datetime, clock: float, error: BaseException, will_retry: bool
    ) -> None:
        info = self.batch.info
        log.warning(
            "pipeline %s, batch %s, sink %s: attempt %s failed%s: %s",
            info.pipeline,
            info.batch_id,
            self.sink.name,
            attempt,
            " (will retry)" if will_retry else "",
            error,
            extra=batch_fields(info.pipeline, info.batch_id, self.sink.name, attempt=attempt),
        )
        self.hooks.call(
            "fanout_sink_error",
            info=info,
            sink=self.sink.name,
            error=error,
            attempt=attempt,
            will_retry=will_retry,
        )
        entry = self._entry("failed", attempt, started, time.perf_counter() - clock)
        try:
            self.ledger.record_failure(replace(entry, error=f"{type(error).__name__}: {error}"))
        except Exception as exc:  # best effort: the log line above already tells
            log.warning(
                "pipeline %s: cannot record the failed attempt in the ledger: %s",
                info.pipeline,
                exc,
                extra=batch_fields(info.pipeline, info.batch_id, self.sink.name),
            )


def _named(exc: Exception, sink: str, batch_id: int, secrets: Sequence[str]) -> Exception:
    """The sink's error, wrapped to name sink and batch unless it already does.

    When any message in the error's chain holds one of the sink's secrets, the result is
    a new error with the secrets masked and the chain cut, so no traceback shows them.
    """
    chain_text = " ".join(str(e) for e in _chain(exc))
    if any(secret and secret in chain_text for secret in secrets):
        masked = SinkWriteError(
            redact(f"{type(exc).__name__}: {exc}", secrets), sink=sink, batch_id=batch_id
        )
        masked.__suppress_context__ = True
        return masked
    if isinstance(exc, SinkError):
        return exc
    wrapped = SinkWriteError(f"{type(exc).__name__}: {exc}", sink=sink, batch_id=batch_id)
    wrapped.__cause__ = exc
    return wrapped


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
