"""Step 3a of a batch: refuse to write a sink past batches it never received
(docs/architecture.md §14.1).

A sink's ledger mark says which batch of the epoch it committed last. Spark hands batches
in order, and a sink that missed some while lagging gets them from the spool or its
backfill source before the live path writes it again. When its mark is older than the
batch before this one and neither holds the batches in between, they are gone for it: its
spool was lost or replaced, or it was left out of the configuration while they ran. Writing
it now would skip them silently, so the batch is refused before any sink writes it.

Not refused: a sink with no mark in the epoch (new, or the epoch just started: it starts
with the current batch), a sink at the batch before or at the batch (a replay), a sink
whose spool or backfill source holds every batch in between.

A sink refused at a gap after batches its spool (or backfill source) still holds is first
given those, in order, up to the gap: a ``fanout ledger skip`` of the gap then passes no
batch whose rows are still there (a skip past one is refused).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fanout.contract.locations import command_location
from fanout.errors import MissedBatchesError
from fanout.ledger.entry import LedgerEntry, now_utc
from fanout.sink_spec import SinkSpec
from fanout.steps.lag import Lagging
from fanout.steps.state import BatchState

if TYPE_CHECKING:
    from fanout.steps.catchup import CatchUp

log = logging.getLogger("fanout")


def refuse_gaps(
    state: BatchState,
    lagging: Lagging,
    specs: Mapping[str, SinkSpec],
    ledger: str,
    catchup: CatchUp | None = None,
    *,
    pipeline_file: str | None = None,
) -> None:
    """Raise :class:`fanout.MissedBatchesError` for the first pending sink whose mark in the
    batch's epoch is below ``batch_id - 1`` with batches in between that nothing will give
    it, after ``catchup`` wrote it the held batches before the first missing one. ``ledger``
    is the ledger's location and ``pipeline_file`` the pipeline file's (absolute, when
    known), for the command the message names. Reads nothing on the common path (every
    mark at ``batch_id - 1`` or later)."""
    if not state.marks:
        return
    epoch, batch_id = state.info.epoch, state.batch_id
    for name in state.pending:
        mark = state.marks.get(name)
        if mark is None or mark >= batch_id - 1:
            continue
        lagging.saw_marks(epoch, state.marks)  # the backlog reads the epoch and marks
        mark, held = _held(lagging, specs[name], epoch, mark)
        missing = [b for b in range(mark + 1, batch_id) if b not in held]
        if missing and catchup is not None and any(b < missing[0] for b in held):
            mark, held = _catch_up_to(catchup, lagging, specs[name], epoch, mark, missing[0])
            missing = [b for b in range(mark + 1, batch_id) if b not in held]
        if missing:
            spooled = sorted(b for b in held if mark < b < batch_id)  # after the gap too
            newest = _newest_mark(lagging, state)
            error = MissedBatchesError(
                state.info.pipeline,
                name,
                epoch,
                mark,
                batch_id,
                missing,
                ledger,
                spooled,
                backfill_from=specs[name].lag.backfill_from,
                spool=None if lagging.spool is None else command_location(lagging.spool.path),
                config=pipeline_file,
                no_mark_since=newest if newest is not None and newest < batch_id - 1 else None,
            )
            if error.no_mark_since is not None:
                _record_refusal(lagging, state, name, error)
            raise error


def _newest_mark(lagging: Lagging, state: BatchState) -> int | None:
    """The newest mark of any sink of the pipeline in the batch's epoch (``None``: none, or
    the ledger unreadable): the configured sinks' marks, and the ledger's high-water mark,
    which a sink left out of the configuration also raised. One log-only lookup, on a
    refusal only."""
    info = state.info
    marks = [m for m in (state.marks or {}).values() if m is not None]
    try:
        view = lagging.ledger.lookup(info.pipeline, [])
    except Exception as exc:  # the refusal stands; only its cause cannot be told
        log.warning(
            "pipeline %s, batch %s: could not read the ledger's high-water mark (%s)",
            info.pipeline, info.batch_id, exc,
        )  # fmt: skip
        return None
    if view.epoch == info.epoch and view.high_water is not None:
        marks.append(view.high_water)
    return max(marks, default=None)


def _record_refusal(
    lagging: Lagging, state: BatchState, sink: str, error: MissedBatchesError
) -> None:
    """Record the refusal as a failed attempt of ``sink`` at the refused batch, when no
    sink of the pipeline marked the batch before it (a ledger restored from an older copy,
    or every sink's spool lost): the row is the ledger's only evidence that Spark ran the
    batches before it, which ``fanout ledger skip`` needs to accept them
    (:func:`fanout.ledger.gaps.skip_batches`). Best effort: a failure is logged."""
    info = state.info
    try:
        lagging.ledger.record_failure(
            LedgerEntry(
                info.pipeline,
                sink,
                info.batch_id,
                "failed",
                query_id=info.query_id,
                finished_at=now_utc(),
                source_offsets=None,
                error=f"MissedBatchesError: {error}",
                epoch=info.epoch,
            )
        )
    except Exception as exc:
        log.warning(
            "pipeline %s, batch %s, sink %s: could not record the gap's refusal in the "
            "ledger (%s); `fanout ledger skip` may refuse the batches before it",
            info.pipeline, info.batch_id, sink, exc,
        )  # fmt: skip


def _catch_up_to(
    catchup: CatchUp, lagging: Lagging, spec: SinkSpec, epoch: int, mark: int, gap: int
) -> tuple[int, set[int]]:
    """Write ``spec``'s sink the held batches before batch ``gap``, in order (stopping at
    a failure: they stay held); its mark and held batches afterwards."""

    def reached() -> bool:
        done = lagging.mark(spec.name, epoch)
        return done is not None and done >= gap - 1

    failed = catchup.drain(spec.name, until=reached)
    if failed is not None:
        log.warning(
            "pipeline %s, sink %s: the batches held for it before batch %s (missed) could "
            "not be written to it: %s",
            lagging.pipeline,
            spec.name,
            gap,
            failed,
        )
    return _held(lagging, spec, epoch, mark)


def _held(lagging: Lagging, spec: SinkSpec, epoch: int, mark: int) -> tuple[int, set[int]]:
    """``spec``'s sink's mark in ``epoch`` and the batches of ``epoch`` after it that the
    spool or its backfill source will give it."""
    if not spec.lag.uses_spool:
        return mark, set()
    held = {key[1] for key in lagging.backlog(spec.name).keys if key[0] == epoch}
    # read after the backlog: a batch the catch-up marked meanwhile left the backlog, and
    # its mark is at least as new
    return max(mark, lagging.mark(spec.name, epoch) or mark), held
