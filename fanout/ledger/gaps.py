"""The explicit acknowledgement that a sink never gets some batches (docs/architecture.md
§14.1): ``fanout ledger skip``.

fanout refuses to write a sink past batches it never received
(:class:`fanout.MissedBatchesError`). When they cannot be given back to it (no spool holds
them, no ``backfill_from`` source), the operator may accept the loss: :func:`skip_batches`
records a mark for the sink at the last batch it will never get, so the next batch writes
it again, and a spool's batches it still needed up to there are released. The mark says so
in its ``error`` column; it carries the plan (query id, offsets, planning time) of another
sink's mark of that batch when one exists, so the checkpoint guard reads it like any mark.
"""

from __future__ import annotations

from dataclasses import dataclass

from fanout.errors import ConfigurationError
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc

SKIPPED = "skipped"
"""How the ``error`` column of a skip's mark begins."""


def is_skip(entry: LedgerEntry) -> bool:
    """Whether ``entry`` is the mark of :func:`skip_batches`, not of a write."""
    return entry.status == "committed" and (entry.error or "").startswith(f"{SKIPPED}:")


@dataclass(frozen=True)
class Skipped:
    """What :func:`skip_batches` did: the sink's mark before and after, in ``epoch``."""

    sink: str
    epoch: int
    before: int | None
    through: int
    recorded: bool
    """``False`` when the sink's mark already held ``through`` (nothing written)."""


def skip_batches(
    ledger: Ledger, pipeline: str, sink: str, through: int, epoch: int | None = None
) -> Skipped:
    """Record that ``sink`` of ``pipeline`` will never receive the batches of ``epoch``
    (default: the pipeline's current epoch) after its mark, through ``through``.

    Refuses (:class:`fanout.ConfigurationError`) a batch no sink of the pipeline has
    committed in that epoch: the acknowledgement is of batches that ran, never of future
    ones (a mark past the pipeline's high-water mark would make the checkpoint guard
    refuse the next batch as a rolled-back checkpoint)."""
    if through < 0:
        raise ConfigurationError(f"pipeline {pipeline!r}, sink {sink!r}: --through must be >= 0")
    view = ledger.lookup(pipeline, [sink])
    epoch = view.epoch if epoch is None else epoch
    before = ledger.last_committed(pipeline, [sink], epoch).get(sink)
    if before is not None and before >= through:
        return Skipped(sink, epoch, before, before, recorded=False)
    same = [e for e in ledger.committed_entries(pipeline, through, epoch) if e.sink != sink]
    if not same:
        raise ConfigurationError(
            f"pipeline {pipeline!r}, sink {sink!r}: no other sink of the pipeline committed "
            f"batch {through} of epoch {epoch} or a later one; skip only batches that ran, "
            "through the batch before the one refused"
        )
    plan = next((e for e in same if e.batch_id == through), None)
    first = 0 if before is None else before + 1
    ledger.mark_committed(
        LedgerEntry(
            pipeline,
            sink,
            through,
            "committed",
            query_id=plan.query_id if plan else None,
            rows=0,
            finished_at=now_utc(),
            source_offsets=plan.source_offsets if plan else None,
            error=f"{SKIPPED}: batches {first}-{through} were never written to this sink "
            "(fanout ledger skip)",
            epoch=epoch,
            batch_timestamp_ms=plan.batch_timestamp_ms if plan else None,
        )
    )
    return Skipped(sink, epoch, before, through, recorded=True)
