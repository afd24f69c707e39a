"""Around a batch's writes: its announcement to the observers, step 7 (what it held
released), and its report (the observers told, a failure raised)."""

from __future__ import annotations

import logging
from typing import Any

from fanout.contract.lag import SpoolSize
from fanout.contract.sink import SinkResult
from fanout.errors import BatchFailedError
from fanout.hooks.caller import HookCaller
from fanout.observe.logs import batch_fields
from fanout.spool.table import Spool
from fanout.steps.lag import Lagging
from fanout.steps.state import BatchState

log = logging.getLogger("fanout")


def announce(state: BatchState, hooks: HookCaller, pipeline: str) -> None:
    """Tell the observers the batch starts (``fanout_batch_start``), and log the sinks it
    skips (their mark already holds it)."""
    info = state.info
    hooks.call("fanout_batch_start", info=info, pending=state.pending, skipped=state.skipped)
    if state.skipped:
        log.info(
            "pipeline %s, batch %s: skipping %s (already committed)",
            pipeline,
            info.batch_id,
            ", ".join(state.skipped),
            extra=batch_fields(pipeline, info.batch_id),
        )


def report(
    state: BatchState, hooks: HookCaller, lagging: Lagging, spool: Spool | None, pipeline: str
) -> dict[str, SinkResult]:
    """Tell the observers how the batch ended (the lag of the lag sinks, then
    ``fanout_batch_failed`` or ``fanout_batch_end``) and return each written sink's
    result; raise :class:`fanout.BatchFailedError` when a sink failed, or the interrupt
    that aborted the batch."""
    info = state.info
    if lagging.sinks:
        size = None
        if spool is not None:
            size = SpoolSize(*spool.size())
        hooks.call("fanout_sink_lag", info=info, lags=lagging.lags(), spool=size)
    if state.failures:
        committed = [*state.skipped, *state.results]
        error = BatchFailedError(pipeline, info.batch_id, state.failures, committed,
                                 rows_in=state.rows_in)  # fmt: skip
        hooks.call(
            "fanout_batch_failed",
            info=info,
            failures=state.failures,
            results=state.results,
            error=error,
        )
        if state.aborted is not None:  # an interrupt or exit goes on up as raised
            raise state.aborted
        raise error from next(iter(state.failures.values()))
    if state.aborted is not None:  # raised by a sink that lags (on_failure='lag')
        raise state.aborted
    hooks.call("fanout_batch_end", info=info, results=state.results)
    return state.results


def read_as_given(state: BatchState | None, df: Any) -> tuple[str, ...] | None:
    """The group of sinks whose shared job read the batch as Spark handed it over (not a
    persisted or repartitioned copy): the next batch starts its input ahead."""
    # persist() returns the very DataFrame it caches: ``is`` alone cannot tell
    if state is None or state.df is not df or state.persisted or len(state.share_groups) != 1:
        return None
    return state.share_groups[0]


def rows_in(state: BatchState) -> int | None:
    """A failed batch's input rows, for ``fanout run``'s summary: Spark reports no progress
    for a batch that failed, so its ``numInputRows`` never comes. The Arrow conversion a
    sink made gives them free; else one count of the batch (cached when persisted): a cost
    on this failure path only. ``None`` when the count fails too (an unreadable input).
    Called before step 7 releases the Arrow and unpersists the batch (after it, the count
    read the batch's source again)."""
    if state.aborted is not None:  # an interrupt: end now, count nothing
        return None
    if state.routes is not None:
        converted = state.routes.batch_arrow().converted_rows()
        if converted is not None:
            return converted
    try:
        return int(state.df.count())
    except Exception as exc:
        log.info("pipeline %s, batch %s: its rows not counted: %s", state.info.pipeline,
                 state.batch_id, exc)  # fmt: skip
        return None


def settle(state: BatchState) -> None:
    """Step 7: release what the batch held (shared Arrow tables, evaluated routes, the
    persisted DataFrame), whatever the outcome."""
    if state.routes is not None:
        state.routes.release()
    if state.persisted:
        state.df.unpersist()
