"""A batch fanout refused before any sink wrote it, recorded as the refusal leaves
``FanOut.__call__`` (:mod:`fanout.ledger.refusals`; docs/architecture.md §4, "Refused
batches").

Spark replays such a batch at the next start with its original planning time, and a
replay whose sink can no longer tell whether it holds the batch is refused (its first
attempt may have written it). A batch fanout refused before any write (``fanout run``'s
clean stop at the stop gate, a closed ``FanOut``, a lost target or a renamed sink at the
run's first batch...) was written by nobody: its row lets the replay pass. One row, only when
both hold (else none: the cost of a missing row is a possible false refusal, which is
safe; a wrong row could let a batch be written twice):

- no sink write of the attempt began: it left before the steps that write
  (:meth:`PreWrite.writing`, called by the dispatcher right before them), and not from the
  guard step (:meth:`PreWrite.admitting`: a replaced or rolled-back checkpoint is refused
  again at its replay, a refused reset's batch is admitted into a new epoch, where no sink
  has a mark and the replay check asks nothing; a refused reset leaves the ledger as it
  was);
- the attempt is certainly the batch's first, not a replay (:meth:`PreWrite.first_attempt`):
  Spark planned it after this ``FanOut`` was born, and no attempt of that batch id raised
  earlier in this process. A replay's earlier attempt may have written; a row of the
  replay's refusal would let the next replay pass behind it.

The row's ledger I/O (and, at the stop gate, the read of ``offsets/N``) runs in a thread of
its own, waited for :data:`RECORD_WAIT_S` at most: a store that hangs must not hang
``fanout run``'s stop. A row not recorded by then is dropped, warned (no row: the replay is
checked as any other). Its append may have begun, though, and land late: after a later
attempt of the batch read the rows, found none, and wrote. So such a late row is remembered
(:meth:`PreWrite.settled`): a later attempt of the batch in this process waits for it before
it reads the rows, and one that still finds it under way is not exempt and records itself
``admitted`` before it writes, numbered past the late row (:mod:`fanout.ledger.refusals`).

Nothing of this runs on a batch that passes: a flag set, no read, no write.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from fanout.contract.batch import BatchInfo
from fanout.ledger.entry import Ledger, ledger_key
from fanout.ledger.refusals import record_refused
from fanout.observe.logs import batch_fields
from fanout.steps.context import (
    ContextReader,
    checkpoint_root,
    parse_offset_log,
    query_id_of,
    read_file_directly,
)
from fanout.steps.timeout import BoundedCall

log = logging.getLogger("fanout")

Phase = Literal["entered", "admitting", "admitted", "writing"]
"""Where the batch in ``FanOut.__call__`` is: before the guard step, in it, past it, at
the steps that may write."""

RECORDED: tuple[Phase, ...] = ("entered", "admitted")
"""The phases whose refusal is recorded."""

RECORD_WAIT_S = 10.0
"""How long a refusal waits for its row (the ``offsets/N`` read, a ledger lookup, the
append) before it goes on without it."""

UNRECORDED: Final = (
    "if a sink's own records of its batches expire before Spark replays it, the replay may "
    "be refused as possibly written: then `--accept-lost-target <sink>` lets it write"
)
"""What a refusal left unrecorded costs, and the way on, for its warning."""

Attempt = Callable[[], tuple[BatchInfo | None, bool]]
"""What :meth:`PreWrite.left` asks of the attempt that leaves: its context (``None``:
unreadable) and whether it is certainly the batch's first (``Attempts.first``)."""


@dataclass
class Seen:
    """What this process saw of one pipeline's refused attempts, by any ``FanOut``."""

    raised: set[int] = field(default_factory=set)
    """The batch ids of attempts that raised: a later attempt of one of them is a replay
    (Spark replays a batch that raised), whoever runs it."""
    landing: dict[int, threading.Event] = field(default_factory=dict)
    """Per batch id, a ``refused`` row whose append began and was given up on
    (:meth:`PreWrite.left`): set once the append ended, landed or failed."""


_seen: dict[tuple[str, str], Seen] = {}
"""Per (ledger location, pipeline)."""
_seen_here: weakref.WeakKeyDictionary[object, dict[str, Seen]] = weakref.WeakKeyDictionary()
"""The same for a ledger without a location (in memory), per ledger object: a new one
never finds another's (gone, its ``id()`` reused)."""
_seen_lock = threading.Lock()


