"""Reopening a lag sink that could not be opened at the start (docs/architecture.md §5,
§14.4).

A lag sink whose ``open()`` failed at the start with a transient error, or did not return
within its ``write_timeout_s``, lags; each batch's hold-back and the catch-up open it again
(:meth:`Reopener.reopen`). The open, then the sink's target checks, run in a daemon thread
of their own, outside the lag state's lock; until the thread has put its outcome in place
the sink is ``OPENING`` (:mod:`fanout.steps.lag_state`), never written. :class:`Reopener`
does this for :class:`fanout.steps.lag.Lagging`, which owns it, shares its lock and its
:class:`fanout.steps.lag_state.SinkStates` with it, and records each failure and lost
target. What a reopen asks of the pipeline and tells it are its :class:`ReopenHooks`,
given when the lag state is built.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, ParamSpec, TypeVar

from fanout.contract.sink import SinkContext
from fanout.errors import FanoutError, SinkError, SinkTimeoutError, SinkUnreachableError
from fanout.observe.secrets import masked_error, redact_printed
from fanout.sink_spec import SinkSpec, write_timeout
from fanout.steps.lag_state import (
    Lost,
    Open,
    Opening,
    Refusal,
    Reopening,
    SinkState,
    SinkStates,
    Unopened,
)

log = logging.getLogger("fanout")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class ReopenHooks:
    """What a reopen asks of the pipeline and tells it (each ``None``: not asked, not
    told)."""

    ask_target: Callable[[str], Refusal | None] | None = None
    """The checks of one sink asked when :meth:`Reopener.reopen` opens it, before its first
    write, as an open sink is asked at the run's first batch: its target's last mark
    (:mod:`fanout.steps.lost_target`), then, a sink with no mark in the epoch, a sink it
    was renamed from (:mod:`fanout.steps.renamed`); ``None`` when it may write."""
    ask_again: Callable[[str], bool] | None = None
    """Asked under the lock, after :attr:`ask_target` let a sink write and before it moves
    to ``OPEN``: whether that answer may be stale, so the check is asked again (the run's
    first batch's renamed check ran meanwhile and, the sink still ``OPENING``, did not ask
    it). ``None``: never."""
    regather: Callable[[], None] | None = None
    """Called once :meth:`Reopener.reopen` opened a sink, before :attr:`ask_target`: its
    ``open`` may have fetched a secret, which the pipeline's secrets must now hold."""
    on_released: Callable[[str], None] | None = None
    """Called with a sink's name when its reopen's thread, after
    :meth:`fanout.steps.lag.Lagging.close`, no longer holds it (closed, or its open
    failed): until then it is the pipeline's still."""
    on_reopened: Callable[[], None] | None = None
    """Called when a reopen put its outcome in place (the catch-up is woken)."""


