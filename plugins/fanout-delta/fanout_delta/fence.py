"""Closing a replaced epoch's app transactions to its driver still running
(:meth:`fanout.Sink.fence_earlier_epochs` of the Delta sink).

A checkpoint reset accepted as a new epoch (``on_checkpoint_reset="new_epoch"``) while the
replaced query's driver still runs: that driver may commit its batch ``m + 1`` after the
new epoch's start asked :meth:`~fanout_delta.DeltaSink.holds_batch` about it, and the new
epoch, under its own app id, writes it again. The fence is one commit without rows carrying
a ``txn`` action for each earlier epoch's app id of the sink, its version marked
(:data:`fanout.delta_tables.io.EPOCH_FENCE` added: :func:`fanout.delta_tables.io.fenced_version`,
which fences an app id never written too):

- a replaced epoch's commit whose snapshot predates the fence loses to it: delta-rs and
  delta-spark fail a transaction that read an app id's version when a concurrent winning
  commit carries a ``txn`` for it (``ConcurrentTransaction``); its retry reads the fence;
- a replaced epoch's write that reads the fence (every writer checks its app transaction on
  the snapshot it commits from) refuses with :class:`EpochFencedError`, writing nothing;
- every reader of the version clears the mark (:func:`fanout.delta_tables.io.transaction_version`),
  so ``holds_batch``, the RESTORE checks, backfill read the real version.

The fence commit reads the versions it marks: a replaced driver committing in between
makes it fail, and it is made again on the fresh snapshot (which then holds that batch, so
the new epoch's ``holds_batch`` sees it). :func:`lift_fence` commits the real version back
(``-1`` for an app id never written: read as ``None``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from fanout.contract.sink import FENCE_LEFT, lift_by_hand, renamed_sink_advice
from fanout.delta_tables import io as deltaio
from fanout.errors import RenamedSinkError, SinkWriteError
from fanout_delta.plans import FENCE_KEY

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from fanout.contract.batch import Batch

logger = logging.getLogger(__name__)


ATTEMPTS = 10
"""How often a fence (or its lift) is committed again after losing a commit race."""


class EpochFencedError(SinkWriteError):
    """A write of a replaced epoch (a checkpoint reset started a later one) found its app
    transaction closed by the later epoch's start (:mod:`fanout_delta.fence`): nothing
    was written, since the new epoch writes the batch. Not transient."""


def _commit(table: DeltaTable, transactions: Mapping[str, int], metadata: dict[str, str]) -> None:
    """One commit without rows carrying ``transactions`` (``app_id: version``)."""
    table.create_write_transaction(
        [],
        mode="append",
        schema=table.schema(),
        partition_by=list(table.metadata().partition_columns) or None,
        commit_properties=deltaio.commit_properties(transactions, metadata),
    )


def _retrying(
    path: str,
    storage_options: Mapping[str, str] | None,
    what: str,
    plan: Any,
) -> int:
    """Open the table, ``plan(table)`` (the ``app_id: version`` to commit and its
    metadata, or ``None``: nothing to do), commit; again on a lost race. The number of app
    transactions committed."""
    for attempt in range(1, ATTEMPTS + 1):
        table = deltaio.open_table(path, storage_options)
        planned = None if table is None else plan(table)
        if table is None or not planned:
            return 0
        transactions, metadata = planned
        try:
            _commit(table, transactions, metadata)
            return len(transactions)
        except Exception as exc:
            if not deltaio.is_commit_conflict(exc) or attempt == ATTEMPTS:
                raise
            logger.info("%s: lost a commit race %s, reading again: %s", path, what, exc)
    raise AssertionError("unreachable")


def unfenceable(error: BaseException) -> bool:
    """Whether ``error`` is delta-rs unable to load the table or to commit to it at all: a
    table feature it lacks (row tracking, liquid clustering, a reader feature it does not
    know), which delta-spark may have (engine ``spark`` writes such tables). delta-rs then
    commits no fence there; an error of another kind (storage unreachable, a lost race
    past :data:`ATTEMPTS`) is not this."""
    from deltalake.exceptions import DeltaError

    text = str(error)
    return isinstance(error, DeltaError) and (
        "Unsupported table features required" in text or "Unsupported: Feature" in text
    )


def fence_epochs(
    path: str,
    storage_options: Mapping[str, str] | None,
    app_ids: Mapping[int, str],
    epoch: int,
) -> int:
    """Fence the app transactions ``app_ids`` (earlier epoch: app id) of the table at
    ``path`` for the start of ``epoch``, those not fenced yet, in one commit. No table:
    nothing (no writer of an earlier epoch has a snapshot to commit from; see
    docs/architecture.md for the first batch's creation). The app ids fenced now."""

    def plan(table: DeltaTable) -> tuple[dict[str, int], dict[str, str]] | None:
        marks = {}
        for app_id in app_ids.values():
            version, fenced = deltaio.transaction_state(table, app_id)
            if not fenced:
                marks[app_id] = deltaio.fenced_version(version)
        return (marks, {FENCE_KEY: str(epoch)}) if marks else None

    return _retrying(path, storage_options, f"fencing epochs before {epoch}", plan)


def lift_fence(path: str, storage_options: Mapping[str, str] | None, app_id: str) -> bool:
    """Commit ``app_id``'s real version back over its fence (``-1`` when it had none).
    Whether there was a fence to lift."""

    def plan(table: DeltaTable) -> tuple[dict[str, int], dict[str, str]] | None:
        version, fenced = deltaio.transaction_state(table, app_id)
        if not fenced:
            return None
        return {app_id: -1 if version is None else version}, {FENCE_KEY: "lifted"}

    return _retrying(path, storage_options, f"lifting the fence of {app_id}", plan) > 0


def fencing_epoch(table: DeltaTable) -> str:
    """Which epoch fenced (the newest fence commit among the last 100), for a refusal."""
    try:
        for info in deltaio.numbered_history(table, 100):
            value = info.get(FENCE_KEY)
            if value is not None and value != "lifted":
                return f"epoch {value}"
    except Exception as exc:  # evidence only
        logger.debug("cannot read the history of %s: %s", table.table_uri, exc)
    return "a later epoch"


def fenced_error(
    table: DeltaTable,
    app_id: str,
    *,
    sink: str,
    path: str,
    pipeline: str,
    epoch: int,
    batch_id: int,
) -> EpochFencedError:
    """The refusal of a write of batch ``batch_id`` of ``epoch`` whose app transaction
    ``app_id`` carries a later epoch's fence in ``table`` (the writer found it with the
    version it reads anyway, :func:`fanout.delta_tables.io.transaction_state`: one
    comparison; the history is read here, on the refusal's path only)."""
    later = fencing_epoch(table)
    return EpochFencedError(
        f"the Delta table {path} closes this query's app transaction {app_id!r} (epoch "
        f"{epoch}): a checkpoint reset started {later} of the pipeline, which writes this "
        "batch again, so this query (of the replaced epoch) writes nothing. Stop it. "
        + FENCE_LEFT
        + lift_by_hand(repr(pipeline), epoch + 1, "restart this query."),
        sink=sink,
        batch_id=batch_id,
    )


def batch_version(
    table: DeltaTable | None,
    batch: Batch,
    sink: str,
    path: str,
    *,
    sinks: Collection[str] = (),
    harmless: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> int | None:
    """The version ``table`` records for ``batch``'s app transaction (``None``: none), one
    lookup; raises :func:`fenced_error` when a later epoch's fence is on it.

    With none recorded (the sink's first write to the table) and ``sinks``, the names of
    the sinks the pipeline configures, given: raises :class:`RenamedSinkError` when the
    table's newest commits hold this batch or a later one of a sink of the pipeline not
    among them (:func:`fanout_delta.plans.vanished_sink_commit`; logged instead when the
    sink's rewrite is ``harmless``, a merge without a dead-letter target; ``storage_options``:
    the table's, to read the log files of commits recording no plan). The history is
    read only then: once per sink and table, not per batch."""
    key = batch.idempotency_key
    version, fenced = deltaio.transaction_state(table, key.app_id)
    if fenced:
        assert table is not None
        raise fenced_error(table, key.app_id, sink=sink, path=path, pipeline=batch.pipeline,
                           epoch=batch.info.epoch, batch_id=key.version)  # fmt: skip
    if version is None and table is not None and sinks:
        refuse_vanished_sink(table, batch, sink, path, sinks, harmless, storage_options)
    return version


def refuse_vanished_sink(
    table: DeltaTable, batch: Batch, sink: str, path: str, sinks: Collection[str],
    harmless: bool, storage_options: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Raise :class:`RenamedSinkError` (or log, when the sink's rewrite is ``harmless``)
    when ``table``, recording no transaction of ``batch``'s app id, holds this batch or a
    later one of a sink of the pipeline not among ``sinks``
    (:func:`fanout_delta.plans.vanished_sink_commit`; ``storage_options``: the table's, to
    read the log files of commits recording no plan)."""
    from fanout_delta.plans import vanished_sink_commit

    plan = vanished_sink_commit(table, batch, sinks, storage_options)
    if plan is None:
        return
    other = plan.app_id.rsplit("/", 1)[-1]
    held = (
        f"the Delta table {path} holds batch {plan.batch_id} of sink {other!r} of this "
        f"pipeline (app transaction {plan.app_id!r}, table version {plan.version}), a sink "
        "the pipeline no longer configures, and none of sink "
        f"{sink!r}"
    )
    if harmless:
        logger.warning(
            "sink %r, batch %d: %s; it merges by key without a dead-letter target, so "
            "writing the batch again leaves each key's last row: writing it",
            sink, batch.batch_id, held,
        )  # fmt: skip
        return
    remove, note = _remove_advice(table, path, plan.version)
    raise RenamedSinkError(
        f"{held}. "
        + renamed_sink_advice(f"the Delta table {path}", sink, other, plan.batch_id, remove)
        + note,
        sink=sink,
        batch_id=batch.batch_id,
    )


def _remove_advice(table: DeltaTable, path: str, version: int | None) -> tuple[str | None, str]:
    """The refusal's third way on, and a note: take the vanished sink's commit ``version``
    out of the table at ``path``. A RESTORE to the version before it; a commit that created
    the table (version 0) has none, so the table is deleted (the new name creates it again).
    Offered only when that commit is the table's newest: a restore or a deletion takes the
    later commits with it (another sink's marked batches on the table, another writer's
    rows), which nothing writes again, and the lost-target check then refuses the other
    sink (review of bc8f54b: its "write those again yourself" led there). A DELETE of the
    rows is no way on: the table would still record the old name's transaction, and the
    check would refuse again."""
    if version is None:
        return (
            "to have the batch written under the new name, restore the table to the version "
            "before the batch's commit (the batch's rows out; only when no later commit "
            "wrote the table: a restore takes those with it)",
            "",
        )
    try:  # the newest in storage, not the snapshot's: another writer may have committed
        last = deltaio.latest_version(table)  # since it was loaded
    except Exception:  # evidence only: offer nothing that could take more
        last = None
    if last is None or last > version:
        later = "later versions" if last is None else f"versions {version + 1}-{last}"
        undo = "a RESTORE to before it" if version > 0 else "deleting the table"
        return None, (
            f". Taking the batch's commit (version {version}) out of the table, by {undo}, "
            f"is no way on here: its {later} would go with it (other sinks' marked batches, "
            "another writer's rows), which nothing writes again"
        )
    if version > 0:
        return (
            "to have the batch written under the new name, restore the table to version "
            f"{version - 1} (the batch's rows out; delta-rs: DeltaTable(path).restore("
            f"{version - 1}); Spark SQL: RESTORE TABLE delta.`{path}` TO VERSION AS OF "
            f"{version - 1})",
            "",
        )
    return (
        "to have the batch written under the new name, delete the table (its directory, "
        "_delta_log included: the batch's commit, version 0, created it, so there is no "
        "version before it to restore)",
        "",
    )


__all__ = [
    "FENCE_KEY",
    "EpochFencedError",
    "RenamedSinkError",
    "batch_version",
    "fence_epochs",
    "fenced_error",
    "lift_fence",
    "refuse_vanished_sink",
    "unfenceable",
]