class _Wait:
    """Between a refusal's record thread and the refusal waiting for it, under one lock:
    the thread asks :meth:`go_on` right before its append, the refusal that stops waiting
    learns from :meth:`give_up` whether the append began (then its row may land late)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._given_up = False
        self._began = False

    @property
    def given_up(self) -> bool:
        """Whether the refusal stopped waiting."""
        with self._lock:
            return self._given_up

    def go_on(self) -> bool:
        """The thread is about to append: may it (the refusal still waits)?"""
        with self._lock:
            self._began = not self._given_up
            return self._began

    def give_up(self) -> bool:
        """The refusal stops waiting: whether the append began before (it may still land)."""
        with self._lock:
            self._given_up = True
            return self._began


class PreWrite:
    """What one ``FanOut`` knows to record a batch it refused before any write.

    :param ledger: the pipeline's ledger.
    :param pipeline: the pipeline's name.
    :param born_ms: when the ``FanOut``'s run memory was born (epoch ms,
        :class:`fanout.steps.replay.RunMemory`): its ``__init__``, or under Spark Connect
        its ``__setstate__``, which the server's worker runs before the run plans its first
        batch (the ``FanOut`` is built later, at that batch). A batch planned at or after it
        was planned by a run of this process, whose every attempt this process saw; also
        for a ``FanOut`` built inside a foreachBatch call, whose run memory then forgets
        its birth (its first batch was planned before it). ``None``: no batch is certainly
        a first attempt.
    """

    def __init__(self, ledger: Ledger, pipeline: str, born_ms: int | None) -> None:
        self.ledger = ledger
        self.pipeline = pipeline
        self.born_ms = born_ms
        self._phase: Phase = "entered"
        self._epoch: int | None = None  # the epoch the guard admitted the batch into

    def entering(self) -> None:
        """A batch enters ``FanOut.__call__``: nothing of it done yet."""
        self._phase, self._epoch = "entered", None

    def admitting(self) -> None:
        """The guard step begins (:mod:`fanout.steps.admit`): a refusal from it is not
        recorded (a replaced or rolled-back checkpoint, refused again at its replay; a
        reset's start refused, whose replay a new epoch admits, with no marks there)."""
        self._phase = "admitting"

    def admitted(self, epoch: int) -> None:
        """The guard admitted the batch into ``epoch``: a refusal recorded from here on
        is of that epoch."""
        self._phase, self._epoch = "admitted", epoch

    def writing(self) -> None:
        """The batch reaches the steps that may write to a sink (persist, routes, spool,
        write): from here on its refusal is recorded no more."""
        self._phase = "writing"

    def first_attempt(self, info: BatchInfo) -> bool:
        """Whether ``info`` is certainly its batch's first attempt: Spark planned it
        (``batch_timestamp_ms``) at or after :attr:`born_ms`, and no attempt of its batch
        id raised before in this process. ``False`` when the planning time or the birth is
        unknown. Asked as the attempt enters, before it raises, and at step 3c (a refusal
        row is read only when this is ``False``)."""
        planned = info.batch_timestamp_ms
        if planned is None or self.born_ms is None or planned < self.born_ms:
            return False
        with _seen_lock:
            return info.batch_id not in self._seen().raised

    def settled(self, batch_id: int) -> bool:
        """Whether no ``refused`` row of ``batch_id`` may still land: one whose append
        began and was given up on in this process (:meth:`left`) is waited for now,
        :data:`RECORD_WAIT_S` at most. ``False``: still under way, it may land after the
        caller reads the batch's rows (then those rows exempt nothing, and an attempt that
        writes records itself ``admitted`` first: ``Attempts.refused_before_writing``)."""
        with _seen_lock:
            landing = self._seen().landing.get(batch_id)
        if landing is None:
            return True
        if not landing.wait(RECORD_WAIT_S):
            return False
        with _seen_lock:
            seen = self._seen()
            if seen.landing.get(batch_id) is landing:
                del seen.landing[batch_id]
        return True

    def _seen(self) -> Seen:
        """What this process saw of this pipeline (caller holds :data:`_seen_lock`)."""
        if getattr(self.ledger, "path", None) is None:
            try:
                return _seen_here.setdefault(self.ledger, {}).setdefault(self.pipeline, Seen())
            except TypeError:  # a ledger object that cannot be weakly referenced or hashed
                pass
        return _seen.setdefault((ledger_key(self.ledger), self.pipeline), Seen())

    def context(
        self, reader: ContextReader, batch_df: Any, batch_id: int
    ) -> Callable[[], BatchInfo | None]:
        """How to read the context of a batch refused before fanout read it (the stop gate,
        a closed ``FanOut``): the checkpoint is found now, on the batch's thread (the one
        the reader knows, else the batch's query's, asked of Spark, whose local properties
        and active session are the thread's); the returned function reads the batch's
        planning time from its ``offsets/<batch_id>`` (in :meth:`left`'s bounded thread)
        with pyarrow (:func:`fanout.steps.context.read_file_directly`), never through
        Hadoop: at a stop, Spark may have interrupted the batch's thread, and a read
        through Hadoop from it finds the file empty. It returns ``None`` when the file
        cannot be read (no row then)."""
        try:
            location = reader.known_location()
            if location is None and (query_id := query_id_of(batch_df)) is not None:
                location = checkpoint_root(query_id)
        except Exception as exc:
            log.debug("pipeline %s, batch %s: no checkpoint found at its refusal: %s",
                      self.pipeline, batch_id, exc)  # fmt: skip
            location = None
        return lambda: self._planned(location, int(batch_id))

    def _planned(self, location: str | None, batch_id: int) -> BatchInfo | None:
        """The context :meth:`context` reads: ``offsets/<batch_id>`` under ``location``."""
        try:
            text = None if location is None else read_file_directly(location, f"offsets/{batch_id}")
            planned = None if text is None else parse_offset_log(text)
        except Exception as exc:
            log.debug("pipeline %s, batch %s: offsets unreadable at its refusal: %s",
                      self.pipeline, batch_id, exc)  # fmt: skip
            return None
        if planned is None:
            return None
        return BatchInfo(self.pipeline, batch_id, None, planned.source_offsets,
                         batch_timestamp_ms=planned.batch_timestamp_ms)  # fmt: skip

    def left(self, batch_id: int, error: BaseException, attempt: Attempt) -> None:
        """The attempt of ``batch_id`` leaves ``FanOut.__call__`` with ``error``. Records
        the refusal when it came before the guard step (the ledger's current epoch, which a
        replay is admitted into) or after it and before any write (the epoch admitted),
        ``error`` is an ``Exception`` (not an interrupt) and ``attempt()`` says the attempt
        was the batch's first, with a planning time. ``attempt()`` and the record run in a
        thread waited for :data:`RECORD_WAIT_S`: not done by then, the row is dropped
        (warned; the thread begins no ledger read or append after that), and an append
        under way is remembered (:meth:`settled`). A failing record is logged, never
        raised: the batch's own error goes on (a clean stop stays one). The batch id is
        then remembered as raised in this process (after ``attempt()``, which asks it)."""
        phase, epoch = self._phase, self._epoch  # the next batch's entering() resets them
        try:
            if phase in RECORDED and isinstance(error, Exception):
                self._record_bounded(int(batch_id), epoch, error, attempt)
        finally:
            with _seen_lock:
                self._seen().raised.add(int(batch_id))

    def _record_bounded(
        self, batch_id: int, epoch: int | None, error: Exception, attempt: Attempt
    ) -> None:
        """:meth:`_record` of ``attempt()``'s batch when it is a first attempt, waited for
        :data:`RECORD_WAIT_S` at most; an append still under way then is remembered as
        landing (:attr:`Seen.landing`)."""
        wait = _Wait()

        def record() -> None:
            info, first = attempt()
            planned = None if info is None else info.batch_timestamp_ms
            if first and planned is not None and not wait.given_up:
                self._record(batch_id, epoch, planned, error, wait)

        name = f"fanout-{self.pipeline}-refused"
        call = BoundedCall.run(record, RECORD_WAIT_S, name)
        if call.done.is_set():
            if call.error is not None:  # attempt() failed: no row, the refusal goes on
                log.warning("pipeline %s, batch %s: its refusal could not be recorded: %s",
                            self.pipeline, batch_id, call.error)  # fmt: skip
            return
        if wait.give_up():
            with _seen_lock:
                self._seen().landing[batch_id] = call.done
            late = (
                "its append is under way and may land later: a later attempt of the batch in "
                "this process waits for it, else is not exempted by it"
            )
        else:
            late = "not recorded, so that the refusal is not held up"
        log.warning(
            "pipeline %s, batch %s: refused, but recording so in the ledger took more than "
            "%g s (the ledger's or the checkpoint's store does not answer); %s; %s",
            self.pipeline, batch_id, RECORD_WAIT_S, late, UNRECORDED,
            extra=batch_fields(self.pipeline, batch_id),
        )  # fmt: skip

    def _record(
        self,
        batch_id: int,
        epoch: int | None,
        planned: int,
        error: Exception,
        wait: _Wait,
    ) -> None:
        """Append the ``refused`` row of ``batch_id``, in ``epoch`` (``None``: the ledger's
        current one), unless ``wait`` was given up before the append; log what happened."""
        fields = batch_fields(self.pipeline, batch_id)
        try:
            if epoch is None:  # before the guard: the epoch a replay is admitted into
                epoch = self.ledger.lookup(self.pipeline, ()).epoch
            recorded = record_refused(
                self.ledger, self.pipeline, epoch, batch_id, planned, go_on=wait.go_on
            )
        except Exception as exc:
            log.warning(
                "pipeline %s, batch %s: refused before any sink wrote it, but the ledger "
                "could not record so (%s: %s); %s",
                self.pipeline, batch_id, type(exc).__name__, exc, UNRECORDED, extra=fields,
            )  # fmt: skip
            return
        if recorded:
            log.info(
                "pipeline %s, batch %s: refused before any sink wrote it (%s); recorded in "
                "the ledger, so its replay is known unwritten",
                self.pipeline, batch_id, type(error).__name__, extra=fields,
            )  # fmt: skip