class LateHook(Generic[P, R]):
    """One of :class:`ReopenHooks` whose owner is built after the lag state, because it
    reads the lag state (the target checks, the catch-up): handed to the lag state
    unfilled, and filled exactly once, right after its owner is built (:meth:`fill`).

    A second :meth:`fill`, or a call before the first without ``before``, is a bug in
    fanout: it raises :class:`fanout.errors.FanoutError` naming the hook (not an
    ``assert``, which ``python -O`` drops).

    :param name: which hook it is, named in those errors.
    :param before: what a call before :meth:`fill` does. The catch-up's wake has one,
        doing nothing: a reopen begun by ``FanOut(...)`` (a first ``open()`` still running)
        may end before the catch-up is built, and then there is no catch-up to wake; it
        looks at every sink when it starts.
    """

    def __init__(self, name: str, *, before: Callable[P, R] | None = None) -> None:
        self.name = name
        self._before = before
        self._hook: Callable[P, R] | None = None

    def fill(self, hook: Callable[P, R]) -> None:
        """Give the hook, once its owner is built."""
        if self._hook is not None:
            raise FanoutError(
                f"a reopen hook, {self.name}, was filled twice, but FanOut(...) fills it "
                "once, right after building the hook's owner: a bug in fanout"
            )
        self._hook = hook

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the hook (or, not filled yet, ``before``)."""
        hook = self._hook if self._hook is not None else self._before
        if hook is None:
            raise FanoutError(
                f"a reopen hook, {self.name}, was called before FanOut(...) filled it, "
                "which it does right after building the hook's owner: a bug in fanout"
            )
        return hook(*args, **kwargs)


class Reopener:
    """The reopens of one pipeline's lag sinks.

    :param pipeline: the pipeline name.
    :param specs: every sink's spec (its sink, its ``write_timeout_s``).
    :param lock: the lag state's lock (:class:`fanout.steps.lag.Lagging`'s): each move of a
        sink's state, and each look at :meth:`close`'s flag, is under it; the open and the
        check never are.
    :param states: the lag state's sink states, which a reopen moves.
    :param secrets: the pipeline's secrets now (the lag state's, gathered again when a
        reopened sink fetched one), masked in an ``open``'s error and a ``close``'s.
    :param failed: records a sink's failed try as its last error
        (:meth:`fanout.steps.lag.Lagging.failed`).
    :param lose: keeps a sink its check refused behind for the rest of the run
        (:meth:`fanout.steps.lag.Lagging.lose`).
    :param hooks: what a reopen asks of the pipeline and tells it.
    """

    def __init__(
        self,
        pipeline: str,
        specs: Mapping[str, SinkSpec],
        lock: threading.RLock,
        states: SinkStates,
        secrets: Callable[[], tuple[str, ...]],
        failed: Callable[[str, BaseException], None],
        lose: Callable[[str, Refusal], None],
        hooks: ReopenHooks,
    ) -> None:
        self.pipeline = pipeline
        self.specs = specs
        self._lock = lock
        self._states = states
        self._secrets = secrets
        self._failed = failed
        self._lose = lose
        self.hooks = hooks
        self._closing = False

    def close(self) -> None:
        """The pipeline stops: no reopen starts any more, and one still running closes the
        sink itself once its ``open()`` (and check) has returned
        (:meth:`fanout.steps.lag.Lagging.close`, which holds the lock around it)."""
        with self._lock:
            self._closing = True

    def reopen(self, sink: str, *, wait: bool = True) -> BaseException | None:
        """Open a sink that could not be opened when the pipeline started; ``None`` once
        it is open (now or before) and may be written, else the error.

        The open, and then the lost-target check (:attr:`ReopenHooks.ask_target`, asked
        before anything is written to it, as an open sink is at the run's first batch), run
        in a daemon thread of their own, outside the lag state's lock: a server that
        accepts the connection and never answers, or a ``holds_batch`` that hangs, must not
        stall the other sinks' batches. One still running is not started again, and until
        it has ended the sink stays ``OPENING``: never written, it lags. It is waited for
        up to the sink's ``write_timeout_s`` (then a :class:`fanout.SinkTimeoutError`);
        without one, for as long as it takes when ``wait`` (the catch-up, a drain), else
        not at all (a live batch: the sink lags with it, with its last error). A target
        that lost its last marked batch keeps the sink behind with
        :class:`fanout.TargetLostError` (:meth:`fanout.steps.lag.Lagging.lose`), which
        every later call returns; a check that raises closes the sink again (a PostgreSQL
        sink's pool would leak, one per try)."""
        spec = self.specs[sink]
        timeout = write_timeout(spec)
        with self._lock:
            held = self._states.of(sink)
            if isinstance(held, Open):
                return None
            if isinstance(held, Lost):
                return held.error
            if isinstance(held, Unopened):  # a reopen that has ended moved it back here
                if self._closing:
                    return held.error
                # the secrets the run knows now (a sink opened earlier may have fetched one)
                context = replace(held.context, secrets=self._secrets())
                opening = self._start_reopen(sink, context)
                self._states.move(sink, Reopening(held.context, held.error, opening))
            else:
                opening = held.opening
        if timeout is not None:
            remaining: float | None = max(0.0, opening.started + timeout - time.monotonic())
        else:
            remaining = None if wait else 0.0
        if not opening.done.wait(remaining) and timeout is not None:
            error = SinkTimeoutError(
                f"open() did not return within its write_timeout_s={timeout:g} s, or the "
                "check of its target after it (running for "
                f"{time.monotonic() - opening.started:.1f} s): the sink stays unopened and "
                "lags; it is not opened again while that call runs. Find what holds the "
                "sink's target (a stalled connection, a server that does not answer)",
                sink=sink,
            )
            self._failed(sink, error)
            return error
        held = self._states.of(sink)  # still running (a live batch's no wait): its last error
        return None if isinstance(held, Open) else held.error

    def still_opening(self, sink: str, opening: Opening) -> None:
        """``sink``'s first ``open()``, at the pipeline's start, did not return within its
        ``write_timeout_s`` and runs on: its result is taken (and, opened, the sink asked
        the lost-target check) as a :meth:`reopen`'s, and no other starts while it runs."""
        with self._lock:
            held = self._states.of_kind(sink, Unopened, SinkState.OPENING)
            reopen = self._start_reopen(sink, held.context, opening)
            self._states.move(sink, Reopening(held.context, held.error, reopen))

    def _start_reopen(
        self, sink: str, context: SinkContext, first: Opening | None = None
    ) -> Opening:
        """Start ``sink``'s reopen in a daemon thread (called under the lock, which moves
        the sink to ``OPENING`` before the thread can move it on): its ``open()`` (or the
        wait for ``first``, the pipeline's start's still running), then its check, and the
        outcome put in place under the lock, before the thread counts as done. While the
        sink is ``OPENING`` the thread owns it: one it opened but may not keep (its check
        failed, or :meth:`close` ran) is closed before it moves back to ``UNOPENED``; one
        whose open failed is not closed (it holds nothing: the contract's ``open``)."""
        target = self.specs[sink].sink

        def work() -> None:
            if first is not None:
                first.done.wait()
                error = first.error
            else:
                try:
                    target.open(context)
                    error = None
                except Exception as exc:
                    error = exc
            opened, kept = error is None, False
            try:
                if error is not None:
                    self._open_failed(sink, error)
                else:
                    kept = self._now_open(sink)
            finally:
                closing = False  # kept: moved on under the lock, close() not run then
                if not kept:
                    if opened:  # while it is OPENING: no other open starts
                        after = "the stop" if self._closing else "its failed check"
                        self._close_unasked(sink, after)
                    with self._lock:
                        held = self._states.of_kind(sink, Reopening, SinkState.UNOPENED)
                        self._states.move(sink, Unopened(held.context, held.error))
                        closing = self._closing
                if not closing and self.hooks.on_reopened is not None:
                    self.hooks.on_reopened()
                if closing and self.hooks.on_released is not None:
                    self.hooks.on_released(sink)

        name = f"fanout-{self.pipeline}-{sink}-reopen"
        return Opening.run(name, work, None if first is None else first.started)

    def _open_failed(self, sink: str, exc: Exception) -> None:
        """``sink``'s ``open()`` failed: it lags with that error (masked)."""
        with self._lock:
            own = self.specs[sink].sink.secret_values()
            self._try_failed(sink, unreachable_masked(sink, exc, own, self._secrets()))

    def _try_failed(self, sink: str, error: BaseException) -> None:
        """``sink``'s reopen failed (its open or its check): it lags with ``error`` from now
        on, also while its thread, which still owns it, closes what it opened (a live
        batch asking meanwhile got the error of the try before)."""
        with self._lock:
            held = self._states.of_kind(sink, Reopening, SinkState.OPENING)
            self._states.move(sink, replace(held, error=error))
            self._failed(sink, error)

    def _now_open(self, sink: str) -> bool:
        """``sink`` opened: asked the lost-target check (in the reopen's thread; nothing
        writes a sink while it is ``OPENING``, so none before the answer); whether it was
        moved on (open, or lost). A check that raises (the ledger unreadable) leaves it
        unopened, to be closed, opened and asked again at its next reopen; so does
        :meth:`close` having run (not asked then)."""
        with self._lock:
            if self._closing:
                return False
            if self.hooks.regather is not None:
                self.hooks.regather()
        while True:
            try:
                lost = None if self.hooks.ask_target is None else self.hooks.ask_target(sink)
            except Exception as exc:
                self._try_failed(sink, exc)
                log.warning(
                    "pipeline %s: sink %r opened, but the check of its target failed (%s): "
                    "closed, it stays behind, opened and asked again at its next try",
                    self.pipeline, sink, exc,
                )  # fmt: skip
                return False
            with self._lock:
                if self._closing:
                    return False
                if lost is not None:
                    self._lose(sink, lost)
                    return True
                if self.hooks.ask_again is not None and self.hooks.ask_again(sink):
                    continue  # asked before the run's first batch's check, which missed it
                self._states.move(sink, Open())
                break
        log.info("pipeline %s: sink %r is reachable again and open", self.pipeline, sink)
        return True

    def _close_unasked(self, sink: str, after: str) -> None:
        """Close ``sink``, opened by a reopen that may not keep it open (logged, not
        raised)."""
        try:
            self.specs[sink].sink.close()
        except Exception as exc:
            log.warning(
                "pipeline %s: sink %r: close() after %s failed too: %s",
                self.pipeline, sink, after,
                redact_printed(f"{type(exc).__name__}: {exc}", self._secrets()),
            )  # fmt: skip


def unreachable_masked(
    sink: str, error: BaseException, secrets: Sequence[str], others: Sequence[str] = ()
) -> BaseException:
    """``error`` of a sink's ``open``, as the ledger, the lag state and the log may show it:
    itself, or when a message in its chain holds one of the sink's secrets (or of
    ``others``, the rest of its pipeline's, where
    :func:`fanout.observe.secrets.redact_apart` masks them), a
    :class:`fanout.SinkUnreachableError` with them masked and no chain (no traceback may
    show them)."""
    said = f"{type(error).__name__}: {error}"
    own_prefix = f"sink {sink!r}: "
    if isinstance(error, SinkError) and str(error).startswith(own_prefix):
        said = str(error).removeprefix(own_prefix)  # it names the sink already
    masked = masked_error(
        error, secrets, lambda text: SinkUnreachableError(text, sink=sink), said, others=others
    )
    return error if masked is None else masked
