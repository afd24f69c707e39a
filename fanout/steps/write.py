"""Step 5 of a batch: write each pending sink, with retries, in parallel threads; each
sink's ledger mark (step 6, :mod:`fanout.steps.record`) follows its own write."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime

from fanout.contract.batch import Batch, txn_app_id
from fanout.contract.sessions import spark_threads
from fanout.contract.sink import Sink, SinkResult
from fanout.deadletters.moved import write_letters
from fanout.errors import (
    CheckpointError,
    LedgerError,
    SinkError,
    SinkResultError,
    SinkTimeoutError,
    SinkWriteError,
)
from fanout.hooks.caller import HookCaller
from fanout.ledger.entry import now_utc
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import SinkSecrets, masked_error
from fanout.partitioned.determinism import check_batch
from fanout.partitioned.sink import PartitionedSink
from fanout.retry import RetryPolicy
from fanout.routes.batch_routes import BatchRoutes, SinkInput
from fanout.sink_spec import SinkSpec, write_timeouts
from fanout.steps.record import Recorder, SinkWriting, WritingSinks
from fanout.steps.result_check import check_counts
from fanout.steps.share import SharedPass, shared_passes
from fanout.steps.shared_frame import RecentLayouts
from fanout.steps.state import BatchState
from fanout.steps.timeout import (
    AbandonedWrites,
    TimedWrite,
    WriteClaim,
)

log = logging.getLogger("fanout")


def write_all(
    state: BatchState,
    specs: Mapping[str, SinkSpec],
    routes: BatchRoutes,
    record: Recorder,
    hooks: HookCaller,
    *,
    retry: RetryPolicy,
    abandoned: AbandonedWrites,
    parallelism: int | None = None,
    layouts: RecentLayouts | None = None,
) -> None:
    """Write (and mark) every pending sink, in parallel threads (at most ``parallelism``);
    fills ``state.results`` and ``state.failures``. A sink's failure never stops another.
    ``layouts``: the shared jobs' last input layouts (:mod:`fanout.steps.shared_frame`).
    A sink with a ``write_timeout_s`` is written in a thread of its own, outside that bound,
    and waited for only that long (:mod:`fanout.steps.timeout`; its abandoned writes are
    kept in ``abandoned``)."""
    writing = WritingSinks()  # a written sink's mark waits for those still writing
    batches = {
        name: _batch_for(state, name, routes.input_for(name), specs[name]) for name in state.pending
    }
    timeouts = write_timeouts(specs, state.pending)
    # this thread's Spark properties, captured once for every thread that starts jobs
    threads = spark_threads(state.df) if len(state.pending) > 1 or timeouts else None
    passes = shared_passes(state.share_groups, routes.df, batches, specs, layouts, threads)
    runners = [
        SinkRunner(
            specs[name].sink,
            batches[name],
            routes.input_for(name),
            record,
            specs[name].retry or retry,
            hooks,
            writing.member(),
            passes.get(name),
        )
        for name in state.pending
    ]
    timed: list[TimedWrite] = []
    if timeouts:
        assert threads is not None
        for runner in [r for r in runners if r.sink.name in timeouts]:
            runners.remove(runner)
            runner.writing = WritingSinks().member()  # no other sink's mark waits for it
            timed.append(TimedWrite.start(runner, timeouts[runner.sink.name], abandoned, threads))
    if not runners:
        outcomes = []
    elif len(runners) == 1:
        outcomes = [runners[0].run()]
    else:
        workers = min(parallelism or len(runners), len(runners))
        for runner in runners[:workers]:  # writing from now: a sink done before another's
            runner.writing.start()  # thread has started still waits for its mark
        prefix = f"fanout-{state.info.pipeline}"
        with ThreadPoolExecutor(workers, thread_name_prefix=prefix) as pool:
            assert threads is not None
            tasks = [threads(r.run) for r in runners]
            outcomes = list(pool.map(lambda task: task(), tasks))
    outcomes += [_timed_outcome(t) for t in timed]  # each waits what is left of its time
    state.results.update({o.sink: o.result for o in outcomes if o.result is not None})
    state.failures.update({o.sink: o.error for o in outcomes if o.error is not None})
    state.aborted = next((o.abort for o in outcomes if o.abort is not None), state.aborted)


def run_timed(
    runner: SinkRunner,
    timeout_s: float,
    abandoned: AbandonedWrites,
    df: object,
    configured_s: float | None = None,
    started: Callable[[TimedWrite | None], None] = lambda timed: None,
) -> SinkOutcome:
    """Run ``runner`` in a thread of its own and wait for it at most ``timeout_s`` (the
    sink's ``configured_s`` doubled, :mod:`fanout.steps.timeout`); its Spark jobs inherit
    this thread's properties (``df``'s session). ``started`` is told of the write while it
    is waited for (then of ``None``): its waiter may give it up early."""
    threads = spark_threads(df)
    timed = TimedWrite.start(runner, timeout_s, abandoned, threads, configured_s)
    started(timed)
    try:
        return _timed_outcome(timed)
    finally:
        started(None)


def _timed_outcome(timed: TimedWrite) -> SinkOutcome:
    got = timed.outcome()
    if isinstance(got, SinkTimeoutError):  # abandoned
        return SinkOutcome(timed.runner.sink.name, error=got)
    assert isinstance(got, SinkOutcome)
    return got


def _batch_for(state: BatchState, name: str, given: SinkInput, spec: SinkSpec) -> Batch:
    info = state.info
    app_id = txn_app_id(info.pipeline, name, info.epoch)
    return Batch(given.df, info, name, app_id, route=given.stamp(spec.route),
                 earlier=given.earlier, _arrow=given.arrow)  # fmt: skip


@dataclass(frozen=True)
class SinkOutcome:
    """How one sink fared with one batch: a result, or the error it failed with (and,
    when the write raised a BaseException that is not an Exception, that exception as
    raised: ``abort``, for the caller to raise on once the batch is settled)."""

    sink: str
    result: SinkResult | None = None
    error: BaseException | None = None
    abort: BaseException | None = None


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
    """Writes one batch to one sink: attempts, retries, hooks, route dead letters, the mark.

    :param sink: the sink.
    :param batch: the batch as this sink sees it (its routed DataFrame).
    :param given: what the route step settled for this sink: the rows failing its route
        and their target (written at the start of each attempt, counted in the result),
        an error that fails it unwritten, a way to explain a final error.
    :param record: the ledger writer of step 6.
    :param writing: the sink's place among its batch's sinks writing at the same time,
        whose ledger marks share a commit when they finish close together.
    :param shared: the shared job writing the sink's first attempt with other sinks'
        (:mod:`fanout.steps.share`); later attempts write alone.
    """

    sink: Sink
    batch: Batch
    given: SinkInput
    record: Recorder
    retry: RetryPolicy
    hooks: HookCaller
    writing: SinkWriting = field(default_factory=lambda: WritingSinks().member())
    shared: SharedPass | None = None
    claim: WriteClaim | None = None
    """Set for a write with a timeout: once abandoned, it neither retries nor marks."""
    attempt: int = 0
    """The attempt in progress (0 before the first)."""
    _began: tuple[datetime, float] | None = field(default=None, init=False, repr=False)
    _reported: int = field(default=0, init=False, repr=False)
    """The last attempt whose failure was reported (logged, hooks, ledger row)."""
    _reporting: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def run(self) -> SinkOutcome:
        """Never raises for a sink's own failure: returns it in the outcome. A write raising
        a BaseException that is not an Exception (``KeyboardInterrupt``, ``SystemExit``,
        gevent's ``GreenletExit``) is recorded as a failed attempt, never retried, and
        returned as the outcome's ``abort``."""
        try:
            return self._run()
        finally:
            self.writing.release()

    def _run(self) -> SinkOutcome:
        info, name = self.batch.info, self.sink.name
        if self.given.blocked is not None:
            return self._refuse(self.given.blocked)
        attempt = 0
        while True:
            if self._abandoned():  # during the backoff: a new attempt would run uncancelled
                return SinkOutcome(name, error=SinkWriteError("abandoned", sink=name))
            attempt += 1
            self.attempt = attempt
            batch = replace(self.batch, attempt=attempt)
            started, clock = now_utc(), time.perf_counter()
            self._began = (started, clock)
            self.hooks.call("fanout_sink_start", info=info, sink=name, attempt=attempt)
            self.writing.start()
            try:
                check_stable_columns(self.sink, batch)  # before anything is written
                if self.given.letters and self.given.dead_letters is not None:
                    self.sink.check_replay(batch)  # before the letters: nothing written yet
                routed = self._route_dead_letters(batch)
                result = as_result(self._write(batch), self.sink)
                check_counts(result, sink=name, batch_id=info.batch_id, routed=batch.known_rows())
                if routed:
                    result = replace(
                        result,
                        dead_lettered=result.dead_lettered + routed,
                        details={**result.details, "route_dead_lettered": routed},
                    )
            except BaseException as exc:  # an interrupt too: its attempt is recorded
                self.writing.release()
                error, will_retry = self._failure(exc, attempt)
                if self._abandoned() or not self._report(attempt):  # timed_out() reported it
                    self._failed_abandoned(attempt, error)
                else:
                    self._failed(attempt, started, clock, error, will_retry)
                if not will_retry or self._abandoned():
                    abort = None if isinstance(exc, Exception) else exc
                    return SinkOutcome(name, error=error, abort=abort)
                time.sleep(self.retry.delay(attempt))
                continue
            duration = time.perf_counter() - clock
            if self.claim is not None and not self.claim.mark():  # the batch went on without it
                return SinkOutcome(name, error=SinkWriteError("abandoned", sink=name))
            self.hooks.call(
                "fanout_sink_done", info=info, sink=name, result=result, duration_s=duration
            )
            try:
                self.record.committed(self.batch, attempt, started, duration, result, self.writing)
            except CheckpointError as exc:  # marked, of an epoch a reset replaced
                log.error("%s", exc, extra=batch_fields(info.pipeline, info.batch_id, name))
                return SinkOutcome(name, error=exc)
            except Exception as exc:
                error = exc if isinstance(exc, LedgerError) else LedgerError(str(exc))
                # the store's error may name the ledger's location, password and all
                masked = masked_error(
                    error, (), LedgerError, str(error), others=self.record.secrets
                )
                error = error if masked is None else masked
                log.error(
                    "pipeline %s, batch %s, sink %s: written but the ledger mark failed (%s); "
                    "the sink will be written again on replay",
                    info.pipeline,
                    info.batch_id,
                    name,
                    error,
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

    def _abandoned(self) -> bool:
        return self.claim is not None and self.claim.abandoned

    def _failed_abandoned(self, attempt: int, error: BaseException) -> None:
        """An attempt of a write the batch went on without failed: the batch was reported
        (:meth:`timed_out` recorded the attempt, and called the hooks), so no hook hears of
        it (observers would see the batch's sink fail after the batch ended): logged at
        debug only."""
        info = self.batch.info
        log.debug(
            "pipeline %s, batch %s, sink %s: attempt %s of its abandoned write failed: %s",
            info.pipeline, info.batch_id, self.sink.name, attempt, error,
            extra=batch_fields(info.pipeline, info.batch_id, self.sink.name, attempt=attempt),
        )  # fmt: skip

    def timed_out(self, error: Exception) -> None:
        """The batch went on without this write (:mod:`fanout.steps.timeout`): log and
        record its attempt in progress as failed with ``error``. Between two attempts (a
        retry's backoff) none is in progress: the last one's failure is recorded already
        (the ledger holds one row per attempt), so the timeout is only logged."""
        attempt = max(self.attempt, 1)
        if self._report(attempt):
            started, clock = self._began or (now_utc(), time.perf_counter())
            self._failed(attempt, started, clock, error, False)
            return
        info = self.batch.info
        log.warning(
            "pipeline %s, batch %s, sink %s: abandoned while waiting to retry (attempt %s "
            "failed, recorded): %s",
            info.pipeline, info.batch_id, self.sink.name, attempt, error,
            extra=batch_fields(info.pipeline, info.batch_id, self.sink.name, attempt=attempt),
        )  # fmt: skip

    def _report(self, attempt: int) -> bool:
        """Whether ``attempt``'s failure is still to be reported (then it is, by the
        caller): the write's thread and the batch abandoning it may both try."""
        with self._reporting:
            if attempt <= self._reported:
                return False
            self._reported = attempt
            return True

    def _failure(self, exc: BaseException, attempt: int) -> tuple[Exception, bool]:
        """The error to record for ``exc`` (naming sink and batch, secrets masked) and
        whether to retry: never for a BaseException that is not an Exception."""
        error = _named(
            exc, self.sink.name, self.batch.batch_id, self.sink.secret_values(), self.record.secrets
        )
        if not isinstance(exc, Exception):
            return error, False
        # a sink reporting impossible counts would report them again
        retried = not isinstance(exc, SinkResultError) and self._transient(exc)
        will_retry = retried and attempt <= self.retry.retries
        if not will_retry and self.given.explain is not None:
            explained = self.given.explain(exc)
            if explained is not None:
                # chained from the sink's error as recorded (named, secrets masked, its own
                # chain cut when it held one), not from ``exc``: a traceback shows the chain
                explained.__cause__ = error
                error = explained
        return error, will_retry

    def _write(self, batch: Batch) -> object:
        if self.shared is not None and batch.attempt == 1:
            return self.shared.write(self.sink.name)
        return self.sink.write(batch)

    def _refuse(self, error: Exception) -> SinkOutcome:
        """Fail the sink without writing it (an error found before any write)."""
        info, name = self.batch.info, self.sink.name
        self.hooks.call("fanout_sink_start", info=info, sink=name, attempt=1)
        error = _named(error, name, info.batch_id, self.sink.secret_values(), self.record.secrets)
        if self._report(1):
            self._failed(1, now_utc(), time.perf_counter(), error, will_retry=False)
        return SinkOutcome(name, error=error)

    def _route_dead_letters(self, batch: Batch) -> int:
        """Write the rows that failed the route to the sink's dead-letter target (once per
        batch: the writer is idempotent), with the route that chose them; return how many
        the batch has. Raises :class:`fanout.RouteError` before any write when the target
        holds the batch's letters of another route (:mod:`fanout.deadletters.route_letters`).
        """
        letters, target, route = self.given.letters, self.given.dead_letters, self.given.route
        if target is None or (route is None and not letters):
            return 0
        if letters:  # Spark's error may quote a value that is a secret of the pipeline
            mask = SinkSecrets(tuple(self.sink.secret_values()), self.record.secrets).mask
            letters = tuple(replace(letter, reason=mask(letter.reason)) for letter in letters)
        count = write_letters(target, batch, letters, source="route", route=route)
        if not count:
            return 0
        log.warning(
            "pipeline %s, batch %s, sink %s: %s row(s) failing its route went to its "
            "dead-letter target; first: %s",
            batch.pipeline,
            batch.batch_id,
            self.sink.name,
            count,
            letters[0].reason,
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
        self.record.failed(self.batch, attempt, started, time.perf_counter() - clock, error)


def check_stable_columns(sink: Sink, batch: Batch) -> None:
    """Refuse a batch computing the columns ``sink.deterministic_columns()`` names (an
    upsert's keys) non-deterministically, in the routed batch or its streaming query, with a
    :class:`fanout.PartitioningError`. A sink on the partitioned-sink kit checks its own
    batches (:class:`fanout.partitioned.sink.PartitionedSink`); any other sink that names
    such columns is checked here, once per query run, as the kit would."""
    if isinstance(sink, PartitionedSink):
        return
    stable = sink.deterministic_columns()
    if stable is not None:
        check_batch(batch.df, stable, sink=sink.name, batch_id=batch.batch_id,
                    query_id=batch.query_id)  # fmt: skip


def _cut_cause_loop(exc: BaseException) -> None:
    """Cut a loop in ``exc``'s ``__cause__`` chain (a sink's ``raise error from error``
    makes an error its own cause) where it closes: the ``BatchFailedError`` chained to it
    would send the usual root-cause loop (``while e.__cause__: e = e.__cause__``) round
    forever. Only a failed write pays for the walk."""
    seen = {id(exc)}
    current = exc
    while current.__cause__ is not None:
        if id(current.__cause__) in seen:
            current.__cause__ = None
            return
        seen.add(id(current.__cause__))
        current = current.__cause__


def _named(
    exc: BaseException, sink: str, batch_id: int, own: Sequence[str], others: Sequence[str] = ()
) -> Exception:
    """The sink's error, wrapped to name sink and batch unless it already does (a
    :class:`fanout.CheckpointError` a sink raised names them, and keeps its class).

    When any message in the error's chain holds one of ``own`` (the sink's secrets) or of
    ``others`` (the rest of its pipeline's: a sink's error may quote another's password or a
    location's), where :func:`fanout.observe.secrets.redact_apart` masks them, the result
    is a new error with them masked and the chain cut, so no traceback shows them.
    """
    _cut_cause_loop(exc)
    masked = masked_error(
        exc, own, lambda text: SinkWriteError(text, sink=sink, batch_id=batch_id), others=others
    )
    if masked is not None:
        return masked
    if isinstance(exc, SinkError | CheckpointError):
        return exc
    wrapped = SinkWriteError(f"{type(exc).__name__}: {exc}", sink=sink, batch_id=batch_id)
    wrapped.__cause__ = exc
    return wrapped
