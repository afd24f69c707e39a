"""A query refused before for a batch held unmarked, started again on its checkpoint
(:func:`refuse_restart`): refused again while a sink would get that batch a second time."""

from __future__ import annotations

from collections.abc import Mapping

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink
from fanout.errors import UnmarkedBatchError
from fanout.ledger.entry import Ledger
from fanout.ledger.gaps import SKIPPED
from fanout.steps.holds import Warn
from fanout.steps.unmarked.asking import ask
from fanout.steps.unmarked.held import held_refusal
from fanout.steps.unmarked.held_text import restart_message, wrote_message
from fanout.steps.unmarked.lost_marks import recorded_offsets, refusal_prefix


def refuse_restart(
    info: BatchInfo,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    unmarked: Mapping[str, int],
    bounds: Mapping[str, float],
    warn: Warn | None = None,
) -> None:
    """Refuse ``info``'s query when a start of it was refused before for the batch every
    sink now counts (each sink's mark at or past it) and a sink that lost its mark of it
    still holds it: the query's checkpoint starts before that batch (it was refused for
    re-reading it), so it would write the batch to that sink a second time. The next
    ``fanout recover`` resumes after the batch (nothing made the refusal's choice 1 of
    resuming before it), and the restarted query, asked about the batch after, passed.

    ``unmarked``: where a sink without a mark in the epoch counts (its last spooled batch,
    else the batch before the epoch's first): the refusal's choice 1 for a sink that held
    the epoch's first batch resumes at the epoch's start, which such a sink keeps below it."""
    counted = {name: unmarked[name] if mark is None else mark for name, mark in marks.items()}
    if info.query_id is None or not counted:
        return
    batch = min(counted.values())
    at_batch = [  # a lost mark the old batch's own mark replaced since names the refusal too
        entry
        for entry in ledger.committed_entries_with_replaced(info.pipeline, batch, info.epoch)
        if entry.batch_id == batch and counted.get(entry.sink) == batch
    ]
    lost = sorted({e.sink for e in at_batch if (e.error or "").startswith(refusal_prefix(info))})
    if not lost:
        return
    wrote = sorted(  # a held sink's own mark is of the copy its lost mark counted
        {
            e.sink
            for e in at_batch
            if not e.lost and not (e.error or "").startswith(SKIPPED) and e.sink not in lost
        }
    )
    if wrote:  # removing the lost mark's copy cannot help these
        offsets = recorded_offsets(ledger, info.pipeline, info.epoch, batch)
        message = wrote_message(info, ledger, lost, wrote, batch, offsets)
        raise UnmarkedBatchError(message, sinks=lost, batch_id=batch, epoch=info.epoch)
    asked = (
        ask(sinks[name], info.pipeline, info.epoch, batch - 1, bounds.get(name), warn)
        for name in lost
    )
    # every sink counts the batch: the rewrite is harmless only when it is for every sink
    all_harmless = all(sink.harmless_rewrite() is not None for sink in sinks.values())
    held = [h for h in asked if h.holds and (h.harmless is None or not all_harmless)]
    if held:
        offsets = recorded_offsets(ledger, info.pipeline, info.epoch, batch)
        raise held_refusal(restart_message(info, ledger, held, batch, offsets), held, info.epoch)
