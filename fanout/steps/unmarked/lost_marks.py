"""The marks the sinks lost, recorded at a new epoch's start: which sink's holding is
recorded as a harmless rewrite (:func:`needed_rewrites`), the ledger row of a lost mark
(:func:`lost_mark`), the source offsets it records, and the warning of a harmless
rewrite."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink
from fanout.ledger.entry import REWRITTEN, Ledger, LedgerEntry, now_utc, refused_query
from fanout.observe.logs import batch_fields
from fanout.steps.unmarked.held import Held
from fanout.steps.unmarked.held_text import REWRITE_WARNING

log = logging.getLogger("fanout")


def needed_rewrites(
    held: list[Held], marks: Mapping[str, int | None], sinks: Mapping[str, Sink],
    in_spool: Mapping[str, int],
) -> list[Held]:  # fmt: skip
    """``held``, where a harmless rewrite stays harmless only when the new epoch must write
    the batch anyway: some sink lacks it (no mark of it, does not hold it, has not spooled
    it), or every sink's rewrite is harmless. Otherwise every sink holds the batch and
    ``fanout recover`` (without ``--config``), counting the held sink at its mark before,
    said to resume before it: the new epoch would write it again to a sink that marked it
    (an append: its rows twice). Refused as before, the lost mark recorded, ``fanout
    recover`` then resumes after it."""
    all_harmless = all(sink.harmless_rewrite() is not None for sink in sinks.values())

    def lacking(batch: int) -> bool:
        holding = {h.sink for h in held if h.whole and h.mark + 1 == batch}
        return any(
            (mark is None or mark < batch)
            and name not in holding
            and in_spool.get(name, -1) < batch
            for name, mark in marks.items()
        )

    return [
        h if h.harmless is None or (h.whole and (all_harmless or lacking(h.mark + 1)))
        else replace(h, harmless=None)
        for h in held
    ]  # fmt: skip


def recorded_offsets(ledger: Ledger, pipeline: str, epoch: int, batch_id: int) -> str | None:
    """The source offsets the ledger recorded for ``batch_id`` of ``epoch`` (another
    sink's mark of it), or ``None``."""
    for entry in ledger.committed_entries(pipeline, batch_id, epoch):
        if entry.batch_id == batch_id and entry.source_offsets is not None:
            return entry.source_offsets
    return None


def warn_rewrite(info: BatchInfo, held: Held) -> None:
    """Log that ``held.sink`` gets a batch it holds again, harmlessly (its lost mark was
    recorded), instead of refusing the start."""
    log.warning(
        REWRITE_WARNING,
        info.pipeline, held.sink, held.mark + 1, info.epoch, info.epoch + 1, held.harmless,
        extra=batch_fields(info.pipeline, held.mark + 1, held.sink),
    )  # fmt: skip


def lost_mark_at_start(
    info: BatchInfo, held: Held, owner: str | None, offsets: str | None
) -> LedgerEntry:
    """The mark ``held.sink`` lost, recorded at the start of ``info``'s query."""
    recorded = _rewritten(info) if held.harmless is not None else refusal_prefix(info)
    return lost_mark(info.pipeline, info.epoch, held, owner, offsets, recorded)


def lost_mark(
    pipeline: str,
    epoch: int,
    held: Held,
    owner: str | None,
    offsets: str | None,
    recorded: str,
) -> LedgerEntry:
    """The mark ``held.sink`` lost: batch ``held.mark + 1`` of ``epoch``, by the epoch's
    query ``owner``; its ``error`` begins with ``recorded`` (who recorded it, starting with
    :data:`fanout.ledger.entry.LOST_MARK`). Its ``rows`` and ``dead_lettered`` stay null:
    the sink's records do not tell them (:func:`fanout.ledger.entry.is_lost_mark` tells
    readers)."""
    why = "the sink's own records hold the batch, its mark was lost"
    if held.harmless is not None:
        error = f"{recorded}: {why}; writing it again changes nothing: {held.harmless}"
    else:
        error = f"{recorded}: {why}"
    return LedgerEntry(
        pipeline,
        held.sink,
        held.mark + 1,
        "committed",
        query_id=owner,
        finished_at=now_utc(),
        source_offsets=offsets,
        error=error,
        epoch=epoch,
    )


def refusal_prefix(info: BatchInfo) -> str:
    """How a lost mark recorded at the refusal of ``info``'s query begins."""
    return refused_query(info.query_id, info.epoch)


def _rewritten(info: BatchInfo) -> str:
    """How a lost mark recorded at the start of ``info``'s query begins, when the sink
    holding the batch takes it again harmlessly (:meth:`fanout.Sink.harmless_rewrite`)."""
    return f"{REWRITTEN}: recorded when query {info.query_id} asked to start epoch {info.epoch + 1}"
