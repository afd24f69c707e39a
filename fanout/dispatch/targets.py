"""The checks of the sinks' targets that refuse a run before a sink writes
(docs/architecture.md §5): at a checkpoint reset, before the new epoch starts (a batch a
sink wrote but never marked, a renamed sink, a lost target); at the run's first batch (a
lost target, a renamed sink); before a catch-up that writes ahead of that batch; and for a
lag sink that could not be opened at the start, once it is. A lag sink a check refuses
lags with the refusal (:meth:`fanout.steps.lag.Lagging.lose`) instead of refusing the run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink
from fanout.errors import BatchFailedError, RenamedSinkError, TargetLostError
from fanout.ledger.entry import Ledger, ledger_location
from fanout.sink_spec import SinkSpec, write_timeouts
from fanout.spool.table import Spool
from fanout.steps import renamed, unmarked
from fanout.steps.lag import Lagging
from fanout.steps.lost_target import earlier_marks, refuse_lost_targets
from fanout.steps.state import BatchState

log = logging.getLogger("fanout")


class TargetChecks:
    """The target checks of one run of ``pipeline``, and what they remember: whether the
    run's first batch asked the targets yet, which batch that was, and the fences a
    checkpoint reset's start made.

    :param accepted: the sinks whose lost target this run accepts
        (``FanOut(accept_lost_targets=...)``).
    :param pipeline_file: the pipeline file, as the commands fanout prints name it."""

    def __init__(
        self,
        pipeline: str,
        ledger: Ledger,
        specs: Mapping[str, SinkSpec],
        sinks: Mapping[str, Sink],
        spool: Spool | None,
        lagging: Lagging,
        *,
        accepted: Collection[str],
        pipeline_file: str | None,
    ) -> None:
        self.pipeline = pipeline
        self.ledger = ledger
        self.specs = specs
        self.sinks = sinks  # the FanOut's own mapping
        self.spool = spool
        self.lagging = lagging
        self.accepted = accepted
        self.pipeline_file = pipeline_file
        self.targets_checked = False
        """Whether this run's first batch asked each sink's target for its last mark."""
        self.renamed_checked = False
        """Whether this run's first batch asked for a renamed sink (fanout.steps.renamed;
        a catch-up's check of the targets before it does not)."""
        self.renamed_first: tuple[int, int] | None = None
        """The run's first batch (epoch, batch id) when its renamed check ran: what a lag
        sink opened later, not asked then, is asked about (:meth:`renamed_reopened`)."""
        self.reopen_asked: dict[str, tuple[int, int] | None] = {}
        """Each reopened sink's :attr:`renamed_first` when its reopen's check began
        (:meth:`reopen_stale`)."""
        self.fenced: list[Sink] = []  # the sinks the last epoch start fenced

    def refuse_unmarked(self, info: BatchInfo, before_fence: Callable[[], None]) -> None:
        """Before a new epoch starts, the checks that can refuse its first batch, all
        before the ledger's ``epoch`` row (the claim) and before any fence, so a refused
        reset changes nothing: refuse the start when a sink with no mark of the epoch holds
        the batch after a vanished sink's last mark under that sink's name (renamed between
        a crash and the reset: :func:`fanout.steps.renamed.refuse_renamed_at_reset`), when
        the spool holds the new epoch's batch of another query
        (:meth:`Spool.check <fanout.spool.table.Spool.check>`), when a sink's target lost
        its last marked batch of the epochs before (the run's lost-target check,
        :meth:`refuse_lost`; a lag sink lags with it instead), when an open sink holds
        the batch after its last mark of the epoch replaced, or when the ledger would
        refuse the start (``before_fence``:
        :meth:`Admission.check_start <fanout.steps.admit.Admission.check_start>`); else
        close that epoch to the sinks' writes still in flight and ask again
        (:mod:`fanout.steps.unmarked`)."""
        not_opened = self.lagging.not_opened()
        opened = {n: s for n, s in self.sinks.items() if n not in not_opened}
        spooled = None if self.spool is None else self.lagging.spooled_through
        timeouts = write_timeouts(self.specs, opened)
        unopened = {  # a sink type that cannot tell passes unasked, opened or not
            n: error
            for n, error in not_opened.items()
            if unmarked.answers_holds_batch(self.sinks[n])
        }
        refusal = renamed.refuse_renamed_at_reset(
            self.pipeline, info.epoch, self.ledger, self.specs, opened, timeouts,
            self.spooled(info.epoch),
        )  # fmt: skip
        if refusal is not None:  # before any fence: nothing of the start is written
            raise refusal
        if self.spool is not None:  # the lag step's check of the new epoch's key: refused
            # after the claim, its way on (the original checkpoint) would be superseded
            self.spool.check(replace(info, epoch=info.epoch + 1))
        # the first batch's lost-target check, asked before the claim (the new epoch has no
        # marks: each sink about its last mark of the epochs before), so a reset it refuses
        # starts nothing: no epoch row, no fence, the replaced checkpoint still resumes
        self.refuse_lost(info.epoch + 1, {}, info.query_id, reset=True)
        self.fenced = unmarked.refuse_unmarked(
            info, self.ledger, opened, spooled, timeouts, unopened,
            before_fence=before_fence, accepted=self.accepted,
        )  # fmt: skip
        # only now: a start refused leaves the next batch this FanOut gets (the replaced
        # checkpoint resumed, or the reset again) to ask the targets again
        self.targets_checked = True

    def lift_fences(self, info: BatchInfo) -> None:
        """The ledger refused the epoch start :meth:`refuse_unmarked` passed (the old
        epoch's query committed a batch after the report the start was made from): lift
        the fences it made, since that query still writes the replaced epoch."""
        timeouts = write_timeouts(self.specs, self.sinks)
        unmarked.lift_fences(info, self.fenced, timeouts, self.ledger)
        self.fenced = []
        self.targets_checked = False  # the start refused: the next batch asks them again

    def check_targets(self, state: BatchState) -> None:
        """Once per run, before its first batch writes: refuse it when a sink's target no
        longer holds its last marked batch (:mod:`fanout.steps.lost_target`). A checkpoint
        reset's run asked that before its new epoch started (:meth:`refuse_unmarked`)."""
        if not self.targets_checked:  # a new epoch has no marks: each sink's earlier ones
            self.refuse_lost(state.info.epoch, state.marks or {}, state.info.query_id)
            self.targets_checked = True
        if not self.renamed_checked:  # not by a catch-up's check before the first batch
            if state.marks is not None:  # before it reads which sinks are open
                self.renamed_first = (state.info.epoch, state.info.batch_id)
                self.refuse_renamed(state)
            self.renamed_checked = True

    def refuse_renamed(self, state: BatchState) -> None:
        """Refuse the run when a sink with no mark in the epoch finds in its target the
        run's first batch written under the name of a sink the pipeline no longer
        configures: renamed between a crash and its replay
        (:mod:`fanout.steps.renamed`). One with batches spooled for it before the run's
        first is also asked about the first of them, the one it would write first (as
        :meth:`renamed_reopened` asks it: a reopen's refusal is refused again at the next
        start; one more read of the ledger's sink names for each such sink)."""
        assert state.marks is not None
        unasked = self.lagging.unasked()  # a sink a reopen's check refused lags with that
        opened = {n: s for n, s in self.sinks.items() if n not in unasked}
        timeouts = write_timeouts(self.specs, opened)
        info = state.info
        spooled = self.spooled(info.epoch)
        refused = renamed.refuse_renamed(
            self.pipeline, info.epoch, info.batch_id, self.ledger, self.specs, opened,
            state.marks, timeouts, spooled,
        )  # fmt: skip
        for name, sink in opened.items():  # one with batches spooled for it before B
            own = [] if spooled is None else sorted(spooled.batches.get(name, ()))
            if name in refused or state.marks.get(name) is not None or not own:
                continue
            if own[0] < info.batch_id:  # writes that one first: asked about it, as at reopen
                refused.update(renamed.refuse_renamed(
                    self.pipeline, info.epoch, own[0], self.ledger, self.specs, {name: sink},
                    state.marks, timeouts, spooled,
                ))  # fmt: skip
        if refused:
            for error in refused.values():
                log.error("%s", error)
            raise BatchFailedError(self.pipeline, info.batch_id, refused)

    def spooled(self, epoch: int) -> renamed.Spooled | None:
        """What the spool keeps of ``epoch``, for each sink (``None``: no spool)."""
        if self.spool is None:
            return None
        kept: dict[str, list[int]] = {}
        for batch in self.spool.batches():
            if batch.epoch == epoch:
                for name in batch.needed_by:
                    kept.setdefault(name, []).append(batch.batch_id)
        return renamed.Spooled(self.spool.path, ledger_location(self.ledger), kept)

    def renamed_reopened(
        self, name: str, epoch: int, marks: Mapping[str, int | None]
    ) -> RenamedSinkError | None:
        """The run's renamed check (:meth:`refuse_renamed`) of ``name``, a lag sink that
        could not be opened at the run's first batch, so not asked then, once it is open
        and before its first write (:meth:`ask_reopened`). Asked about the first batch it
        would write: the first the spool keeps of the ledger's current ``epoch`` for it,
        else the run's first batch; not before that batch's check (it asks the sink, open
        by then), nor for a sink with a mark in the epoch (``marks``)."""
        if marks.get(name) is not None:
            return None
        first = self.renamed_first
        first_id = first[1] if first is not None and first[0] == epoch else None
        spooled = self.spooled(epoch)
        own = sorted(spooled.batches.get(name, ())) if spooled is not None else []
        batch = own[0] if own else first_id
        if batch is None:
            return None
        if spooled is not None and first_id is not None and own:
            # the batches spooled for it from the run's first on are this run's, kept only
            # because it was not opened: they do not make its name one the spool knew
            kept = dict(spooled.batches)
            earlier = [b for b in own if b < first_id]
            if earlier:
                kept[name] = earlier
            else:
                del kept[name]
            spooled = renamed.Spooled(spooled.spool, spooled.ledger, kept)
        # no mark in the epoch and nothing spooled for it before the run's first batch: a
        # ledger row naming it may be this run's own failure row (written when it could not
        # be opened), which does not make its name one the ledger knew
        fresh = spooled is not None and first_id is not None and name not in spooled.batches
        refused = renamed.refuse_renamed(
            self.pipeline, epoch, batch, self.ledger, self.specs, {name: self.sinks[name]},
            marks, write_timeouts(self.specs, (name,)) or None, spooled,
            (name,) if fresh else (),
        ).get(name)  # fmt: skip
        if refused is not None:
            log.error(
                "%s. The sink lags with this error for the rest of the run (on_failure="
                "'lag'), nothing written to it; the other sinks go on", refused,
            )  # fmt: skip
        return refused

    def check_before_catch_up(self) -> None:
        """:meth:`check_targets` for a catch-up that may write before the run's first
        batch (the catch-up started with the query, a final catch-up of a run that ran no
        batch): a catch-up is a write, and one into a target recreated empty would make
        the loss silent (its marks then held there). The marks of the ledger's current
        epoch, which the query owns (:func:`fanout.steps.resume.why_wait`)."""
        if self.targets_checked:
            return
        unasked = self.lagging.unasked()
        self.lagging.lose_each(self.lost_on_ledger([n for n in self.sinks if n not in unasked]))
        self.targets_checked = True

    def refuse_lost(
        self,
        epoch: int,
        marks: Mapping[str, int | None],
        query_id: str | None = None,
        *,
        reset: bool = False,
    ) -> None:
        """Refuse the run when a sink's target lost its last marked batch; a sink with
        ``on_failure="lag"`` lags with that error instead (:meth:`Lagging.lose`): the
        others go on; one a reopen's check refused before lags with that refusal.
        ``reset``: asked before a checkpoint reset starts ``epoch``, which a refusal leaves
        unstarted (its message says so, and that the way on is the reset again)."""
        unasked = self.lagging.unasked()
        opened = {n: s for n, s in self.sinks.items() if n not in unasked}
        self.lagging.lose_each(self.lost_targets(opened, epoch, marks, query_id, reset=reset))

    def lost_targets(
        self,
        sinks: Mapping[str, Sink],
        epoch: int,
        marks: Mapping[str, int | None],
        query_id: str | None = None,
        *,
        reset: bool = False,
    ) -> dict[str, TargetLostError]:
        """The lost-target check of ``sinks`` about their ``marks`` of ``epoch``; a sink
        with no mark there (a checkpoint reset's new epoch, or a sink lagging since before
        it) about its last mark of the newest epoch before that holds one
        (:func:`fanout.steps.lost_target.earlier_marks`). ``query_id``: the run's query,
        whose refused start of ``epoch`` wrote lost marks of the epoch before it.
        ``reset``: ``epoch`` is a checkpoint reset's, not started yet."""
        timeouts = write_timeouts(self.specs, sinks)
        lags = [n for n in sinks if self.specs[n].lag.lags]
        lost = refuse_lost_targets(
            self.pipeline, epoch, self.ledger, sinks, marks,
            self.accepted, timeouts, self.pipeline_file, lags,
        )  # fmt: skip
        unmarked_sinks = [n for n in sinks if marks.get(n) is None]
        for before, found in earlier_marks(self.ledger, self.pipeline, unmarked_sinks, epoch):
            lost |= refuse_lost_targets(
                self.pipeline, before, self.ledger, {n: sinks[n] for n in found}, found,
                self.accepted, timeouts, self.pipeline_file, lags,
                query_id if before == epoch - 1 else None, self.specs,
                reset_to=epoch if reset else None,
            )  # fmt: skip
        return lost

    def ask_reopened(self, name: str) -> TargetLostError | RenamedSinkError | None:
        """The checks of a lagging sink that could not be opened at the run's start, asked
        once it is (:meth:`Lagging.reopen`), before its first write, as the run's first
        batch asks the others: the lost-target check about its marks of the ledger's
        current epoch, then the renamed check (:meth:`renamed_reopened`). Its refusal
        does not stop the run: the sink lags with it (:meth:`Lagging.lose`)."""
        self.reopen_asked[name] = self.renamed_first  # read before the check
        view = self.ledger.lookup(self.pipeline, [name])
        lost = self.lost_targets({name: self.sinks[name]}, view.epoch, view.marks).get(name)
        if lost is not None:
            return lost
        return self.renamed_reopened(name, view.epoch, view.marks)

    def reopen_stale(self, name: str) -> bool:
        """Whether ``name``'s reopen check (:meth:`ask_reopened`), which let it write, began
        before the run's first batch's renamed check, which has run since: that check may
        have read ``name`` as not opened (``OPENING``) and not asked it, and this one had no
        first batch to ask about, so it is asked again. Called under the lag state's lock
        before ``name`` moves to ``OPEN``; the batch sets :attr:`renamed_first` before it
        reads, under that lock, which sinks are open: one of the two sees the other."""
        return self.reopen_asked.get(name) != self.renamed_first

    def lost_on_ledger(self, names: Sequence[str]) -> dict[str, TargetLostError]:
        """The lost-target check of the sinks ``names`` (open) about their marks of the
        ledger's current epoch, read now."""
        view = self.ledger.lookup(self.pipeline, list(names))
        return self.lost_targets({n: self.sinks[n] for n in names}, view.epoch, view.marks)
