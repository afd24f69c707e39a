"""Step 3 of a batch: which sinks still need it, and which already committed it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fanout.ledger.entry import Ledger
from fanout.steps.state import BatchState


def plan(state: BatchState, ledger: Ledger, sinks: Iterable[str]) -> tuple[list[str], list[str]]:
    """Fill ``state.pending`` (ledger mark older than the batch, or none) and
    ``state.skipped`` (the others) and return both; reads the ledger only when
    ``state.marks`` was not read with the guard's view."""
    names = list(sinks)
    marks: Mapping[str, int | None] | None = state.marks
    if marks is None:
        marks = ledger.last_committed(state.info.pipeline, names, state.info.epoch)
        state.marks = marks
    batch_id = state.info.batch_id
    state.pending = [s for s in names if (done := marks.get(s)) is None or done < batch_id]
    state.skipped = [s for s in names if s not in state.pending]
    return state.pending, state.skipped
