"""A lag sink's ``write_timeout_s`` (docs/architecture.md §14.9): its write runs in a
thread of its own; a batch that waited that long for it goes on without it.

The write is then *abandoned*, not stopped: its Spark jobs (run under a job tag of their
own) are cancelled, but Python code cannot be interrupted and may still commit to the
sink's target later. So the abandoned write never writes a ledger mark once abandoned
(:class:`WriteClaim`), and :class:`AbandonedWrites` keeps it until it ends: the catch-up
and the live path do not write that sink while it runs (two writes of one batch at once
are not safe for a sink that checks "already written?" before writing); once it has
ended, the catch-up writes the batch from the spool, and the sink's idempotency finds a
late commit there and skips it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from fanout.contract.batch import Batch, SharedArrow
from fanout.contract.sessions import ThreadWrapper, is_connect, session_of
from fanout.contract.sink import Sink
from fanout.errors import SinkTimeoutError
from fanout.observe.logs import batch_fields
from fanout.spool.index import BatchKey
from fanout.steps.cores import TASKS_END_S, running_tasks, task_budget

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("fanout")

_shared: weakref.WeakValueDictionary[tuple[str, str], AbandonedWrites] = (
    weakref.WeakValueDictionary()
)
_shared_lock = threading.Lock()

CLOSE_WAIT_S = 10.0
"""How long :meth:`fanout.FanOut.close` waits for abandoned writes still running (their
Python code, or their cancelled Spark tasks: :data:`~fanout.steps.cores.TASKS_END_S`)."""


@dataclass
class BoundedCall:
    """A call of a timed sink's (``holds_batch``, ``close``) run in a daemon thread of its
    own: ``done`` once it returned (``result``) or raised (``error``)."""

    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    @classmethod
    def run(cls, call: Callable[[], Any], timeout_s: float, name: str) -> BoundedCall:
        """Start ``call`` in a new daemon thread named ``name`` (a call that never returns
        must not keep the interpreter from exiting) and wait up to ``timeout_s`` for it."""
        bounded = cls()

        def run() -> None:
            try:
                bounded.result = call()
            except BaseException as exc:  # handed to the waiting thread
                bounded.error = exc
            finally:
                bounded.done.set()

        threading.Thread(target=run, name=name, daemon=True).start()
        bounded.done.wait(timeout_s)
        return bounded

    def outcome(self) -> Any:
        """What the call returned, or raise what it raised (it must be done)."""
        if self.error is not None:
            raise self.error
        return self.result


class WriteClaim:
    """Who ends a timed write: its own ledger mark, or the batch abandoning it. Whichever
    comes first wins, so an abandoned write never marks the batch (the catch-up's replay
    does), and a write that is marking is waited for, never abandoned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: str | None = None

    def mark(self) -> bool:
        """The write returned: may it mark the batch (it was not abandoned)?"""
        with self._lock:
            self._state = self._state or "marking"
            return self._state == "marking"

    def end(self) -> None:
        """The write returned or raised: from now on it is not abandoned (a failed write
        keeps its own error, and no ended write is waited for as still running)."""
        with self._lock:
            self._state = self._state or "ended"

    def abandon(self) -> bool:
        """The batch's wait is over: abandon the write, unless it is marking already (or
        has ended)."""
        with self._lock:
            self._state = self._state or "abandoned"
            return self._state == "abandoned"

    @property
    def abandoned(self) -> bool:
        """Whether the batch went on without this write."""
        with self._lock:
            return self._state == "abandoned"


class TimedRunner(Protocol):
    """What :class:`TimedWrite` runs: a :class:`fanout.steps.write.SinkRunner`."""

    sink: Sink
    batch: Batch
    claim: WriteClaim | None
    attempt: int

    def run(self) -> Any:
        """Write, retry, mark; return the outcome."""

    def timed_out(self, error: Exception) -> None:
        """Log and record the attempt in progress as failed with ``error``."""


@dataclass
class AbandonedWrite:
    """A write of batch ``key`` to ``sink`` that the batch went on without."""

    sink: str
    key: BatchKey
    timeout_s: float
    tag: str
    cancel: Callable[[], None]
    done: threading.Event
    returned: threading.Event = field(default_factory=threading.Event)  # its Python code
    since: float = field(default_factory=time.monotonic)
    told: bool = False  # the catch-up said once that it waits for it

    def still_running(self) -> SinkTimeoutError:
        """The error of a catch-up or live write of the sink while this one runs."""
        return SinkTimeoutError(
            f"its write of batch {self.key[1]} (epoch {self.key[0]}), abandoned after "
            f"{self.timeout_s:g} s (write_timeout_s), is still running "
            f"({time.monotonic() - self.since:.0f} s since): the sink is written again only "
            "once it has ended (two writes of one batch at once are not safe); find what "
            "holds the sink's target (a lock, a stalled connection)",
            sink=self.sink,
            batch_id=self.key[1],
        )


