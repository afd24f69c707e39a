"""The catch-up: writes each lagging sink's missed batches, in batch order, beside the live
batches (docs/architecture.md §14.4).

One daemon thread per :class:`fanout.FanOut` takes the lagging sinks in turn. For a sink it
reads the oldest batch the sink still needs (from the spool, or from its backfill source)
and writes it through the same :class:`fanout.steps.write.SinkRunner` a live batch uses:
the same transaction ids, the same route and dead letters, the same ledger mark. A sink
whose write fails is probed again only after ``probe_interval_s`` (a circuit breaker), so a
sink that is down costs one attempt per interval, never the live batches' time.

Each sink has a lock, one per pipeline, ledger and sink in the process
(:class:`fanout.steps.catchup_writers.SinkWriter`): the live path's bounded drain
(:meth:`CatchUp.drain`, when a sink's backlog reaches its ``max_lag``), the thread, the
final catch-up and the catch-up of a later ``FanOut`` of the pipeline in the same process
(whose thread an earlier one's write may outlive) never write one sink at once.

What a catch-up write reads (the spool, or the sink's backfill source, checked against the
source's ledger mark): :mod:`fanout.steps.catchup_read`. Its notes before a write a crash
could leave unmarked, and its questions to the sink where one is found:
:mod:`fanout.steps.catchup_notes`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.locations import command_location
from fanout.errors import (
    MissedBatchesError,
    RenamedSinkError,
    SinkTimeoutError,
    TargetLostError,
)
from fanout.hooks.caller import HookCaller
from fanout.ledger.entry import ledger_key, now_utc
from fanout.observe.logs import batch_fields
from fanout.retry import RetryPolicy
from fanout.routes.batch_routes import BatchRoutes, EarlierOf, TargetOf
from fanout.sink_spec import SinkSpec, write_timeout
from fanout.spool.index import BatchKey
from fanout.steps.catchup_notes import ReplayNotes
from fanout.steps.catchup_read import CatchUpReader
from fanout.steps.catchup_writers import registry_lock, sink_writer
from fanout.steps.lag import Backlog, Lagging
from fanout.steps.record import Recorder
from fanout.steps.replay_lag import SpooledReplays
from fanout.steps.timeout import AbandonedWrite, AbandonedWrites, TimedWrite
from fanout.steps.write import SinkOutcome, SinkRunner, run_timed

log = logging.getLogger("fanout")

ONE_ATTEMPT = RetryPolicy(retries=0)
"""A catch-up write is tried once per probe: the probe interval is its backoff."""


class CatchUp:
    """Writes lagging sinks' missed batches in order, in a background thread.

    :param lagging: the lag state (backlogs, marks).
    :param specs: every sink's spec.
    :param record: the ledger writer.
    :param hooks: observers (they see catch-up writes as sink attempts of the old batch).
    :param target_of: a sink's dead-letter target.
    :param spark: the session that reads the spool.
    :param probe_interval_s: how long a sink that failed waits before the next attempt.
    :param ledger_location: where the ledger is, for the messages.
    :param pipeline_file: the pipeline file (absolute), for the commands the messages name.
    :param abandoned: the live writes abandoned at their ``write_timeout_s`` still running:
        their sink is not written while one runs (:mod:`fanout.steps.timeout`).
    :param earlier_of: what a sink's earlier dead-letter targets hold of a batch
        (:mod:`fanout.deadletters.moved`).
    :param replays: asks a sink about a batch spooled for it from a replay before it is
        written (:mod:`fanout.steps.replay_lag`); ``None``: not asked.
    """

    def __init__(
        self,
        lagging: Lagging,
        specs: Mapping[str, SinkSpec],
        record: Recorder,
        hooks: HookCaller,
        target_of: TargetOf,
        spark: Any,
        probe_interval_s: float,
        ledger_location: str,
        *,
        pipeline_file: str | None = None,
        abandoned: AbandonedWrites | None = None,
        earlier_of: EarlierOf | None = None,
        replays: SpooledReplays | None = None,
    ) -> None:
        self.lagging = lagging
        self.earlier_of = earlier_of
        self.abandoned = abandoned
        self.ledger_location = ledger_location
        self.pipeline_file = pipeline_file
        self.specs = specs
        self.record = record
        self.hooks = hooks
        self.target_of = target_of
        self.spark = spark
        self.probe_interval_s = probe_interval_s
        # the reader holds these same objects: none is reassigned after the start (a new
        # session or ledger means a new FanOut, so a new CatchUp)
        self._reader = CatchUpReader(lagging, specs, target_of, spark, ledger_location)
        self._writers = {
            name: sink_writer(lagging.pipeline, ledger_key(lagging.ledger), name)
            for name in lagging.sinks
        }
        self._locks = {name: writer.lock for name, writer in self._writers.items()}
        self._told_waiting: set[tuple[str, BatchKey]] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._left: threading.Thread | None = None  # stopped while in a write it runs on
        self._runner: threading.Thread | None = None  # the thread, once started
        self._starting = threading.Lock()
        self._token = object()  # this catch-up, as SinkWriter.last names it
        self._waiting: set[tuple[str, BatchKey]] = set()
        self._timed_out: dict[str, int] = {}  # catch-up writes abandoned in a row, by sink
        self._timed: dict[str, TimedWrite] = {}  # bounded catch-up writes waited for, by sink
        self._told_lost: set[str] = set()  # sinks whose lost target the ledger was told of
        self._notes = ReplayNotes(lagging, specs, replays, self._record_lost, self._not_caught_up)

    # -- the thread ------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (once, and never after :meth:`stop`); it sleeps while no sink
        is behind. Called with each batch, and before the first one by
        :meth:`fanout.FanOut.start_catch_up`."""
        with self._starting:  # the query's start and its first batch may both start it
            if self._thread is None and self.lagging.sinks and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=f"fanout-{self.lagging.pipeline}-catchup", daemon=True
                )
                self._runner = self._thread
                self._thread.start()

    def take_over(self) -> None:
        """Become the pipeline's catch-up in this process for its ledger (however spelled:
        :func:`fanout.ledger.entry.ledger_key`), stopping the one before it: a ``FanOut``
        of the same pipeline that was not closed (a notebook's re-run cell, a restarted
        query) would otherwise go on writing and releasing the spool beside this one."""
        key = (self.lagging.pipeline, ledger_key(self.lagging.ledger))
        with registry_lock:
            previous = _current.get(key)
            _current[key] = self
        if previous is not None and previous is not self and not previous._stop.is_set():
            log.warning(
                "pipeline %s: a FanOut of this pipeline (ledger %s) was not closed; stopping "
                "its catch-up: the new FanOut's catch-up takes over",
                self.lagging.pipeline,
                self.ledger_location,
            )
            previous.stop()
        for sink in self.lagging.sinks:  # said now, at the start, not at the first wait
            self._tell_waiting(sink)

    def wake(self) -> None:
        """A batch was spooled or a sink fell behind: look again now."""
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread after the write it is doing (the batch's mark included). A
        write of a sink with ``write_timeout_s`` still running after ``timeout_s`` (its
        bound may be longer) is abandoned, as at its timeout: :meth:`fanout.FanOut.close`
        then waits for it as for the others, and leaves its sink open."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join(timeout_s)
        if thread.is_alive():  # in a write bounded beyond this wait: left running, it must
            for timed in list(self._timed.values()):  # be known as abandoned, kept till it ends
                timed.give_up(reason="stopping")
            self._left = thread

    def left_writing(self) -> tuple[threading.Thread, dict[str, BatchKey]] | None:
        """After :meth:`stop`: the thread it did not wait out and the sinks it is still
        writing (an unbounded write, of a sink without ``write_timeout_s``), each with the
        batch it writes, whose ``close()`` must wait for that write
        (:meth:`fanout.FanOut.close`); ``None`` when the thread has ended or writes none."""
        thread = self._left
        if thread is None or not thread.is_alive():
            return None
        sinks = {
            s: key
            for s, w in self._writers.items()
            if (key := w.writing) is not None
            and w.last is self._token
            and write_timeout(self.specs[s]) is None
        }  # a bounded write was given up at the stop: kept as abandoned (AbandonedWrites)
        return (thread, sinks) if sinks else None

    def _run(self) -> None:
        while not self._stop.is_set():
            progressed = False
            try:
                for sink in self.lagging.sinks:
                    if self._stop.is_set():
                        break
                    if time.monotonic() < self.lagging.retry_at(sink, self.probe_interval_s):
                        continue  # the circuit is open: it failed less than an interval ago
                    progressed |= self.step(sink)
                if progressed and not self._stop.is_set():  # stopped: the FanOut taking
                    self.lagging.release_held()  # over releases (two at once: a conflict)
            except BaseException:  # never let the thread die (a SystemExit would, silently)
                log.exception("pipeline %s: the catch-up failed; retrying", self.lagging.pipeline)
                progressed = False
            if not progressed:
                self._wake.wait(self._sleep())
                self._wake.clear()

    def _sleep(self) -> float:
        now = time.monotonic()
        due = [self.lagging.retry_at(s, self.probe_interval_s) for s in self.lagging.sinks]
        return max(0.05, min([self.probe_interval_s, *(t - now for t in due if t > now)]))

    # -- one sink --------------------------------------------------------------------

    def step(self, sink: str) -> bool:
        """Write ``sink``'s oldest missed batch, if any; ``True`` when one was written. A
        write raising an interrupt or an exit is a failure like any other here: recorded,
        the sink tried again after its probe interval (the thread must live on)."""
        lock = self._locks[sink]
        if not lock.acquire(blocking=False):
            self._tell_waiting(sink)
            return False  # the live path is draining it, or an earlier catch-up writes it
        try:
            return self._write_next(sink) is True
        finally:
            lock.release()

    def drain(
        self, sink: str, until: Callable[[], bool], *, live: bool = False
    ) -> BaseException | None:
        """Write ``sink``'s missed batches now, in this thread, until ``until()`` holds or
        it has none; return the error that stopped it (``None``: done). Used by the live
        path when a sink reaches its ``max_lag``. A write raising a BaseException that is not
        an Exception (an interrupt, an exit) is recorded, then raised on in this thread.

        A sink with ``write_timeout_s`` is waited for at most that long while the catch-up
        thread writes it (its own bound may be up to 64 times longer): its write is then
        abandoned, as a live write would be, and the drain goes on by its own rules (it
        waits that long again for the abandoned write to end, then writes the batch).
        ``live``: a live batch waits for this drain (at its ``max_lag``): its writes are
        bounded by the sink's ``write_timeout_s`` itself, not the catch-up's doubled bound."""
        if not self._lock_for_drain(sink, None if live else until):
            return None  # ``until()`` held while another write of the sink ran
        try:
            while not until():
                outcome = self._write_next(sink, wait=True, live=live)
                if outcome is None:
                    return None
                if not isinstance(outcome, BaseException):
                    continue
                if not isinstance(outcome, Exception):
                    raise outcome
                return outcome
        finally:
            self._locks[sink].release()
        return None

    def _lock_for_drain(self, sink: str, until: Callable[[], bool] | None) -> bool:
        """Take ``sink``'s lock for a drain (``True``), or ``False`` once ``until()`` holds
        first (a ``catch_up(timeout_s)`` past its bound, a final catch-up stopped by a
        signal: a write of the sink without ``write_timeout_s`` holding the lock, an
        earlier ``FanOut``'s left running at its ``close()``, may never end; ``None``, a
        live batch's drain at its ``max_lag``: not asked, its ``until`` reads the backlog);
        after the sink's ``write_timeout_s``, give up the catch-up write holding it (a
        hung sink would otherwise stall the live batch for the catch-up's whole bound).
        Uncontended: one ``acquire``, ``until`` not called."""
        lock, timeout = self._locks[sink], write_timeout(self.specs[sink])
        if lock.acquire(blocking=False):
            return True
        self._tell_waiting(sink)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not lock.acquire(timeout=0.05):
            if until is not None and until():
                return False
            if deadline is not None and time.monotonic() >= deadline:
                if (timed := self._timed.get(sink)) is not None:
                    timed.give_up(reason="draining")  # idempotent; None: marking, waited for
        return True

    def finish(
        self, sink: str, policy: RetryPolicy, stop: Callable[[], bool]
    ) -> BaseException | None:
        """The final catch-up of ``sink`` once the query has ended: its missed batches now,
        in this thread, in order (as :meth:`drain`), whatever its probe interval. A write
        that fails is tried again after ``policy``'s backoff, up to ``policy.retries`` more
        times in all; ``stop()`` ends it after the write in progress. Returns the error
        that stopped it (``None``: it has no batch left, or ``stop()`` held first); one
        that waits for the operator (:meth:`fanout.steps.lag.Lagging.stuck`) is not tried
        again."""
        error: BaseException | None = None
        for attempt in range(policy.retries + 1):
            if attempt and not _wait(policy.delay(attempt), stop):
                break
            error = self.drain(sink, until=stop)
            if error is None or self.lagging.stuck(sink):
                return error  # done, or waiting for the operator: no retry helps
        return error

    def _write_next(
        self, sink: str, *, wait: bool = False, live: bool = False
    ) -> bool | BaseException | None:
        """Write the oldest batch ``sink`` needs: ``True`` (written), the error, or
        ``None`` when it needs none. ``wait``: in the caller's thread (a drain), a write
        of the sink abandoned at its ``write_timeout_s`` and still running (its Spark jobs
        cancelled, it usually ends soon) is waited for up to that timeout first."""
        backlog = self.lagging.backlog(sink)
        if not backlog:
            return None  # a backfill is finished only at a batch's start (hold_back)
        running = None if self.abandoned is None else self.abandoned.running(sink)
        if running is not None and wait:  # the sink's own timeout, not a catch-up's bound
            running.done.wait(write_timeout(self.specs[sink]) or running.timeout_s)
            running = self.abandoned.running(sink) if self.abandoned is not None else None
        if running is not None:  # it may still commit: write the sink once it has ended
            return self._wait_for_abandoned(running)
        if not self.lagging.settled(backlog.keys[0]):
            self._wait_for_settling(sink, backlog.keys[0])
            return None  # not an error: its replay settles it, and wakes the thread
        gap = self._gap_before(sink, backlog.keys[0])
        if gap is not None:
            self.lagging.failed(sink, gap)
            log.error("%s", gap, extra=batch_fields(self.lagging.pipeline, gap.batch_id, sink))
            return gap
        writer = self._writers[sink]  # under its lock: one catch-up write of it at a time
        if writer.last is not None and writer.last is not self._token:
            backlog = self._marked_by_another(sink, backlog)
            if not backlog:
                return None
        if self._stop.is_set() and threading.current_thread() is self._runner:
            return None  # the thread, stopped: close() may be closing the sink now
        # ``last`` first: a drain reads them unlocked (_tell_waiting), and ``writing`` set
        # while ``last`` still names no catch-up or an earlier one is another's write
        writer.last, writer.since, writer.writing = self._token, time.monotonic(), backlog.keys[0]
        try:
            error = self.write(sink, backlog.keys[0], live=live, wait=wait)
        finally:
            writer.writing = None
        return True if error is None else error

    def _marked_by_another(self, sink: str, backlog: Backlog) -> Backlog:
        """``sink``'s backlog once its marks are read again from the ledger: another
        catch-up of the pipeline in this process (an earlier ``FanOut``'s) wrote the sink
        since this one last did, and marked batches this one's cache still counts. One
        ledger lookup per epoch of the backlog, only then: never on the common path."""
        try:
            for epoch in sorted({key[0] for key in backlog.keys}):
                fresh = self.lagging.ledger.last_committed(self.lagging.pipeline, [sink], epoch)
                self.lagging.saw_marks(epoch, fresh)
        except Exception as exc:  # the write finds the batch written by its idempotency
            log.warning(
                "pipeline %s, sink %s: cannot read the sink's marks again after another "
                "catch-up wrote it: %s", self.lagging.pipeline, sink, exc,
                extra=batch_fields(self.lagging.pipeline, sink=sink),
            )  # fmt: skip
            return backlog
        return self.lagging.backlog(sink)

    def _tell_waiting(self, sink: str) -> None:
        """Say once per (sink, batch) that ``sink`` waits for another catch-up's write of
        it in this process (an earlier ``FanOut``'s, whose ``stop()`` did not wait it out):
        at :meth:`take_over` (the new ``FanOut``'s start), else at the first wait for it.
        What it blocks, and, for a sink without ``write_timeout_s`` (whose write may never
        return: Python cannot stop a thread), how to bound it and how to free the sink."""
        writer = self._writers[sink]
        key, since = writer.writing, writer.since
        if key is None or writer.last is self._token:
            return  # between two writes, or this catch-up's own write (the thread's)
        with registry_lock:
            if (sink, key) in self._told_waiting:
                return
            self._told_waiting.add((sink, key))
        timeout = write_timeout(self.specs[sink])
        way = (
            f"it is abandoned at the sink's write_timeout_s={timeout:g} s"
            if timeout is not None
            else "the sink has no write_timeout_s, so a write that never returns holds it "
            "for the life of this process (a thread cannot be stopped): to free it, end "
            "this process (the next run catches the sink up); to bound such a write, "
            f"set write_timeout_s on sink {sink!r}"
        )
        log.warning(
            "pipeline %s, batch %s, sink %s: an earlier FanOut of the pipeline in this process "
            "(closed or replaced while its catch-up wrote) is still writing batch %s (epoch "
            "%s) to the sink, for %.0f s now: this FanOut never writes the sink beside it, "
            "so it catches the sink up only once that write ends, and a live batch that "
            "brings the sink to its max_lag waits for it; %s",
            self.lagging.pipeline, key[1], sink, key[1], key[0], time.monotonic() - since, way,
            extra=batch_fields(self.lagging.pipeline, key[1], sink),
        )  # fmt: skip

    def writing(self, sink: str) -> bool:
        """Whether a catch-up write of ``sink`` runs now (the thread's, or a drain's). The
        live path holds such a sink back although its backlog is empty: another process
        (a ``fanout ledger skip``) moved its mark past the batch being written, and a live
        write beside it would reach the sink first (docs/architecture.md §14.4)."""
        return self._writers[sink].writing is not None

    def _wait_for_abandoned(self, running: AbandonedWrite) -> SinkTimeoutError:
        """The error of a catch-up of a sink whose abandoned live write still runs (said
        once per write in the log)."""
        error = running.still_running()
        if not running.told:
            running.told = True
            log.info(
                "pipeline %s, batch %s, sink %s: not caught up yet: %s",
                self.lagging.pipeline, running.key[1], running.sink, error,
                extra=batch_fields(self.lagging.pipeline, running.key[1], running.sink),
            )  # fmt: skip
        return error

    def _wait_for_settling(self, sink: str, key: BatchKey) -> None:
        """Say once per (sink, batch) that ``sink``'s next batch waits for Spark to settle
        it (:meth:`fanout.steps.lag.Lagging.settled`)."""
        with registry_lock:
            if (sink, key) in self._waiting:
                return
            self._waiting.add((sink, key))
        log.info(
            "pipeline %s, batch %s, sink %s: not caught up yet: Spark has not committed the "
            "batch (a sink without on_failure='lag' has not written it); its replay will",
            self.lagging.pipeline, key[1], sink,
            extra=batch_fields(self.lagging.pipeline, key[1], sink),
        )  # fmt: skip

    def _gap_before(self, sink: str, key: BatchKey) -> MissedBatchesError | None:
        """The refusal of writing ``sink`` its oldest needed batch ``key`` past batches of
        its epoch it never received, which nothing holds for it (the live path refuses such
        a gap at a live batch's start; a run with no batch, or a backlog with a hole, would
        otherwise write past it). The mark is read again from the ledger first: another
        instance may have moved it."""
        epoch, batch_id = key
        mark = self.lagging.mark(sink, epoch)
        if mark is None or batch_id <= mark + 1:
            return None
        fresh = self.lagging.ledger.last_committed(self.lagging.pipeline, [sink], epoch)
        self.lagging.saw_marks(epoch, fresh)
        backlog = self.lagging.backlog(sink)
        mark = self.lagging.mark(sink, epoch)
        if not backlog or backlog.keys[0] != key or mark is None or batch_id <= mark + 1:
            return None
        spool = self.lagging.spool
        return MissedBatchesError(
            self.lagging.pipeline, sink, epoch, mark, batch_id,
            list(range(mark + 1, batch_id)), self.ledger_location,
            backfill_from=self.specs[sink].lag.backfill_from,
            spool=None if spool is None else command_location(spool.path), caught_up=True,
            config=self.pipeline_file,
        )  # fmt: skip

    def write(
        self, sink: str, key: BatchKey, *, live: bool = False, wait: bool = True
    ) -> BaseException | None:
        """Write batch ``key`` to ``sink`` and mark it; return the failure, if any (what the
        write raised, unchanged, when it is not an Exception; else the named error).
        ``live``: a live batch waits for it (:meth:`drain`). ``wait``: for a reopen of
        the sink without ``write_timeout_s`` still running (the thread does not: one
        whose check hangs would stall every other sink's catch-up; it is woken when the
        reopen ends)."""
        spec = self.specs[sink]
        unopened = self.lagging.reopen(sink, wait=wait)
        if unopened is not None:
            if isinstance(unopened, TargetLostError | RenamedSinkError):  # its reopen's check
                self._record_lost(sink, key, unopened)
            return unopened
        refused = self._notes.refused_replay(sink, key)
        if refused is not None:
            return refused
        try:
            df, info = self._reader.read(sink, key)
        except Exception as exc:
            if self._moved_past(sink, key):
                return None
            return self._not_caught_up(sink, key, exc, "cannot read the batch to catch up")
        unnoted = self._notes.note_write(sink, key, info)
        if unnoted is not None:
            return unnoted
        routes = BatchRoutes.prepare(
            df, info, {sink: spec}, [sink], self.target_of,
            lambda name: not self.record.marked_here(name, info.epoch), self.earlier_of,
        )  # fmt: skip
        try:
            given = routes.input_for(sink)
            batch = Batch(
                given.df, info, sink, txn_app_id(info.pipeline, sink, info.epoch),
                route=given.stamp(spec.route), earlier=given.earlier, _arrow=given.arrow,
            )  # fmt: skip
            runner = SinkRunner(spec.sink, batch, given, self.record, ONE_ATTEMPT, self.hooks)
            outcome = self._run_write(runner, sink, given.df, live)
        finally:
            routes.release()
        if outcome.error is not None:
            if outcome.abort is None and self._moved_past(sink, key):
                return None
            self.lagging.failed(sink, outcome.error)
            return outcome.error if outcome.abort is None else outcome.abort
        self.lagging.committed(sink, key, caught_up=True)
        self._notes.marked(sink, key)
        log.info(
            "pipeline %s, batch %s, sink %s: caught up (%s rows)",
            info.pipeline, info.batch_id, sink,
            outcome.result.rows if outcome.result else 0,
            extra=batch_fields(info.pipeline, info.batch_id, sink),
        )  # fmt: skip
        return None

    def _not_caught_up(
        self, sink: str, key: BatchKey, exc: Exception, what: str = "not caught up"
    ) -> Exception:
        """``sink``'s catch-up of batch ``key`` failed before its write began (``exc``: its
        read, its note): recorded and logged (``what`` heads the line), returned."""
        self.lagging.failed(sink, exc)
        log.error(
            "pipeline %s, batch %s, sink %s: %s: %s",
            self.lagging.pipeline, key[1], sink, what, exc,
            extra=batch_fields(self.lagging.pipeline, key[1], sink),
        )  # fmt: skip
        return exc

    def _moved_past(self, sink: str, key: BatchKey) -> bool:
        """Whether ``sink``'s mark, read again from the ledger after its catch-up of batch
        ``key`` failed, holds the batch now: another process moved it past (an operator's
        ``fanout ledger skip``, whose ``--release-spooled`` deletes the batch's spooled
        files at once, maybe while this catch-up reads them). The batch is then dropped,
        not failed: this instance's view of the mark is what its last live batch read,
        and with no live batch (a source with no new data, the final catch-up) it would
        fail the sink at each probe for batches the operator gave up. One ledger lookup,
        on a failed catch-up only (docs/architecture.md §14.4)."""
        epoch, batch_id = key
        try:
            fresh = self.lagging.ledger.last_committed(self.lagging.pipeline, [sink], epoch)
        except Exception as exc:  # the failure stands as it is; the ledger's is logged
            log.warning(
                "pipeline %s, batch %s, sink %s: cannot read the sink's mark again: %s",
                self.lagging.pipeline, batch_id, sink, exc,
                extra=batch_fields(self.lagging.pipeline, batch_id, sink),
            )  # fmt: skip
            return False
        self.lagging.saw_marks(epoch, fresh)
        if self.lagging.needs(sink, key):
            return False
        log.info(
            "pipeline %s, batch %s, sink %s: not caught up: its mark moved to batch %s "
            "meanwhile (another process: a `fanout ledger skip`), which holds this batch",
            self.lagging.pipeline, batch_id, sink, fresh.get(sink),
            extra=batch_fields(self.lagging.pipeline, batch_id, sink),
        )  # fmt: skip
        return True

    def _record_lost(
        self,
        sink: str,
        key: BatchKey,
        error: TargetLostError | RenamedSinkError,
        info: BatchInfo | None = None,
    ) -> None:
        """Record, once per run, the refused catch-up of ``sink`` (its target lost, or it
        was found renamed: its reopen's check; or a noted batch it cannot tell it holds:
        :class:`fanout.steps.catchup_notes.ReplayNotes`) as a failed attempt of its next
        batch ``key``: ``fanout status`` shows it, with the ways on, also when no live
        batch runs.
        ``info``: the batch's context when known (a backfilled batch's, from its source's
        mark); else the spool's, or the bare batch."""
        with registry_lock:
            if sink in self._told_lost:
                return
            self._told_lost.add(sink)
        if info is None:
            spooled = None if self.lagging.spool is None else self.lagging.spool.get(key)
            info = (
                spooled.info()
                if spooled is not None
                else BatchInfo(self.lagging.pipeline, key[1], epoch=key[0])
            )
        batch = Batch(None, info, sink, txn_app_id(info.pipeline, sink, info.epoch))
        self.record.failed(batch, 1, now_utc(), 0.0, error)

    def _run_write(self, runner: SinkRunner, sink: str, df: Any, live: bool) -> SinkOutcome:
        """Run the catch-up write; that of a sink with ``write_timeout_s`` is bounded too (a
        hung one would keep the sink's lock, which a max_lag drain and the final catch-up
        wait for, and its stuck tasks the executors' cores), by a bound that doubles with
        each catch-up write of the sink abandoned in a row (at most 64 times the timeout):
        a cancelled write's next one may start cold (Spark's Python workers killed), and
        must not be abandoned for ever. A write a ``live`` batch waits for gets the
        sink's timeout itself."""
        timeout = write_timeout(self.specs[sink])
        if timeout is None or self.abandoned is None:
            return runner.run()
        missed = self._timed_out.get(sink, 0)
        bound = timeout if live else timeout * 2 ** min(missed, 6)

        def started(timed: TimedWrite | None) -> None:
            if timed is None:
                self._timed.pop(sink, None)
            else:
                self._timed[sink] = timed

        outcome = run_timed(runner, bound, self.abandoned, df, timeout, started)
        if isinstance(outcome.error, SinkTimeoutError) and self.abandoned.running(sink):
            self._timed_out[sink] = missed + 1
        else:
            self._timed_out.pop(sink, None)
        return outcome


def _wait(seconds: float, stop: Callable[[], bool]) -> bool:
    """Sleep ``seconds`` unless ``stop()`` holds meanwhile; whether to go on."""
    deadline = time.monotonic() + seconds
    while not stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, 0.2))
    return False


_current: weakref.WeakValueDictionary[tuple[str, str], CatchUp] = weakref.WeakValueDictionary()
"""The catch-up of each pipeline and ledger in this process (:meth:`CatchUp.take_over`),
under :data:`fanout.steps.catchup_writers.registry_lock`."""
