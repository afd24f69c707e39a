"""Whether each lag sink is open, being opened, unopened or lost: one value per sink
(docs/architecture.md §5, §14.1, §14.2).

A lag sink's open/lost status is moved by several actors: the batch thread (a reopen
started at hold-back, a lost target found at the run's first batch), ``FanOut(...)`` (an
open still running at the start, :meth:`fanout.steps.lag_reopen.Reopener.still_opening`),
the catch-up thread (a reopen) and each sink's reopen thread (its outcome,
:meth:`fanout.steps.lag_reopen.Reopener.reopen`). Kept in several containers, a reader that read
them apart while a reopen moved the sink from one to the other saw a lost target open and
wrote it. Here each sink has one :data:`Held` value in one dict, moved only by
:meth:`SinkStates.move`, which checks the move against :data:`MOVES` and holds the lock;
each reader asks one question under that lock. Whether an open sink lags or is live
depends on its backlog (:class:`fanout.steps.lag.Backlog`), not on this state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, TypeAlias, TypeVar

from fanout.contract.sink import SinkContext
from fanout.errors import RenamedSinkError, TargetLostError

Refusal: TypeAlias = TargetLostError | RenamedSinkError
"""What a lagging sink's reopen check refuses it with (it then lags with it, never written,
for the rest of the run): its target lost its last marked batch, or holds a batch of a sink
it was renamed from (docs/architecture.md §5)."""


@dataclass
class Opening:
    """A lag sink's ``open()`` (or, for :class:`fanout.steps.lag_reopen.Reopener`, its
    whole reopen: the open and the lost-target check) in a daemon thread of its own."""

    done: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    error: Exception | None = None

    @classmethod
    def start(cls, target: Any, context: SinkContext, pipeline: str) -> Opening:
        """Call ``target.open(context)`` in a new daemon thread, named
        ``fanout-<pipeline>-<sink>-open``."""
        name = f"fanout-{pipeline}-{getattr(target, 'name', 'sink')}-open"
        return cls.run(name, lambda: target.open(context))

    @classmethod
    def run(cls, name: str, work: Callable[[], None], started: float | None = None) -> Opening:
        """Call ``work()`` in a new daemon thread named ``name`` (``started``: when the
        wait for it began, if before now)."""
        opening = cls() if started is None else cls(started=started)

        def run() -> None:
            try:
                work()
            except Exception as exc:
                opening.error = exc
            finally:
                opening.done.set()

        threading.Thread(target=run, name=name, daemon=True).start()
        return opening


class SinkState(Enum):
    """A lag sink's open/lost status."""

    OPEN = "open"
    """Opened (and, if reopened, its target checked): may be written."""
    UNOPENED = "unopened"
    """Its ``open()`` failed or did not return in time; no reopen runs."""
    OPENING = "opening"
    """Its reopen (the ``open()``, then the lost-target check) runs in its thread, which
    owns the sink until it has moved it on."""
    LOST = "lost"
    """Its target lost its last marked batch that wrote rows: never written this run."""


@dataclass(frozen=True)
class Open:
    """:attr:`SinkState.OPEN`."""

    state: ClassVar[SinkState] = SinkState.OPEN


@dataclass(frozen=True)
class Unopened:
    """:attr:`SinkState.UNOPENED`: the context its reopen opens it with, and its last
    error (what the sink lags with)."""

    context: SinkContext
    error: BaseException
    state: ClassVar[SinkState] = SinkState.UNOPENED


@dataclass(frozen=True)
class Reopening:
    """:attr:`SinkState.OPENING`: as :class:`Unopened` (its error that of this reopen once
    its open or check failed, while its thread closes what it opened), and the reopen
    running."""

    context: SinkContext
    error: BaseException
    opening: Opening
    state: ClassVar[SinkState] = SinkState.OPENING


@dataclass(frozen=True)
class Lost:
    """:attr:`SinkState.LOST`: the refusal the sink lags with for the rest of the run."""

    error: Refusal
    state: ClassVar[SinkState] = SinkState.LOST


Held: TypeAlias = Open | Unopened | Reopening | Lost
"""A sink's state with what that state needs."""

H = TypeVar("H", Open, Unopened, Reopening, Lost)

MOVES: frozenset[tuple[SinkState, SinkState]] = frozenset(
    {
        (SinkState.UNOPENED, SinkState.OPENING),  # a reopen starts
        (SinkState.OPENING, SinkState.OPENING),  # its open or check failed: the new error
        (SinkState.OPENING, SinkState.UNOPENED),  # its open or check failed, or the stop
        (SinkState.OPENING, SinkState.OPEN),  # opened, its target holds its marks
        (SinkState.OPENING, SinkState.LOST),  # opened, its target lost a marked batch
        (SinkState.OPEN, SinkState.LOST),  # the run's first batch found its target lost
        (SinkState.LOST, SinkState.LOST),  # asked again (a reopen's check, then the run's)
    }
)
"""The moves :meth:`SinkStates.move` allows, (from, to)."""


class SinkStateError(AssertionError):
    """A move of a sink's state that :data:`MOVES` does not allow: a bug in fanout."""

    def __init__(self, sink: str, was: SinkState, to: SinkState) -> None:
        super().__init__(
            f"sink {sink!r}: its lag state cannot move from {was.value} to {to.value} "
            "(a bug in fanout: please report it)"
        )
        self.sink, self.was, self.to = sink, was, to


class SinkStates:
    """Every lag sink's :data:`Held` value, read and moved under ``lock`` (the lag
    state's, so a caller holding it may read and move at once).

    :param sinks: the sinks, open unless named in ``unopened``.
    :param unopened: those whose ``open()`` failed at the start: their context and error.
    """

    def __init__(
        self,
        lock: threading.RLock,
        sinks: Iterable[str],
        unopened: Mapping[str, tuple[SinkContext, BaseException]],
    ) -> None:
        self._lock = lock
        self._held: dict[str, Held] = {name: Open() for name in sinks}
        for name, (context, error) in unopened.items():
            self._held[name] = Unopened(context, error)

    def of(self, sink: str) -> Held:
        """``sink``'s state (a sink never named is open)."""
        with self._lock:
            return self._held.get(sink, _OPEN)

    def of_kind(self, sink: str, kind: type[H], to: SinkState) -> H:
        """``sink``'s state, which a move to ``to`` needs to be a ``kind`` (whose payload
        the move carries on); else :class:`SinkStateError` naming that move."""
        with self._lock:
            held = self.of(sink)
            if not isinstance(held, kind):
                raise SinkStateError(sink, held.state, to)
            return held

    def move(self, sink: str, to: Held) -> Held:
        """Put ``sink`` in state ``to``; returns the state it leaves. Raises
        :class:`SinkStateError` for a move :data:`MOVES` does not allow."""
        with self._lock:
            was = self.of(sink)
            if (was.state, to.state) not in MOVES:
                raise SinkStateError(sink, was.state, to.state)
            self._held[sink] = to
            return was

    def in_state(self, *states: SinkState) -> dict[str, Held]:
        """The sinks in one of ``states``, in configuration order, read at once."""
        with self._lock:
            return {name: held for name, held in self._held.items() if held.state in states}


_OPEN = Open()
