"""The PostgreSQL sink's epoch fence: the scopes of a pipeline's earlier epochs closed to
the sink's partitions still in flight (:meth:`fanout.Sink.fence_earlier_epochs`).

A task of a query a checkpoint reset replaced (a task of an executor given up on, of a
stopped query, still running) must not commit once a later epoch began writing the sink:
:func:`fence` writes one :data:`~fanout_postgres.statements.EPOCH_FENCE` record of the
sink in each earlier epoch's scope, which its partition transactions look up before they
commit. The SQL is :mod:`fanout_postgres.statements`'; lifting a fence is the sink's
:meth:`~fanout_postgres.sink.PostgresSink.lift_epoch_fence`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fanout.contract.batch import pipeline_scope
from fanout_postgres.membership import SinkRecords
from fanout_postgres.statements import (
    EPOCH_FENCE_HOLDERS,
    EPOCH_FENCE_LOCKS,
    epoch_fence_lock,
    fence_earlier_epochs,
    lock_halves,
)

logger = logging.getLogger("fanout_postgres.sink")  # the sink's: its records keep that name


def fence(conn: Any, records: SinkRecords, pipeline: str, epoch: int) -> None:
    """Close the scopes of epochs ``0 .. epoch-1`` (:func:`~fanout_postgres.statements.
    fence_earlier_epochs`), in one transaction committed here: at a new epoch's start,
    before the sink is asked whether it holds the replaced epoch's last batch, and
    again at the sink's first batch of an epoch > 0 in a process (the preflight: a
    lagging sink's catch-up of an older epoch's spooled batches comes before it, §14.1,
    and is not refused). A task of a query the reset replaced (a task of an executor
    given up on, of a stopped query, still running) must then not commit.

    Upsert: it asks for a later batch of its own scope before it commits and finds the
    fence. Append: each partition transaction holds its scope's fence lock
    (:func:`~fanout_postgres.statements.epoch_fence_lock`) shared from its first
    statement to its end and looks the fence up under it; the fence takes the locks
    exclusively before its ``INSERT``, so it waits for every partition still open
    (whose commit the sink's ``holds_batch``, asked after, then sees), and every
    partition starting after waits for it and sees it. One transaction per epoch
    start and per process start in a new epoch; none in epoch 0 or per batch."""
    import sqlalchemy as sa

    scopes = [pipeline_scope(pipeline, k) for k in range(epoch)]
    if records.mode == "append":
        locks = [epoch_fence_lock(scope, records.sink) for scope in scopes]
        _say_what_the_fence_waits_for(conn, pipeline, records.sink, scopes, locks)
        conn.execute(sa.text(EPOCH_FENCE_LOCKS), {"locks": locks})
    params = {"scopes": scopes, "sink": records.sink, "target": str(records.table)}
    conn.execute(fence_earlier_epochs(records.state_schema, records.mode), params)
    conn.commit()


def _say_what_the_fence_waits_for(
    conn: Any, pipeline: str, sink: str, scopes: Sequence[str], locks: Sequence[int]
) -> None:
    """Append, before the fence waits for its locks: when partition transactions of the
    scopes it closes hold them (:data:`~fanout_postgres.statements.EPOCH_FENCE_HOLDERS`,
    a read of ``pg_locks``: tasks of the replaced query, perhaps hung with their
    connection alive, which hold the new epoch's start for as long: for ever with no
    ``write_timeout_s``), log once which scopes and which PostgreSQL backends it waits
    for, and what to do. Only at a fence: no cost per batch."""
    import sqlalchemy as sa

    halves = {lock_halves(key): scope for scope, key in zip(scopes, locks, strict=True)}
    params = {"highs": [h for h, _ in halves], "lows": [lo for _, lo in halves]}
    found = conn.execute(sa.text(EPOCH_FENCE_HOLDERS), params).all()
    if not found:
        return
    busy = sorted({halves[(high, low)] for high, low, *_ in found})
    holders = [
        f"{pid} ({state or 'state unknown'} since {since or 'unknown'})"
        for _, _, pid, state, since in found
    ]
    logger.warning(
        "pipeline %s, sink %s: the epoch fence waits for partition transaction(s) of "
        "epoch scope(s) %s still open: PostgreSQL backend(s) %s. They are tasks of the "
        "query a checkpoint reset replaced, still writing; the new epoch does not write "
        "until they end (bounded by the sink's write_timeout_s if set, else for as long "
        "as they stay open). If their tasks are gone (an executor lost, a hung task), "
        "end them: SELECT pg_terminate_backend(<pid>)",
        pipeline, sink, ", ".join(busy), ", ".join(holders),
    )  # fmt: skip