class AbandonedWrites:
    """The abandoned writes of one pipeline and ledger still running in this process, by
    sink (:meth:`of`: shared by every :class:`fanout.FanOut` of them).

    ``on_done`` is called (from the write's thread) when one ends: the catch-up may go on.
    """

    @classmethod
    def of(cls, pipeline: str, where: str) -> AbandonedWrites:
        """The abandoned writes of ``pipeline`` with its ledger at ``where`` in this
        process: a FanOut built after one that left a write running at ``close()`` (a
        notebook's re-run cell, a restarted query) must wait for it too, not write its
        batch beside it."""
        with _shared_lock:
            shared = _shared.get((pipeline, where))
            if shared is None:
                shared = _shared[(pipeline, where)] = cls(pipeline)
            return shared

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.on_done: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self._writes: dict[str, AbandonedWrite] = {}

    def add(self, write: AbandonedWrite) -> None:
        """Keep ``write`` until it ends."""
        with self._lock:
            self._writes[write.sink] = write

    def running(self, sink: str) -> AbandonedWrite | None:
        """``sink``'s abandoned write, while it runs (nothing to look up when none was
        ever abandoned)."""
        if not self._writes:
            return None
        with self._lock:
            write = self._writes.get(sink)
            if write is not None and write.done.is_set():
                del self._writes[sink]
                return None
            return write

    def wait(self, timeout_s: float) -> list[AbandonedWrite]:
        """Cancel the Spark jobs of every abandoned write still running again (it may have
        started more since), wait up to ``timeout_s`` for them to end, and return those
        still running."""
        with self._lock:
            writes = list(self._writes.values())
        deadline = time.monotonic() + timeout_s
        for write in writes:
            if not write.done.is_set():
                write.cancel()
        for write in writes:
            write.done.wait(max(0.0, deadline - time.monotonic()))
        return [w for w in writes if not w.done.is_set()]


class ClockedArrow(SharedArrow):
    """A timed sink's view of its batch's shared Arrow conversion: the time its write
    spends in :meth:`get` (converting, or waiting while another sink or the spool
    converts: :class:`SharedArrow` holds its lock while converting) is its input being
    prepared, not the sink's own work, so :class:`TimedWrite` stops its clock meanwhile.
    """

    def __init__(self, shared: SharedArrow, paused: Callable[[], Any]) -> None:
        self._shared = shared
        self._paused = paused

    def get(self) -> pa.Table:
        """The batch's Arrow table, its clock stopped while it is converted."""
        with self._paused():
            return self._shared.get()

    def converted_rows(self) -> int | None:
        """As :meth:`SharedArrow.converted_rows`."""
        return self._shared.converted_rows()

    def release(self) -> None:
        """As :meth:`SharedArrow.release`."""
        self._shared.release()


