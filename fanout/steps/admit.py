"""Step 2 of a batch, as the dispatcher takes it: read the ledger once, run the checkpoint
guard (:mod:`fanout.steps.guard`), and either refuse the batch or admit it, in the current
epoch or, for a reset accepted with ``on_checkpoint_reset="new_epoch"``, in a new one. A
query that owned an earlier epoch (an old checkpoint restored after such a reset) gets no
new epoch: the later epoch's query already wrote the input it would plan next. The first
query admitted into epoch 0 claims it in the ledger before any sink writes, so its owner is
known even when the query died before marking anything."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Literal

from fanout.contract.batch import BatchInfo
from fanout.errors import CheckpointResetError, ZombieBatchError
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc
from fanout.observe.logs import batch_fields
from fanout.steps.guard import CheckpointGuard
from fanout.steps.state import BatchState

log = logging.getLogger("fanout")

OnReset = Literal["refuse", "new_epoch"]


class Admission:
    """Admits each batch of one pipeline, or refuses it (see :meth:`admit`).

    :param ledger: the pipeline's ledger.
    :param before_start: called with a batch whose reset is accepted (its ``epoch`` still
        the one it replaces) before the new epoch's start is committed: raises to refuse
        the start with nothing of it written (the checks that can refuse the new epoch's
        first batch: a sink renamed at the reset, a target lost, the batch a sink wrote
        but never marked, :func:`fanout.steps.unmarked.refuse_unmarked`).
    :param start_refused: called with the same batch when the ledger then refuses the
        start for a batch the old epoch's query committed after the ``fanout recover``
        report it starts from (:class:`fanout.ZombieBatchError`): the new epoch did not
        start, so what ``before_start`` did for it is undone (the sinks' fences of the
        replaced epoch, :func:`fanout.steps.unmarked.lift_fences`: that query still
        writes). Not for a start another query made first (the epoch is then theirs).
    :param on_reset: what a checkpoint reset does: ``"refuse"`` raises
        :class:`fanout.CheckpointResetError`; ``"new_epoch"`` starts a new epoch, owned by
        the batch's query id. A rolled-back checkpoint is always refused
        (:class:`fanout.CheckpointRollbackError` is not a
        :class:`fanout.CheckpointResetError`), and so is the batch of a query that owned an
        earlier epoch (a :class:`fanout.CheckpointResetError` naming the newest query).
    """

    def __init__(
        self,
        ledger: Ledger,
        on_reset: OnReset,
        before_start: Callable[[BatchInfo], None] | None = None,
        start_refused: Callable[[BatchInfo], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.on_reset = on_reset
        self.guard = CheckpointGuard(ledger)
        self.before_start = before_start
        self.start_refused = start_refused

    def admit(self, df: Any, info: BatchInfo, sinks: Iterable[str]) -> BatchState:
        """The batch's state, admitted in the pipeline's current epoch (with the sinks'
        marks read in the same ledger lookup), or in a new epoch (no marks yet).

        The first query admitted into epoch 0 claims it (an ``epoch`` row, before any sink
        writes), so a replaced checkpoint is refused even when its predecessor left no
        mark. Of two first queries racing, the second is refused, under ``new_epoch`` too:
        two checkpoints running at once are no reset to continue from."""
        view = self.ledger.lookup(info.pipeline, sinks)
        info = replace(info, epoch=view.epoch)
        try:
            self.guard.check(info, view.high_water)
        except CheckpointResetError as reset:
            if self.on_reset != "new_epoch":
                raise
            try:
                self.guard.refuse_superseded(info)
            except CheckpointResetError as superseded:
                raise superseded from reset
            if self.before_start is not None:
                try:
                    self.before_start(info)
                except CheckpointResetError as unmarked:
                    raise unmarked from reset
            try:
                started = self._start_epoch(info, reset)
            except ZombieBatchError:
                if self.start_refused is not None:
                    self.start_refused(info)
                raise
            self.guard.started_epoch(started)
            return BatchState(df, started)
        if not view.owner_recorded and info.query_id is not None:
            try:
                self.ledger.start_epoch(self._epoch_row(info, info.epoch))
            except CheckpointResetError:
                self.guard.forget(info.pipeline)  # it took this query for the owner
                raise
            log.info(
                "pipeline %s: epoch %s claimed by query %s at batch %s",
                info.pipeline,
                info.epoch,
                info.query_id,
                info.batch_id,
                extra=batch_fields(info.pipeline, info.batch_id),
            )
            self.guard.started_epoch(info)
        return BatchState(df, info, marks=view.marks)

    def check_start(self, info: BatchInfo) -> None:
        """Raise what the ledger's start of the epoch after ``info``'s would, without
        starting it (:meth:`Ledger.check_start <fanout.ledger.entry.Ledger.check_start>`):
        another query started it first, or the old
        epoch's query committed a batch after the ``fanout recover`` report it starts from
        (:class:`fanout.ZombieBatchError`). Called by ``before_start`` before it fences the
        sinks (:func:`fanout.steps.unmarked.refuse_unmarked`): a start refused here fences
        nothing, so nothing is lifted (``start_refused``)."""
        self.ledger.check_start(self._epoch_row(info, info.epoch + 1))

    def _start_epoch(self, info: BatchInfo, reset: CheckpointResetError) -> BatchInfo:
        """Start the next epoch for ``info``'s query; the ledger refuses it when another
        query started it first, or when the ``fanout recover`` report it starts from was
        passed by the old epoch's query (:class:`fanout.ZombieBatchError`)."""
        epoch = info.epoch + 1
        self.ledger.start_epoch(self._epoch_row(info, epoch))
        log.warning(
            "pipeline %s: checkpoint reset accepted (on_checkpoint_reset='new_epoch'); "
            "query %s continues under epoch %s with new transaction ids from batch %s.%s",
            info.pipeline,
            info.query_id,
            epoch,
            info.batch_id,
            _ledger_facts(reset),
            extra=batch_fields(info.pipeline, info.batch_id),
        )
        return replace(info, epoch=epoch)

    @staticmethod
    def _epoch_row(info: BatchInfo, epoch: int) -> LedgerEntry:
        """The ``epoch`` row by which ``info``'s query starts (or claims) ``epoch``."""
        offsets = None if info.source_offsets is None else json.dumps(info.source_offsets)
        return LedgerEntry(
            pipeline=info.pipeline,
            sink="*",
            batch_id=info.batch_id,
            status="epoch",
            query_id=info.query_id,
            started_at=now_utc(),
            source_offsets=offsets,
            epoch=epoch,
            batch_timestamp_ms=info.batch_timestamp_ms,
        )


def _ledger_facts(reset: CheckpointResetError) -> str:
    """What the ledger knew per sink, from the refusal ``reset`` a new epoch overrode: its
    lines between the verdict ("fanout refuses to write") and "How to proceed:", whose
    ways on (among them the flag just given) no longer apply; "" when it names none."""
    lines = str(reset).splitlines()
    end = lines.index("How to proceed:") if "How to proceed:" in lines else len(lines)
    return "".join(f"\n{line}" for line in lines[1:end])
