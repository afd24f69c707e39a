"""The spool's refusals of a batch whose key it already holds for another plan: the
checkpoint was replaced (another query id) or rolled back (the same query, planned at
another time) while sinks lagged (docs/architecture.md §14.3)."""

from __future__ import annotations

from collections.abc import Iterable

from fanout.contract.batch import BatchInfo
from fanout.contract.locations import command_location, shown_location
from fanout.contract.plans import describe_plan, planned_at
from fanout.errors import shell_word


def _spooled_plan(spooled: BatchInfo) -> str:
    return describe_plan(spooled.source_offsets, spooled.batch_timestamp_ms, recorded=True)


def _which(spooled: BatchInfo, needed_by: Iterable[str]) -> tuple[str, str]:
    sinks = ", ".join(sorted(needed_by)) or "no sink"
    epoch = f" (epoch {spooled.epoch})" if spooled.epoch else ""
    return f"batch {spooled.batch_id}{epoch}", sinks


def spool_reset_message(
    info: BatchInfo, spooled: BatchInfo, needed_by: Iterable[str], path: str,
    ledger: str | None = None,
) -> str:  # fmt: skip
    """Batch ``info`` is of another query than ``spooled``, the batch of the same id the
    spool at ``path`` holds for ``needed_by``: the checkpoint was deleted or replaced while
    those sinks lagged. ``ledger``: the pipeline's ledger as commands name it (``None``:
    unknown, named ``<path>``)."""
    batch, sinks = _which(spooled, needed_by)
    shown, shown_ledger = shown_location(path), shown_location(ledger) if ledger else "<path>"
    return "\n".join(
        [
            f"pipeline {info.pipeline!r}: checkpoint reset detected. Spark handed {batch} of "
            f"query {info.query_id}, but the spool at {shown} holds {batch} of query "
            f"{spooled.query_id} for sink(s) {sinks}, which have not received it: the "
            "checkpoint was deleted or replaced while they lagged. fanout refuses to spool "
            "the batch, because those sinks would receive the old query's rows for it and "
            "never the new query's.",
            f"  spooled (query {spooled.query_id}): {_spooled_plan(spooled)}",
            f"  handed now (query {info.query_id}): "
            + describe_plan(info.source_offsets, info.batch_timestamp_ms, recorded=False),
            "How to proceed:",
            "  1. Restore the original checkpoint directory and restart the query; nothing is "
            "lost or duplicated.",
            "  2. Or let the sinks catch up on the old query's batches first (run the original "
            f"checkpoint until `fanout status --ledger {shown_ledger} --pipeline "
            f"{shell_word(info.pipeline)} --spool {command_location(path)}` shows {sinks} live), "
            "then "
            "start the new checkpoint.",
            "  3. Or start the new checkpoint under a new pipeline name, so its batches start "
            f"afresh; the old query's spooled batches then never reach {sinks}.",
        ]
    )


def spool_rollback_message(
    info: BatchInfo, spooled: BatchInfo, needed_by: Iterable[str], path: str
) -> str:
    """Batch ``info`` is of the same query as ``spooled``, the batch of the same id the
    spool at ``path`` holds for ``needed_by``, planned at another time: the checkpoint was
    rolled back while those sinks lagged."""
    batch, sinks = _which(spooled, needed_by)
    assert spooled.batch_timestamp_ms is not None and info.batch_timestamp_ms is not None
    shown = shown_location(path)
    return "\n".join(
        [
            f"pipeline {info.pipeline!r}: checkpoint rolled back. Spark handed {batch} of "
            f"query {info.query_id} planned at {planned_at(info.batch_timestamp_ms)}, but the "
            f"spool at {shown} holds {batch} of the same query planned at "
            f"{planned_at(spooled.batch_timestamp_ms)} for sink(s) {sinks}, which have not "
            "received it: the checkpoint was restored from a backup or lost its newest "
            "offsets/ and commits/ files, so Spark planned the batch again. fanout refuses "
            "to spool it, because those sinks would receive the rows first planned and "
            "never the rows it holds now.",
            f"  spooled: {_spooled_plan(spooled)}",
            "  handed now: "
            + describe_plan(info.source_offsets, info.batch_timestamp_ms, recorded=False),
            "How to proceed:",
            f"  1. Restore the newest checkpoint (the one whose offsets/{spooled.batch_id} "
            f"holds planning time {spooled.batch_timestamp_ms}) and restart the query; "
            "nothing is lost or duplicated.",
            "  2. Or delete this checkpoint and start a new one under a new pipeline name, so "
            f"its batches start afresh; the spooled batches then never reach {sinks}.",
        ]
    )