@dataclass
class TimedWrite:
    """One sink's write of one batch in a thread of its own, waited for up to its
    ``write_timeout_s`` (counted from its start, all attempts together, but for the time
    its input takes to be ready: :class:`ClockedArrow`)."""

    runner: TimedRunner
    timeout_s: float
    abandoned: AbandonedWrites
    future: Future[Any] = field(default_factory=Future)
    done: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    tag: str = ""
    session: Any = None
    configured_s: float | None = None  # the sink's write_timeout_s, when not timeout_s
    ended: threading.Event = field(default_factory=threading.Event)  # returned, or given up
    returned: threading.Event = field(default_factory=threading.Event)  # runner.run() did
    _giving_up: threading.Lock = field(default_factory=threading.Lock)
    _error: SinkTimeoutError | None = None
    _clock: threading.Lock = field(default_factory=threading.Lock)
    _paused_s: float = 0.0  # spent waiting for its input, not counted
    _paused_since: float | None = None

    @classmethod
    def start(
        cls,
        runner: TimedRunner,
        timeout_s: float,
        abandoned: AbandonedWrites,
        threads: ThreadWrapper,
        configured_s: float | None = None,
    ) -> TimedWrite:
        """Start ``runner`` in a new daemon thread (never a pool's: a write that never
        returns would hold the slot for good, and block the interpreter's exit), to be
        waited for ``timeout_s`` (the sink's ``configured_s`` doubled, for the catch-up)."""
        batch = runner.batch
        tag = f"fanout-{batch.pipeline}-{runner.sink.name}-{batch.info.epoch}-{batch.batch_id}"
        timed = cls(runner, timeout_s, abandoned, tag=f"{tag}-{uuid.uuid4().hex[:8]}")
        timed.configured_s = configured_s
        timed.session = session_of(batch.df)
        claim = runner.claim = WriteClaim()
        arrow, budget = batch._arrow, task_budget(timed.session)
        if arrow is not None:  # another reader's conversion is not this sink's time
            arrow = ClockedArrow(arrow, timed.paused)
        if arrow is not None or budget is not None:
            # a job started after the cancel runs uncancelled: none is, once abandoned
            runner.batch = replace(
                batch, _arrow=arrow, task_budget=budget, stopped=lambda: claim.abandoned
            )
        thread = threading.Thread(
            target=threads(timed._run),
            name=f"fanout-{batch.pipeline}-{runner.sink.name}-timed",
            daemon=True,
        )
        # the deadline acts by itself, not when the batch's thread asks for the outcome
        # after the other sinks' writes: a hung write's tasks can hold every executor
        # core, so those writes' Spark jobs would wait for it, and the batch for them
        watch = threading.Thread(
            target=timed._watch, name=f"fanout-{batch.pipeline}-{runner.sink.name}-deadline",
            daemon=True,
        )  # fmt: skip
        thread.start()
        watch.start()
        return timed

    def _watch(self) -> None:
        """Give the write up at its deadline, unless it has ended before."""
        if not self._ended_by_deadline():
            self.give_up()

    def _ended_by_deadline(self) -> bool:
        """Wait until the write ends (True) or its deadline, which moves while its input
        is prepared, has passed (False)."""
        while not self.ended.wait(max(0.0, self._deadline() - time.monotonic())):
            if time.monotonic() >= self._deadline():
                return False
        return True

    def _run(self) -> None:
        untag = self._tag()
        claim = self.runner.claim
        try:
            result = self.runner.run()
        except BaseException as exc:  # handed to the batch's thread, or logged if abandoned
            if claim is not None:
                claim.end()  # before the future: one done is never given up afterwards
            self.future.set_exception(exc)
        else:
            if claim is not None:
                claim.end()
            self.future.set_result(result)
        finally:
            self.returned.set()
            self.ended.set()
            try:
                untag()
            finally:
                claim = self.runner.claim
                abandoned = claim is not None and claim.abandoned
                if abandoned:
                    self._until_tasks_end()
                self.done.set()
                if abandoned:
                    self._ended_abandoned()

    def _until_tasks_end(self) -> None:
        """The abandoned write's cancelled job has failed, but its tasks may run on: a
        Python task stuck in a blocking call is killed only after Spark's
        ``spark.python.task.killTimeout`` (2 s), and its core is free only then (3-5 s
        after the cancel, measured on ``local[2]``). The write counts as running until they
        end (at most :data:`TASKS_END_S`), so that the catch-up's write of the sink does
        not take cores beside them."""
        deadline = time.monotonic() + TASKS_END_S
        while running_tasks(self.session, self.tag) and time.monotonic() < deadline:
            time.sleep(0.2)

    def _tag(self) -> Callable[[], None]:
        """Run this thread's Spark jobs under the write's own tag, interrupted on cancel;
        return what removes it."""
        spark = self.session
        if spark is None:
            return lambda: None
        if is_connect(spark):
            spark.addTag(self.tag)
            return lambda: spark.removeTag(self.tag)
        context = spark.sparkContext
        context.addJobTag(self.tag)
        context.setInterruptOnCancel(True)
        return lambda: context.removeJobTag(self.tag)

    def cancel(self) -> None:
        """Cancel the Spark jobs running under the write's tag (interrupting their tasks);
        what the write does in Python goes on."""
        spark = self.session
        if spark is None:
            return
        try:
            if is_connect(spark):
                spark.interruptTag(self.tag)
            else:
                spark.sparkContext.cancelJobsWithTag(self.tag)
        except Exception as exc:  # the session may be stopping: the write goes on, waited for
            batch = self.runner.batch
            log.warning(
                "pipeline %s, batch %s, sink %s: cannot cancel the Spark jobs of its abandoned "
                "write (tag %s): %s",
                batch.pipeline, batch.batch_id, self.runner.sink.name, self.tag, exc,
                extra=batch_fields(batch.pipeline, batch.batch_id, self.runner.sink.name),
            )  # fmt: skip

    def outcome(self) -> Any:
        """What the runner returned, or, once ``write_timeout_s`` has passed since it
        started (or :meth:`give_up` was called), the sink's :class:`fanout.SinkTimeoutError`:
        the write is abandoned (its Spark jobs cancelled, kept in :class:`AbandonedWrites`
        until it ends)."""
        self._ended_by_deadline()
        if self.future.done() and self._error is None:  # returned, not given up first
            return self.future.result()
        error = self.give_up()
        return self.future.result() if error is None else error

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop the write's clock while its input is prepared (nested calls do not
        occur: one thread writes)."""
        with self._clock:
            self._paused_since = time.monotonic()
        try:
            yield
        finally:
            with self._clock:
                if self._paused_since is not None:
                    self._paused_s += time.monotonic() - self._paused_since
                self._paused_since = None

    def _deadline(self) -> float:
        """When the write's time is up: its start, plus its timeout, plus the time it
        spent (or spends now) waiting for its input."""
        with self._clock:
            paused = self._paused_s
            if self._paused_since is not None:
                paused += time.monotonic() - self._paused_since
        return self.started + self.timeout_s + paused

    def give_up(self, reason: str | None = None) -> SinkTimeoutError | None:
        """Abandon the write now (at its timeout; or for a catch-up write, ``reason``
        ``"stopping"``: the catch-up stops while it runs, ``"draining"``: a max_lag drain
        waited the sink's write_timeout_s for it); ``None`` when it is marking already
        (the mark is to be waited for) or has ended (its own outcome stands). Once
        abandoned, the same error again."""
        with self._giving_up:
            if self._error is None:
                self._error = self._abandon(reason)
            return self._error

    def _abandon(self, reason: str | None) -> SinkTimeoutError | None:
        claim = self.runner.claim
        assert claim is not None
        if not claim.abandon():  # marking now (the mark is waited for), or ended
            return None
        runner, batch = self.runner, self.runner.batch
        name = runner.sink.name
        bound = f"its write_timeout_s={self.timeout_s:g} s"
        if self.configured_s is not None and self.configured_s != self.timeout_s:
            bound = (
                f"{self.timeout_s:g} s (its write_timeout_s={self.configured_s:g} s, doubled "
                "for each of its catch-up writes abandoned in a row)"
            )
        limit = {
            "stopping": f"before the catch-up stopped (bound {bound})",
            "draining": f"before a max_lag drain had waited its write_timeout_s for it (bound "
            f"{bound})",
        }.get(reason or "", f"within {bound}")
        error = SinkTimeoutError(
            f"write did not return {limit} (all "
            f"attempts together; now at attempt {runner.attempt}); the batch went on without "
            "it: the sink lags, and the catch-up writes the batch from the spool once the "
            "abandoned write has ended (its Spark jobs, if any, were cancelled). Find what "
            "holds the sink's target (a lock, a stalled connection), or raise write_timeout_s",
            sink=name,
            batch_id=batch.batch_id,
        )
        key = (batch.info.epoch, batch.batch_id)
        # given up early (a drain, a stop): abandoned after what it was given, not its bound
        waited = self.timeout_s if reason is None else time.monotonic() - self.started
        waited = round(min(waited, self.timeout_s), 1)
        write = AbandonedWrite(
            name, key, waited, self.tag, self.cancel, self.done, returned=self.returned
        )
        write.since = self.started
        self.abandoned.add(write)
        self.cancel()
        runner.timed_out(error)
        self.ended.set()  # the waiting thread returns this error
        return error

    def _ended_abandoned(self) -> None:
        batch, name = self.runner.batch, self.runner.sink.name
        log.warning(
            "pipeline %s, batch %s, sink %s: its abandoned write ended %.1f s after it started "
            "(write_timeout_s=%g s); not marked: the catch-up writes the batch from the "
            "spool, and the sink finds there what that write committed",
            batch.pipeline, batch.batch_id, name, time.monotonic() - self.started,
            self.timeout_s,
            extra=batch_fields(batch.pipeline, batch.batch_id, name),
        )  # fmt: skip
        self.abandoned.on_done()
