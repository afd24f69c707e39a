"""Whether the catch-up may start before the query's first batch (docs/architecture.md
§14.4, "Before the first batch").

The catch-up writes only batches a guard admitted when they ran live: a spooled batch was
admitted before it was spooled (and a replay of it is held to the same plan by
:meth:`fanout.spool.table.Spool.check`), a backfilled batch was committed by its source
sink. What the first batch's guard adds is a verdict on the *checkpoint*: a run whose
checkpoint was replaced or rolled back is refused before any sink writes. A run refused so
must write nothing, the catch-up included: the operator's ways out (a new epoch, the newest
checkpoint restored, a ``fanout ledger skip --release-spooled``) are theirs to choose.

So before the first batch the catch-up starts only when the guard would admit the batch
Spark runs next: the checkpoint's last planned batch replayed (no ``commits/`` file for it:
its plan as ``offsets/`` records it) or the one after it (planned afresh). Anything this
cannot read or tell (a query id Spark does not give, an epoch without an owner, a
checkpoint it cannot list) leaves the start to the first batch, as before.
"""

from __future__ import annotations

from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.errors import CheckpointError
from fanout.ledger.entry import Ledger
from fanout.spool.table import Spool
from fanout.steps.context import latest_batch_id, parse_offset_log, read_file_directly
from fanout.steps.guard import CheckpointGuard


def why_wait(
    ledger: Ledger,
    pipeline: str,
    query_id: str | None,
    checkpoint: str | None,
    spool: Spool | None,
) -> str | None:
    """Why the catch-up must wait for the query's first batch (``None``: it need not).

    :param ledger: the pipeline's ledger.
    :param pipeline: the pipeline name.
    :param query_id: the started query's id (``None``: unknown).
    :param checkpoint: the query's checkpoint location (``None``: unknown).
    :param spool: the pipeline's spool, whose batches the next batch must match.
    """
    if query_id is None:
        return "the query's id is unknown"
    if checkpoint is None:
        return "the query's checkpoint location is unknown"
    view = ledger.lookup(pipeline, [])
    guard = CheckpointGuard(ledger)
    owner = guard.owner(pipeline, view.epoch)
    if owner != query_id:
        return (
            f"epoch {view.epoch} of the ledger has no owner yet"
            if owner is None
            else f"epoch {view.epoch} of the ledger belongs to query {owner}, not to {query_id}"
        )
    try:
        info, replay = _next_batch(pipeline, query_id, checkpoint, view.epoch)
    except Exception as exc:
        return f"cannot read the checkpoint at {checkpoint}: {type(exc).__name__}: {exc}"
    planned_through = info.batch_id if replay else info.batch_id - 1
    spooled = _newest_spooled(spool, info.epoch)
    if spooled is not None and spooled > planned_through:
        return (
            f"the spool holds batch {spooled} (epoch {info.epoch}), which the checkpoint "
            f"has not planned (its next batch is {info.batch_id})"
        )
    high = view.high_water
    if not replay and high is not None and high >= info.batch_id:
        # planned afresh, it gets a new planning time: the guard refuses it as a rollback
        return (
            f"the ledger holds batch {high} (epoch {view.epoch}) and the checkpoint plans "
            f"batch {info.batch_id} afresh"
        )
    try:
        guard.check(info, high)
        if spool is not None:
            spool.check(info)
    except CheckpointError as exc:  # the first batch raises it again, whole
        return f"the guard would refuse batch {info.batch_id} ({type(exc).__name__})"
    return None


def _next_batch(
    pipeline: str, query_id: str, checkpoint: str, epoch: int
) -> tuple[BatchInfo, bool]:
    """The batch Spark runs next on ``checkpoint``, and whether it is a replay: its last
    planned batch, with the plan ``offsets/`` records, when no ``commits/`` file says it
    ran; else the batch after it, not planned yet (no offsets)."""
    last = latest_batch_id(checkpoint, "offsets")
    if last is None:
        return BatchInfo(pipeline, 0, query_id, epoch=epoch), False
    if read_file_directly(checkpoint, f"commits/{last}") is not None:
        return BatchInfo(pipeline, last + 1, query_id, epoch=epoch), False
    text = read_file_directly(checkpoint, f"offsets/{last}")
    if text is None:
        raise LookupError(f"offsets/{last} disappeared")
    planned = parse_offset_log(text)
    info = BatchInfo(
        pipeline,
        last,
        query_id,
        planned.source_offsets,
        epoch=epoch,
        batch_timestamp_ms=planned.batch_timestamp_ms,
    )
    return info, True


def _newest_spooled(spool: Spool | None, epoch: int) -> int | None:
    """The newest batch of ``epoch`` the spool holds (``None``: none)."""
    if spool is None:
        return None
    return max((b.batch_id for b in spool.batches() if b.epoch == epoch), default=None)


def query_checkpoint(query: Any) -> str | None:
    """The resolved checkpoint location of a classic streaming ``query`` (``None`` when it
    cannot be read: another kind of query)."""
    try:
        return str(query._jsq.streamingQuery().resolvedCheckpointRoot())
    except Exception:
        return None
