"""Step 2 of a batch: refuse to write after a checkpoint reset (ARCHITECTURE §2.3).

When a checkpoint is deleted or replaced, Spark starts a new query id and numbers batches
from 0 again. Sinks would then skip those batches (their idempotency ids say "done") or,
under new ids, duplicate them. The ledger knows better: its pipeline high-water mark is a
log lookup, and only when it is at or past the incoming batch does the guard scan for the
query ids that wrote those marks.
"""

from __future__ import annotations

import json
import logging

from fanout.errors import CheckpointResetError
from fanout.ledger import Ledger, LedgerEntry
from fanout.sink import BatchInfo

log = logging.getLogger(__name__)


def check_checkpoint(ledger: Ledger, info: BatchInfo, high: int | None) -> None:
    """Raise :class:`CheckpointResetError` when another query id committed batches of this
    pipeline at or after ``info.batch_id``; return quietly otherwise (including replays
    of the same query after a crash). ``high`` is the pipeline's high-water mark in
    ``info.epoch``, as the ledger's lookup read it."""
    if high is None or high < info.batch_id:
        return
    newer = ledger.committed_entries(info.pipeline, info.batch_id, epoch=info.epoch)
    foreign = [e for e in newer if e.query_id != info.query_id]
    if info.query_id is None:
        log.warning(
            "pipeline %s, batch %s: query id unknown; cannot tell a replay from a checkpoint reset",
            info.pipeline,
            info.batch_id,
        )
        return
    if foreign:
        # name every sink's last committed batch, also those behind info.batch_id: the
        # offsets of the sink furthest behind are where a recovery must start from
        latest = latest_per_sink(ledger.committed_entries(info.pipeline, epoch=info.epoch))
        raise CheckpointResetError(reset_message(info, latest))


def latest_per_sink(entries: list[LedgerEntry]) -> dict[str, LedgerEntry]:
    """The committed entry with the highest (epoch, batch id) of each sink."""
    latest: dict[str, LedgerEntry] = {}
    for entry in entries:
        current = latest.get(entry.sink)
        if current is None or (entry.epoch, entry.batch_id) > (current.epoch, current.batch_id):
            latest[entry.sink] = entry
    return latest


def reset_message(info: BatchInfo, latest: dict[str, LedgerEntry]) -> str:
    """The error text: what happened, what the ledger knows per sink, how to proceed."""
    lines = [
        f"pipeline {info.pipeline!r}: checkpoint reset detected. Spark handed batch "
        f"{info.batch_id} of query {info.query_id}, but the ledger holds batches of this "
        "pipeline committed at or after it by another query id: the checkpoint was deleted "
        "or replaced. fanout refuses to write, because the sinks would silently skip these "
        "batches or write them twice.",
        "Last committed batch per sink (from the ledger):",
    ]
    for sink in sorted(latest):
        entry = latest[sink]
        offsets = json.dumps(entry.offsets()) if entry.source_offsets else "not recorded"
        lines.append(
            f"  - {sink}: batch {entry.batch_id}, query id {entry.query_id}, "
            f"source offsets {offsets}"
        )
    lines += [
        "How to proceed:",
        "  1. Restore the original checkpoint directory and restart the query; nothing is "
        "lost or duplicated.",
        "  2. Or start from a new checkpoint whose source begins right after the offsets of "
        "the sink furthest behind above (e.g. as Kafka startingOffsets), under a new "
        "pipeline name so the sinks' transaction ids start afresh; sinks further ahead then "
        "receive their last batches again.",
        "  3. Or, accepting that the new query's batches are written as new data even where "
        "they repeat old input, continue under a new epoch: FanOut(..., "
        'on_checkpoint_reset="new_epoch").',
        f"  `fanout recover --ledger <path> --pipeline {info.pipeline}` prints these facts "
        "again, with Kafka startingOffsets.",
    ]
    return "\n".join(lines)
