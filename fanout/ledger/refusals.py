"""A batch fanout refused before any sink wrote it, recorded in the ledger, so that its
replay is not taken for a batch written and never marked (docs/architecture.md §4,
"Refused batches"; docs/proposals/replay-detection.md §3).

Spark replays a batch whose foreachBatch call raised with the batch's original planning
time (``batchTimestampMs``), as it replays one a crash cut short. A replay whose sink can
no longer tell whether it holds the batch (its own records expired or deleted) is refused
(the replay check): the attempt before may have written it. But when fanout itself refused
every earlier attempt before any write (``fanout run``'s clean stop, the checkpoint guard,
a lost target, a renamed sink...), nothing was written, and refusing the replay would be
false. So such an attempt appends one row:

- ``refused``: batch ``batch_id`` of ``epoch``, planned at ``batch_timestamp_ms``, left
  fanout with no sink write begun, and it was the batch's first attempt (not a replay: a
  replay's earlier attempt may have written, and a row of it would let the next replay
  pass behind it);
- ``admitted``: an attempt not certainly the batch's first (a replay) that goes on to
  write, appended before its first write, whether or not it read such a row (one may still
  land late): from then on an attempt may have written, and the next replay is judged as
  any other.

:func:`refused_unwritten` reads them: the newest ``refused`` row of the batch has its
planning time and no ``admitted`` row came after it. The rows' order is their ``attempt``
(1, 2, ... per pipeline, epoch and batch), not their times (the drivers' clocks) nor the
order they landed in: a row's number is taken from the read of the batch's rows just
before its append, so a ``refused`` row whose slow append lands after an ``admitted`` row
appended meanwhile (read later, seeing at least what it saw) is numbered at or below it,
and a tie goes to ``admitted``. Both
rows have sink :data:`NO_SINK` and carry no error, offsets or query id (nothing secret).
No reader of marks, attempts or reports counts them (every reader filters its statuses;
``fanout status`` and :meth:`~fanout.ledger.delta.DeltaLedger.sink_names` leave out
:data:`fanout.ledger.entry.OWN_ROWS`); the ledger's compaction keeps them like any row.
Rows only on refusals and replays: nothing on a batch's normal path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

from fanout.ledger.entry import Ledger, LedgerEntry, now_utc

REFUSED: Final = "refused"
"""The status of the row of a batch's first attempt refused before any sink write."""

ADMITTED: Final = "admitted"
"""The status of the row of a replay of a refused batch that goes on to write it."""

NO_SINK: Final = "*"
"""The ``sink`` of both rows: they are of the batch, not of one sink."""


def record_refused(
    ledger: Ledger,
    pipeline: str,
    epoch: int,
    batch_id: int,
    batch_timestamp_ms: int,
    go_on: Callable[[], bool] = lambda: True,
) -> bool:
    """Record that the first attempt of batch ``batch_id`` of ``epoch``, planned at
    ``batch_timestamp_ms``, was refused before any sink wrote it. The caller makes sure of
    both (no write begun, not a replay); raises what the ledger's append raises.
    ``go_on`` is asked right before the append (after the read of the batch's rows):
    ``False`` appends nothing (its caller gave up waiting). Whether it appended."""
    return _record(ledger, REFUSED, pipeline, epoch, batch_id, batch_timestamp_ms, go_on)


def record_admitted(
    ledger: Ledger, pipeline: str, epoch: int, batch_id: int, batch_timestamp_ms: int
) -> None:
    """Record that a replay of batch ``batch_id`` of ``epoch`` (planned at
    ``batch_timestamp_ms``) goes on to write it: called right before its first write (past
    every check that may still refuse it unwritten), by every attempt not certainly the
    batch's first that writes (``Attempts.refuse_unproven_replay``): one
    :func:`refused_unwritten` says ``True`` of (else one killed mid-write would hide behind
    the old refusal), and one that read no row while a ``refused`` row of an earlier attempt
    may still land, in this process or another (numbered from a later read, this row
    outranks it). Raises what the ledger's append raises: the replay must not write then."""
    _record(ledger, ADMITTED, pipeline, epoch, batch_id, batch_timestamp_ms)


def refused_unwritten(
    ledger: Ledger, pipeline: str, epoch: int, batch_id: int, batch_timestamp_ms: int | None
) -> bool:
    """Whether every attempt of batch ``batch_id`` of ``epoch`` planned at
    ``batch_timestamp_ms`` so far was refused before any sink wrote it: the batch's newest
    :data:`REFUSED` row has that planning time, and no :data:`ADMITTED` row came after it
    or ties with it (a late ``refused`` row: module docstring). ``False`` when no row says
    so, when the planning time is unknown, when two ``refused`` rows tie (two writers at
    once) and disagree."""
    if batch_timestamp_ms is None:
        return False
    rows = ledger.refusal_rows(pipeline, epoch, batch_id)
    refusals = [r for r in rows if r.status == REFUSED]
    if not refusals:
        return False
    newest = max(r.attempt for r in refusals)
    if any(r.batch_timestamp_ms != batch_timestamp_ms for r in refusals if r.attempt == newest):
        return False
    return not any(r.status == ADMITTED and r.attempt >= newest for r in rows)


def _record(
    ledger: Ledger,
    status: Literal["refused", "admitted"],
    pipeline: str,
    epoch: int,
    batch_id: int,
    planned: int,
    go_on: Callable[[], bool] = lambda: True,
) -> bool:
    rows = ledger.refusal_rows(pipeline, epoch, batch_id)
    if not go_on():
        return False
    at = now_utc()
    ledger.record_refusal_row(
        LedgerEntry(
            pipeline=pipeline,
            sink=NO_SINK,
            batch_id=batch_id,
            status=status,
            attempt=max((r.attempt for r in rows), default=0) + 1,
            started_at=at,
            finished_at=at,
            epoch=epoch,
            batch_timestamp_ms=planned,
        )
    )
    return True
