"""Which sinks lag, and what each still needs (docs/architecture.md §14).

A sink with ``on_failure="lag"`` that fails after its retries does not fail the batch: the
batch completes for the other sinks and is spooled for it (:mod:`fanout.spool.table`). From
then on the sink is *behind*: the batches it needs are the spooled batches recorded as
needed by it, plus, for a sink with ``backfill_from``, the batches its source holds, each
minus those its ledger marks already hold. A sink that is behind is not written by the live
path; the catch-up (:mod:`fanout.steps.catchup`) writes its batches in order and, once it
has none left, the sink is live again with the next batch.

The ledger marks stay the truth: :class:`Lagging` only caches them (the live path and the
catch-up update the cache after each mark they write) and the spool's index. It owns four
helpers that share its lock: the backfill sources' marks (:mod:`fanout.steps.lag_backfill`),
which batches are settled (:mod:`fanout.steps.lag_settle`), which spooled batches may go
(:mod:`fanout.steps.lag_release`) and the reopens of the sinks not opened yet
(:mod:`fanout.steps.lag_reopen`); each sink's open/lost state is
:mod:`fanout.steps.lag_state`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import InitVar, dataclass, field
from datetime import datetime

from fanout.contract.lag import SinkLag
from fanout.contract.sink import BackfillSource, SinkContext
from fanout.errors import BackfillError, MissedBatchesError, TargetLostError
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc
from fanout.observe.secrets import redact_printed
from fanout.sink_spec import SinkSpec
from fanout.spool.index import BatchKey, SpooledBatch
from fanout.spool.table import Spool
from fanout.steps.lag_backfill import BackfillMarks
from fanout.steps.lag_release import SpoolRelease
from fanout.steps.lag_reopen import Reopener, ReopenHooks
from fanout.steps.lag_settle import Settlement, spooled_through
from fanout.steps.lag_state import (
    Held,
    Lost,
    Opening,
    Refusal,
    Reopening,
    SinkState,
    SinkStates,
    Unopened,
)


@dataclass
class Backlog:
    """The batches one sink still needs, in order, and what the spool knows of them."""

    sink: str
    keys: list[BatchKey]
    spooled_rows: int = 0
    spooled: int = 0
    """How many of :attr:`keys` the spool holds (the others come from a backfill source)."""
    since: datetime | None = None

    def __bool__(self) -> bool:
        return bool(self.keys)


@dataclass
class Lagging:
    """The lag state of one pipeline's sinks.

    :param pipeline: the pipeline name.
    :param specs: every sink's spec (its :class:`fanout.sink_spec.LagPolicy`).
    :param ledger: where the marks are.
    :param spool: the pipeline's spool (``None`` when no sink lags or backfills).
    :param sources: the backfill source of each sink configured with ``backfill_from``.
    :param unopened: the lag-policy sinks whose ``open`` failed at the start with a
        transient error (their context and error): behind until :meth:`reopen` succeeds.
        From then on :class:`fanout.steps.lag_state.SinkStates` holds each sink's
        open/lost state (:meth:`held`).
    :param reopen_hooks: what a reopen asks of the pipeline and tells it (its target
        checks, the catch-up's wake...; none when ``None``).
    :param secrets: every secret of the pipeline, masked in the last error of each sink
        that :meth:`lag_of` shows (status, the ``fanout_sink_lag`` hook) as printed text
        masks them (:func:`fanout.observe.secrets.redact_printed`; the sink's own are masked
        before, wherever they stand alone).
    """

    pipeline: str
    specs: Mapping[str, SinkSpec]
    ledger: Ledger
    spool: Spool | None
    sources: Mapping[str, BackfillSource] = field(default_factory=dict)
    unopened: InitVar[Mapping[str, tuple[SinkContext, BaseException]] | None] = None
    secrets: tuple[str, ...] = ()
    reopen_hooks: InitVar[ReopenHooks | None] = None
    epoch: int = 0
    _marks: dict[tuple[str, int], int | None] = field(default_factory=dict, repr=False)
    _errors: dict[str, str] = field(default_factory=dict, repr=False)
    _stuck: set[str] = field(default_factory=set, repr=False)
    """The sinks whose last failure no run resolves by itself (a backfill source that cannot
    give a batch back as committed, a gap before its next batch)."""
    _failed_at: dict[str, float] = field(default_factory=dict, repr=False)
    checkpoint: tuple[int, str] | None = None
    """The running query's checkpoint and the epoch that query owns: its ``commits/N`` says
    Spark committed batch N of that epoch (:meth:`settled`)."""
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _states: SinkStates = field(init=False, repr=False)
    """Each sink's open/lost state, one value per sink (:meth:`held`)."""
    _backfill: BackfillMarks = field(init=False, repr=False)
    """The backfill sources' marks, and which sinks still read them."""
    _settlement: Settlement = field(init=False, repr=False)
    """Which batches are settled, or given up with a checkpoint reset (:meth:`settled`)."""
    _release: SpoolRelease = field(init=False, repr=False)
    """Which spooled batches may go, and their removal (:meth:`release_held`)."""
    _reopener: Reopener = field(init=False, repr=False)
    """The reopens of the sinks not opened yet (:meth:`reopen`)."""

    def __post_init__(
        self,
        unopened: Mapping[str, tuple[SinkContext, BaseException]] | None,
        reopen_hooks: ReopenHooks | None,
    ) -> None:
        self._states = SinkStates(self._lock, self.specs, unopened or {})
        self._reopener = Reopener(
            self.pipeline,
            self.specs,
            self._lock,
            self._states,
            lambda: self.secrets,
            self.failed,
            self.lose,
            reopen_hooks or ReopenHooks(),
        )
        self._backfill = BackfillMarks(
            self.pipeline, self.specs, self.ledger, self.sources, self._lock, self.mark
        )
        self._settlement = Settlement(
            self.pipeline,
            self.specs,
            self.spool,
            self._lock,
            self.mark,
            self._backfill.holds,
            epoch=lambda: self.epoch,
            checkpoint=lambda: self.checkpoint,
        )
        self._release = SpoolRelease(self.pipeline, self.ledger, self.spool, self._lock, self.needs)

    @property
    def sinks(self) -> list[str]:
        """The sinks that may be behind: ``on_failure="lag"`` or ``backfill_from``."""
        return [name for name, spec in self.specs.items() if spec.lag.uses_spool]

    # -- marks -----------------------------------------------------------------------

    def mark(self, sink: str, epoch: int) -> int | None:
        """The sink's last committed batch of ``epoch`` (cached; read once per epoch)."""
        with self._lock:
            if (sink, epoch) not in self._marks:
                found = self.ledger.last_committed(self.pipeline, [sink], epoch).get(sink)
                self._marks[(sink, epoch)] = found
            return self._marks[(sink, epoch)]

    def saw_marks(self, epoch: int, marks: Mapping[str, int | None] | None) -> None:
        """The marks a batch read with its ledger lookup (never moves a mark back)."""
        with self._lock:
            self.epoch = max(self.epoch, epoch)
            self._backfill.new_batch()  # a cached skip's mark is read again once
            for sink, batch in (marks or {}).items():
                self._advance(sink, epoch, batch)

    def saw_batch(self, key: BatchKey) -> None:
        """Batch ``key`` runs live: Spark planned it, so it committed every batch of the
        epoch before it (:meth:`settled`)."""
        self._settlement.saw_batch(key)

    def committed(self, sink: str, key: BatchKey, *, caught_up: bool = False) -> None:
        """``sink`` marked batch ``key`` (live, or ``caught_up`` from the spool or a backfill
        source: only those are remembered as written, for :meth:`given_up`, until the
        spool lets the batch go; a live batch is never in a sink's spool)."""
        with self._lock:
            self._advance(sink, key[0], key[1])
            self._backfill.source_committed(sink, key[0])
            if caught_up and self.spool is not None:  # else nothing to release
                self._release.wrote(sink, key)
            self._errors.pop(sink, None)
            self._failed_at.pop(sink, None)
            self._stuck.discard(sink)

    def failed(self, sink: str, error: BaseException) -> None:
        """``sink``'s last attempt failed (live or in the catch-up). A sink :meth:`lose`
        moved to ``LOST`` keeps that refusal as its last error (a live batch that began
        while its reopen ran fails with the open's error after it)."""
        with self._lock:
            held = self._states.of(sink)
            if isinstance(held, Lost):
                error = held.error
            self._errors[sink] = redact_printed(f"{type(error).__name__}: {error}", self.secrets)
            self._failed_at[sink] = time.monotonic()
            if isinstance(held, Lost) or isinstance(
                error, (BackfillError, MissedBatchesError, TargetLostError)
            ):
                self._stuck.add(sink)
            else:
                self._stuck.discard(sink)

    def stuck(self, sink: str) -> bool:
        """Whether ``sink``'s last failure waits for the operator, not for a next run: its
        backfill source cannot give a batch back as it was committed
        (:class:`fanout.errors.BackfillError`), its next batch lies past batches nothing
        holds for it (:class:`fanout.MissedBatchesError`), or its target lost batches the
        ledger marks written there (:class:`fanout.TargetLostError`), or its reopen's check
        found it renamed (:class:`fanout.RenamedSinkError`, :meth:`lose`)."""
        with self._lock:
            return sink in self._stuck

    def retry_at(self, sink: str, interval_s: float) -> float:
        """When (``time.monotonic()``) the catch-up may try ``sink`` again: ``interval_s``
        after its last failure, live or caught up (a sink that just failed a live batch is
        not probed at once)."""
        with self._lock:
            failed = self._failed_at.get(sink)
        return 0.0 if failed is None else failed + interval_s

    def _advance(self, sink: str, epoch: int, batch: int | None) -> None:
        if batch is None:
            self._marks.setdefault((sink, epoch), None)
            return
        current = self._marks.get((sink, epoch))
        if current is None or batch > current:
            self._marks[(sink, epoch)] = batch

    def lose(self, sink: str, error: Refusal) -> None:
        """``sink``'s target lost its last marked batch that wrote rows, or holds a batch
        of a sink it was renamed from (its reopen's check): it lags with ``error`` for the
        rest of the run, never written (:meth:`reopen` returns it), waiting for the
        operator (:meth:`stuck`)."""
        with self._lock:
            self._states.move(sink, Lost(error))
            self.failed(sink, error)  # lost: stuck

    def lose_each(self, lost: Mapping[str, Refusal]) -> None:
        """Each sink of ``lost`` lags with its error for the rest of the run (:meth:`lose`):
        the lag sinks a target check or a replay's check found lost."""
        for sink, error in lost.items():
            self.lose(sink, error)

    def held(self, sink: str) -> Held:
        """``sink``'s open/lost state, with its error (unopened, lost) or its reopen
        (:class:`fanout.steps.lag_state.SinkState`; lagging or live is :meth:`backlog`'s)."""
        return self._states.of(sink)

    def closed(self, sink: str) -> bool:
        """Whether ``sink`` may not be written: unopened, being reopened, or lost."""
        return self._states.of(sink).state is not SinkState.OPEN

    def not_opened(self) -> dict[str, BaseException]:
        """The sinks not opened yet (unopened, or their reopen still running), each with
        its last error, in configuration order (read at once)."""
        held = self._states.in_state(SinkState.UNOPENED, SinkState.OPENING)
        return {name: h.error for name, h in held.items() if isinstance(h, Unopened | Reopening)}

    def unasked(self) -> list[str]:
        """The sinks a run's first batch does not ask its target checks (§5): those not
        opened yet (unopened, or their reopen still running) and those lost (a reopen's
        check refused them before that batch: they lag with that refusal, recorded, for
        the rest of the run), in configuration order (read at once)."""
        states = (SinkState.UNOPENED, SinkState.OPENING, SinkState.LOST)
        return list(self._states.in_state(*states))

    def close(self) -> list[str]:
        """The pipeline stops: no reopen starts any more, and one still running closes
        the sink itself once its ``open()`` (and check) has returned (the caller must not
        close it: one closed before its ``open()`` returned would be left open). Returns
        the sinks the caller closes, in configuration order: those open (``OPEN``, or
        ``LOST``: opened, not written). An unopened one is not closed: its ``open()``
        failed, or its reopen's thread closed it after a failed check."""
        with self._lock:
            self._reopener.close()
            return list(self._states.in_state(SinkState.OPEN, SinkState.LOST))

    def reopening(self) -> list[str]:
        """The sinks whose reopen's thread holds them now (``OPENING``): after
        :meth:`close`, each is released by
        :attr:`fanout.steps.lag_reopen.ReopenHooks.on_released` once its thread is done."""
        return list(self._states.in_state(SinkState.OPENING))

    def reopen(self, sink: str, *, wait: bool = True) -> BaseException | None:
        """Open a sink that could not be opened when the pipeline started; ``None`` once
        it is open (now or before) and may be written, else the error: the open and its
        target checks in a thread of their own, waited for up to the sink's
        ``write_timeout_s`` (:meth:`fanout.steps.lag_reopen.Reopener.reopen`)."""
        return self._reopener.reopen(sink, wait=wait)

    def still_opening(self, sink: str, opening: Opening) -> None:
        """``sink``'s first ``open()``, at the pipeline's start, did not return within its
        ``write_timeout_s`` and runs on: its result is taken as a :meth:`reopen`'s
        (:meth:`fanout.steps.lag_reopen.Reopener.still_opening`)."""
        self._reopener.still_opening(sink, opening)

    # -- what a sink needs -----------------------------------------------------------

    def backlog(self, sink: str) -> Backlog:
        """The batches ``sink`` still needs, in batch order."""
        wanted: dict[BatchKey, None] = {}
        spooled = {} if self.spool is None else {b.key: b for b in self.spool.needed_by(sink)}
        for key in spooled:
            wanted[key] = None
        for key in self._backfill.missed(sink, self.epoch, self.needs):
            wanted[key] = None
        keys = sorted(k for k in wanted if self.needs(sink, k))
        held = [spooled[k] for k in keys if k in spooled]
        if self.spool is not None:  # a backfill batch may be in the spool for another sink
            held += [b for k in keys if k not in spooled and (b := self.spool.get(k))]
        return Backlog(
            sink,
            keys,
            spooled_rows=sum(b.rows for b in held),
            spooled=len(held),
            since=min((b.spooled_at for b in held), default=None),
        )

    def needs(self, sink: str, key: BatchKey) -> bool:
        """Whether ``sink`` still needs batch ``key``: its mark of the epoch is older, and
        the batch was not given up with a checkpoint reset (:meth:`abandoned`)."""
        done = self.mark(sink, key[0])
        return (done is None or done < key[1]) and not self.abandoned(key)

    # -- settled batches (fanout.steps.lag_settle) ----------------------------------

    def settled(self, key: BatchKey) -> bool:
        """Whether Spark will never give batch ``key`` up, so the catch-up may write it
        (docs/architecture.md §14.4, "Settled"). A batch is spooled inside foreachBatch,
        before Spark commits it, and also when a sink without ``on_failure="lag"`` fails
        it; written to a lagging sink before a replay commits it, a checkpoint reset
        could no longer make the sinks agree. Settled, by what this instance knows:

        - every configured sink holds it: its mark of the epoch is at or past it, the
          spool holds it for the sink, or the sink backfills from a sink that holds it
          (the batch's foreachBatch returned, in this process or another);
        - Spark planned a later batch of its epoch (it commits N before planning N+1): a
          sink's mark is past it, the spool holds a later batch, or one ran live here;
        - the running query's checkpoint holds ``commits/N`` (its epoch only).

        A batch of an epoch before the current one is judged on the ledger and the spool
        alone (its checkpoint was replaced): :func:`fanout.spool.settled.settled_on_record`,
        counting the sinks that took part in it (:func:`fanout.spool.settled.party_of`),
        not those configured now. Once settled, always settled
        (:class:`fanout.steps.lag_settle.Settlement` remembers it)."""
        return self._settlement.settled(key)

    def abandoned(self, key: BatchKey) -> bool:
        """Whether batch ``key`` of an epoch before the current one was given up with its
        checkpoint: not settled, and no replay will ever settle it (the old query is
        refused once a newer epoch exists). A reset resumes where ``fanout recover`` says,
        before it, so the new epoch reads its rows again: no sink may get it from the
        spool, which lets it go."""
        return self._settlement.abandoned(key)

    # -- backfill sources (fanout.steps.lag_backfill) --------------------------------

    def source_mark(self, sink: str, key: BatchKey) -> LedgerEntry | None:
        """The ledger mark of batch ``key`` by ``sink``'s backfill source (``None``: the
        source has none). A cached mark is the answer unless it is a lost mark or a skip's:
        that one is read again, since the batch's own mark may have replaced it, or been
        recorded beside it, since it was cached (its counts then known)."""
        return self._backfill.source_mark(sink, key)

    def finished_backfill(self, sink: str) -> None:
        """``sink`` has no backfill batch left at the start of a batch: stop asking its
        source (a later miss is spooled like any lagging sink's). Only a batch's hold-back
        may say so, under that batch's ledger lookup: the source holds no batch newer than
        the one before. The catch-up may empty the backlog while the source is still
        writing the live batch the sink was held back from; that batch is not spooled for
        the sink (its source holds it), so the sink must go on reading its source."""
        self._backfill.finish(sink)

    def backfilling(self, sink: str) -> bool:
        """Whether ``sink`` still reads its missed batches from its backfill source (so a
        batch the source writes need not be spooled for it)."""
        return self._backfill.backfilling(sink)

    # -- what observers and status see ----------------------------------------------

    def lag_of(self, sink: str, backlog: Backlog | None = None) -> SinkLag:
        """``sink``'s state: live, lagging (last attempt failed) or catching up."""
        backlog = self.backlog(sink) if backlog is None else backlog
        if not backlog:
            return SinkLag(sink, "live")
        with self._lock:
            error = self._errors.get(sink)
        return SinkLag(
            sink,
            "lagging" if error else "catching_up",
            batches=len(backlog.keys),
            rows=backlog.spooled_rows,
            since=backlog.since,
            error=error,
        )

    def lags(self) -> dict[str, SinkLag]:
        """Every lag-capable sink's state."""
        return {name: self.lag_of(name) for name in self.sinks}

    def spooled_through(self, epoch: int) -> dict[str, int]:
        """Per sink, the last batch of ``epoch`` the spool holds for it that a catch-up
        writes once the epoch is replaced (:func:`fanout.steps.lag_settle.spooled_through`;
        for the guard's refusals: a lagging sink's missed batches reach it from the spool)."""
        marked = [s for s in self.specs if self.mark(s, epoch) is not None]
        batches = [] if self.spool is None else self.spool.batches()
        return spooled_through(
            epoch, batches, lambda sink: self.mark(sink, epoch), marked, self._backfill.holds
        )

    # -- the spool's upkeep (fanout.steps.lag_release) -------------------------------

    def held_by_all(self) -> dict[BatchKey, frozenset[str]]:
        """Spooled batches every sink that needed them has committed, each with the sinks
        this instance knows needed it: only their index rows are removed (another instance
        may have spooled the batch for another sink since). A sink left out of the
        configuration still needs its batches, by its ledger marks: it may be put back
        (a sink removed for good releases them with ``fanout ledger skip``). A batch a
        sink's mark holds only by a ``fanout ledger skip`` made without the spool is kept
        for it (:meth:`given_up`): that skip could not see the rows still there."""
        return self._release.held_by_all()

    def given_up(self, pairs: Iterable[tuple[str, BatchKey]]) -> set[tuple[str, BatchKey]]:
        """Those of ``pairs`` (a sink, a spooled batch its mark holds) the sink's mark holds
        only by a ``fanout ledger skip``: its first mark at or after the batch is a skip's.
        A skip given the spool either refused them or released them itself
        (``release_spooled``), so a pair still in the spool was given up by a skip made
        without it. Pairs this instance saw committed are not read; the others are read
        from the ledger once (one scan per sink and epoch)."""
        return self._release.given_up(pairs)

    def kept_given_up(self) -> dict[tuple[str, int], list[SpooledBatch]]:
        """Per (sink, epoch), the spooled batches kept for the sink although a ledger skip
        made without the spool gave them up (see :meth:`held_by_all`)."""
        return self._release.kept_given_up()

    def release_held(self) -> int:
        """Remove from the spool the batches no sink needs any more (:meth:`held_by_all`),
        chosen and removed under the spool's lock: the live path may be spooling its batch,
        beside the catch-up, for a sink that just fell behind, and that sink must find it
        with its rows (a batch removed first is spooled again in full, see
        :meth:`fanout.spool.table.Spool.add`)."""
        return self._release.release(self.held_by_all)

    def release_orphans(self) -> int:
        """Remove the spooled rows of batches that have no index row (a removal or a
        spooling cut short) and that every lag-capable sink holds (its mark of the
        batch's epoch is at or past it), so that no sink can need them."""
        return self._release.release_orphans(self.sinks)


def over_limit(
    spec: SinkSpec, backlog: Backlog, adding: int, now: datetime | None = None
) -> str | None:
    """Why ``backlog`` (plus ``adding`` batches about to be spooled) passes the sink's
    ``max_lag``, or ``None``. Only spooled batches count: a backfill source's batches do
    not grow the spool."""
    policy = spec.lag
    count = backlog.spooled + adding
    if policy.max_lag_batches is not None and count > policy.max_lag_batches:
        return f"{count} batches > {policy.max_lag_batches}"
    if policy.max_lag_s is not None and backlog.since is not None:
        age = ((now or now_utc()) - backlog.since).total_seconds()
        if age > policy.max_lag_s:
            return f"oldest missed batch {age:.0f} s old > {policy.max_lag_s:g} s"
    return None


def sinks_in(names: Iterable[str], specs: Mapping[str, SinkSpec]) -> list[str]:
    """The lag-capable sinks among ``names``."""
    return [n for n in names if specs[n].lag.uses_spool]
