"""A catch-up write of a backfilled batch that may have begun, recorded in the ledger before
it begins (docs/architecture.md §5, "A catch-up write killed before its mark"; §14.5).

A sink with ``backfill_from`` receives its earlier batches read back from its source's
target, not from the spool. A process killed after the catch-up's write of such a batch
began and before the sink's ledger mark leaves a batch Spark committed long ago: the next
run sees no replay, and once the sink's own records of its batches are gone (a Delta
table's app transactions expired, Kafka's marker groups) it would write the batch again.
A spooled batch's write is noted in the spool's index (:meth:`fanout.spool.table.Spool.
note_replayed`); a backfilled one is in no spool, so its note is one ledger row:

- ``begun``: of the sink (``sink``), the batch (``batch_id``, ``epoch``), written right
  before the catch-up's first write of the batch to the sink in a process. No error,
  offsets, query id or counts (nothing secret).

The catch-up reads it (:func:`began`) before it writes a backfilled batch it did not note
itself, and, found, asks the sink first (:meth:`fanout.steps.replay_lag.SpooledReplays.
backfill_refusal`). A row is never removed: it is read only for a batch the sink still
needs (its marks below the batch), so once the sink marks the batch (or a ``fanout ledger
skip`` does) it is never read again. No reader of marks, attempts or reports counts it
(each filters its statuses; ``fanout status`` and the sinks' names leave out
:data:`fanout.ledger.entry.OWN_ROWS`); the ledger's compaction keeps it like any row. One
read and one append per backfilled batch the catch-up writes (with rows, to a sink that
could be refused); nothing on the live path.
"""

from __future__ import annotations

from typing import Final

from fanout.ledger.entry import Ledger, LedgerEntry, now_utc

BEGUN: Final = "begun"
"""The status of the row noting that a catch-up write of a backfilled batch may begin."""


def record_begun(ledger: Ledger, pipeline: str, sink: str, epoch: int, batch_id: int) -> None:
    """Record, before the catch-up's first write of backfilled batch ``batch_id`` of
    ``epoch`` to ``sink`` in this process, that the write may begin. Raises what the
    ledger's append raises: the write must not begin then."""
    at = now_utc()
    ledger.record_begun(
        LedgerEntry(
            pipeline=pipeline,
            sink=sink,
            batch_id=batch_id,
            status=BEGUN,
            started_at=at,
            finished_at=at,
            epoch=epoch,
        )
    )


def began(ledger: Ledger, pipeline: str, sink: str, epoch: int, batch_id: int) -> bool:
    """Whether a catch-up write of backfilled batch ``batch_id`` of ``epoch`` to ``sink``
    may have begun before (a ``begun`` row). Raises what the ledger's read raises."""
    return ledger.begun(pipeline, sink, epoch, batch_id)
