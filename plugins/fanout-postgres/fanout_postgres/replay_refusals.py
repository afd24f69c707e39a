"""What the PostgreSQL sink refuses before any partition of a batch writes: a replay (the
batch has records of committed partitions) or a first batch that would write rows a
second time, or skip rows the table never got.

Each check reads the sink's records of the batch in ``state_schema`` (progress marks:
append; ``upsert_routes`` rows: upsert, :mod:`fanout_postgres.membership`) and raises a
:class:`~fanout.errors.SinkWriteError` (a :class:`~fanout.errors.RenamedSinkError` for a
sink renamed) naming what it found and the ways on; nothing was written then. Asked by
:meth:`~fanout_postgres.sink.PostgresSink.committed_partitions` (append) and
:meth:`~fanout_postgres.sink.PostgresSink.check_replay` (upsert), which keep the sink's
state of what was asked (docs/architecture.md §8.2).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fanout.contract.batch import Batch
from fanout.contract.dead_letters import DeadLetterTarget
from fanout.contract.sink import FENCE_LEFT, lift_by_hand, renamed_sink_advice
from fanout.contract.sql import sql_literal
from fanout.deadletters.moved import refused_elsewhere
from fanout.errors import RenamedSinkError, SinkWriteError, shell_word
from fanout.partitioned.membership import CommittedPartition
from fanout_postgres.identifiers import quote
from fanout_postgres.membership import (
    REPLACED_UNDER_ITS_NAME,
    MovedMarks,
    SinkRecords,
    batch_scope,
    forget_replaced_marks,
    letters_waiting,
    other_table_marks,
    repoint_marks_sql,
    tables_now,
    upsert_routes,
    upsert_routes_of,
    vanished_sink_marks,
)
from fanout_postgres.statements import (
    EPOCH_FENCE,
    RESTORE_OR_RENAME,
    forget_marks_advice,
    forget_routes_sql,
    restarted,
)

logger = logging.getLogger("fanout_postgres.sink")  # the sink's: its records keep that name


def refuse_other_query(
    records: SinkRecords, batch: Batch, found: Sequence[tuple[CommittedPartition, str | None]]
) -> None:
    """Append: refuse, before any partition writes, a batch whose marks another query
    committed (read in the marks' query): a query keeps its id with its checkpoint,
    so the pipeline started again under the same name with a new checkpoint
    (docs/architecture.md §8.2, "A straggler of an earlier batch"). Each partition
    would fail on its mark (:class:`~fanout_postgres.sqlstate.MarkConflict`), and
    one that the earlier run did not commit would write."""
    other = [
        (mark.partition, query_id)
        for mark, query_id in found
        if query_id and batch.query_id and query_id != batch.query_id
    ]
    if not other:
        return
    parts = sorted(partition for partition, _ in other)
    queries = ", ".join(sorted({query_id for _, query_id in other}))
    scope = batch_scope(batch)
    raise SinkWriteError(
        f"{records.state_schema}.progress marks partition(s) {parts} of batch "
        f"{batch.batch_id} of this sink as committed to {records.table} in pipeline "
        f"{scope!r} by query {queries}; this is query {batch.query_id}. "
        f"A query keeps its id with its checkpoint, so {restarted(ledger_too=False)}, or "
        f"another pipeline of that name writes this sink. Nothing was written. "
        f"{RESTORE_OR_RENAME}. "
        + forget_marks_advice(records.state_schema, scope, records.sink, records.table),
        sink=records.sink,
        batch_id=batch.batch_id,
    )


def refuse_vanished_sink(
    conn: Any,
    records: SinkRecords,
    batch: Batch,
    sinks: tuple[str, ...],
    dead: DeadLetterTarget | None,
) -> None:
    """At the first batch of an :meth:`~fanout_postgres.sink.PostgresSink.open` with no
    records of its own (append; upsert with a dead-letter target ``dead``): refuse, before
    any partition writes, a batch the table holds (partitions of it, or a later batch)
    under the progress marks (append) or ``upsert_routes`` rows (upsert) of a sink of the
    pipeline it no longer configures (``sinks``: the pipeline's at ``open()``), when this
    sink's name has no records in the scope at all: that sink renamed to this one (or
    removed) after it committed and before its ledger mark. Written under the new name, an
    append's partitions would be in the table twice, an upsert's refused rows in the
    dead-letter target twice (its rows converge)
    (:func:`~fanout_postgres.membership.vanished_sink_marks`)."""
    table = records.table
    assert table is not None  # open() resolved it
    found = vanished_sink_marks(conn, records.state_schema, batch_scope(batch), records.sink,
                                sinks, batch.batch_id, table.quoted(), records.mode)  # fmt: skip
    if found is None:
        return
    other, batch_id, partitions = found
    if records.mode == "append":
        kind, harm = "progress marks", None
    else:
        kind = "upsert_routes records"
        harm = (
            f"put the rows they refused in {dead.describe() if dead else ''} "
            "a second time (under this sink's name; the table's rows converge)"
        )
    raise RenamedSinkError(
        f"{records.state_schema}.{kind} partition(s) {partitions} of batch "
        f"{batch_id} as committed to table {table} by sink {other!r} of this "
        f"pipeline, which the pipeline no longer configures, and sink {records.sink!r} has "
        "no records. "
        + renamed_sink_advice(f"table {table}", records.sink, other, batch_id, harm=harm),
        sink=records.sink,
        batch_id=batch.batch_id,
    )


def refuse_switched_mode(conn: Any, records: SinkRecords, batch: Batch) -> None:
    """Append, at the first batch of an :meth:`~fanout_postgres.sink.PostgresSink.open`
    with no marks of its own: refuse, before any partition writes, a batch this sink
    committed into the table in upsert mode (its ``upsert_routes`` rows, of this batch or
    a later one): ``mode`` switched after that commit and before its ledger mark, and the
    append replay, which finds no progress mark, would append the batch again, each of its
    rows a unique violation then (a row in the table and in the dead letters) or a second
    copy (:func:`~fanout_postgres.membership.upsert_routes_of`)."""
    table, state_schema = records.table, records.state_schema
    assert table is not None  # open() resolved it
    found = upsert_routes_of(conn, state_schema, batch_scope(batch), records.sink,
                             batch.batch_id, table.quoted())  # fmt: skip
    if found is None:
        return
    scope = batch_scope(batch)
    _, later = upsert_routes(conn, state_schema, scope, records.sink, batch.batch_id)
    if later is not None and later != EPOCH_FENCE:  # the refusal's path only
        # no switch mid-batch (the ledger marks each batch before the next): an earlier
        # run's records, under a pipeline started again under the same name
        raise SinkWriteError(
            f"{state_schema}.upsert_routes records batch {later} of this sink "
            f"committed to table {table} in upsert mode in pipeline {scope!r}, "
            f"after batch {batch.batch_id}, which Spark hands now to the sink in append "
            f"mode: {restarted(ledger_too=True)}, so this run would append from batch "
            f"{batch.batch_id} again what the earlier one wrote up to batch {later}. "
            "Nothing was written. "
            f"{RESTORE_OR_RENAME}, or delete the earlier run's records first: "
            f"{forget_routes_sql(state_schema, scope, records.sink)}",
            sink=records.sink,
            batch_id=batch.batch_id,
        )
    batch_id, partitions = found
    raise SinkWriteError(
        f"{state_schema}.upsert_routes records partition(s) {partitions} of batch "
        f"{batch_id} of this sink as committed to table {table} in upsert mode, "
        f"and the sink is in append mode now with no progress mark of the batch: its "
        f"mode switched after that commit and before the ledger mark, and appending "
        f"batch {batch_id} would write its rows a second time (or, under the upsert "
        "keys' unique index, put each in the dead letters beside the table's copy), so "
        "nothing was written. Set mode back to 'upsert' and restart: the replay "
        f"completes the batch; switch once batch {batch_id} is marked (append then "
        "starts after it)",
        sink=records.sink,
        batch_id=batch.batch_id,
    )


def refuse_moved(
    conn: Any,
    engine: Any,
    records: SinkRecords,
    batch: Batch,
    found: list[tuple[CommittedPartition, str | None]],
    *,
    accept_lost: bool,
) -> list[tuple[CommittedPartition, str | None]]:
    """Append, on a replay (the batch has marks ``found``): refuse (or, accepted, forget:
    marks deleted, below), before any partition writes, a batch whose marks recorded
    another table than the sink's now
    (:func:`~fanout_postgres.membership.other_table_marks`): ``table`` moved after they
    committed and before the ledger mark (another OID and another name), or the table
    of that name replaced (another OID, the same name: renamed away, or dropped, and
    another created or restored from a dump). The replay would skip their partitions,
    and the table named now would never get those rows. A replaced table, when the run
    accepts its loss (``accept_lost``: ``accept_lost_targets``): those marks are deleted
    (in a transaction of their own on ``engine``), and the replay writes their partitions
    into the table as it is (the marks left returned), those of each replaced table (the
    name replaced twice, once mid-batch), all of which a refusal names. One query, only on
    a replay (accepted: one more per replaced table forgotten)."""
    table, state_schema, sink = records.table, records.state_schema, records.sink
    assert table is not None  # open() resolved it
    scope = batch_scope(batch)
    moved, replaced = other_table_marks(conn, state_schema, scope, sink, batch.batch_id,
                                        table.quoted())  # fmt: skip
    gone: set[int] = set()
    if moved is None and replaced:
        if not accept_lost:  # every replaced table at once, not one per run
            _refuse_replaced(records, batch, replaced, tables_now(conn, [r.oid for r in replaced]))
        for each in replaced:  # the name replaced twice, once mid-batch: each OID
            _forget_replaced(engine, records, batch, each)
            gone.update(each.partitions)
    if gone and moved is None:
        return [(mark, query) for mark, query in found if mark.partition not in gone]
    if moved is None:
        return found
    now = "none: it does not exist" if moved.now is None else str(moved.now)
    forget = (
        f"DELETE FROM {quote(state_schema)}.progress WHERE pipeline = "
        f"{sql_literal(scope)} AND sink = {sql_literal(sink)} AND batch_id = "
        f"{batch.batch_id}"
    )
    raise SinkWriteError(
        f"{state_schema}.progress marks partition(s) {moved.partitions} of batch "
        f"{batch.batch_id} of this sink as committed to table {moved.table} (OID "
        f"{moved.oid}), but its table is {table} now (OID {now}): option 'table' "
        f"changed after they committed and before the ledger mark. The replay skips "
        f"the partitions marked committed, so {table} would never get their rows, and "
        f"nothing was written. Set table back to {moved.table} and restart: the replay "
        f"completes batch {batch.batch_id} there; move the table once the batch is "
        f"marked (the next batch then starts in {table}). Or, to write all of batch "
        f"{batch.batch_id} into {table} (its committed part stays in {moved.table}), "
        f"delete its marks first: {forget}",
        sink=sink,
        batch_id=batch.batch_id,
    )


def _refuse_replaced(
    records: SinkRecords, batch: Batch, replaced: Sequence[MovedMarks], now_named: Mapping[int, str]
) -> None:
    """Refuse a replay whose marks ``replaced`` recorded other tables under the sink's
    table name (:func:`refuse_moved`), naming every one of them, where each is now
    (``now_named``: :func:`~fanout_postgres.membership.tables_now`), and the ways on:
    one table still there, bringing it back or naming it in option ``table`` works;
    one dropped, or two or more (the name replaced once mid-batch), only accepting the
    loss or the ``UPDATE`` does, which the refusal says."""
    table, scope, batch_id = records.table, batch_scope(batch), batch.batch_id
    state_schema, sink = records.state_schema, records.sink
    now_oid = replaced[0].now
    now = f"no table {table} exists now" if now_oid is None else (
        f"table {table} has OID {now_oid} now"
    )  # fmt: skip

    def where(oid: int) -> str:
        found = now_named.get(oid)
        return (
            f"OID {oid}, now {found}"
            if found
            else f"OID {oid}: no table of this database has that OID now"
        )

    oids = [each.oid for each in replaced]
    named = ", and ".join(
        f"partition(s) {each.partitions} of batch {batch_id} of this sink as committed "
        f"to table {table} ({where(each.oid)})"
        if n == 0 else f"partition(s) {each.partitions} to table {table} ({where(each.oid)})"
        for n, each in enumerate(replaced)
    )  # fmt: skip
    repoint = (
        "" if now_oid is None
        else " A dump taken after the crash may already hold them: then accepting would "
        "write them a second time; instead make the marks name the table as it is, and "
        "the replay skips their partitions (each row once): "
        + repoint_marks_sql(state_schema, scope, sink, batch_id, oids, now_oid)
    )  # fmt: skip
    away = (
        "" if now_oid is None
        else f", once the table named {table} now is renamed away or dropped"
    )  # fmt: skip
    old = now_named.get(oids[0]) if len(replaced) == 1 else None
    if old is not None:
        back = (
            f"Bring the table of OID {oids[0]} ({old} now) back under the name {table} "
            f"(ALTER TABLE ... RENAME TO, or SET SCHEMA){away}, or set option table to "
            f"{old}, and restart: the replay completes batch {batch_id} there. If "
            f"{old} never moved, the name {table} resolves to another table than at the "
            "crash: the search path changed (the URL's options, or the role's or "
            "database's search_path); set it back and restart. Or accept"
        )
        stays = f"stays in the table of OID {oids[0]}"
    elif len(replaced) == 1:
        back = (
            f"No table of this database has OID {oids[0]} now (dropped, or the "
            "database restored from a dump), so none can take the batch back. Accept"
        )
        stays = "went with that table"
    else:  # no one table can take the batch back: both ways below still work
        back = (
            f"The batch's committed partitions are in {len(replaced)} tables (OIDs "
            f"{', '.join(str(oid) for oid in oids)}), so bringing one back under the "
            f"name {table} cannot complete it. Accept"
        )
        stays = "stays in the tables of those OIDs"
    raise SinkWriteError(
        f"{state_schema}.progress marks {named}, but {now}: "
        f"{REPLACED_UNDER_ITS_NAME} (or restored from a dump) after they committed and "
        f"before the ledger mark. The replay skips the partitions marked committed, so "
        f"{table} would lack their rows, and nothing was written. {back} the loss for "
        f"this run (`fanout run PIPELINE.toml --accept-lost-target "
        f"{shell_word(sink)}`, FanOut(accept_lost_targets=[{sink!r}])): it "
        f"writes all of batch {batch_id} into {table} as it is, once (its committed "
        f"part {stays}).{repoint}",
        sink=sink,
        batch_id=batch_id,
    )


def _forget_replaced(engine: Any, records: SinkRecords, batch: Batch, replaced: MovedMarks) -> None:
    """The run accepts the loss of the table (``accept_lost_targets``): delete the
    batch's marks ``replaced`` recorded in the table replaced under its name, logged,
    so that the replay writes their partitions into the table as it is, once (marked
    anew there in their transactions; a driver dying before then leaves no mark of the
    old table, and the next replay writes them there too)."""
    with engine.begin() as conn:
        forget_replaced_marks(conn, records.state_schema, batch_scope(batch), records.sink,
                              batch.batch_id, replaced.oid)  # fmt: skip
    logger.warning(
        "sink %r, batch %d: accept_lost_targets: partition(s) %s committed the batch to "
        "table %s of OID %d, not the table of that name now (OID %s): their progress "
        "marks deleted, the replay writes all of the batch into it (the committed part "
        "stays in the table of OID %d, if it is kept)",
        records.sink, batch.batch_id, replaced.partitions, records.table, replaced.oid,
        replaced.now, replaced.oid,
    )  # fmt: skip


def refuse_waiting_letters(conn: Any, records: SinkRecords, batch: Batch) -> None:
    """Without a dead-letter target now, refuse a replay whose committed partitions keep
    refused rows no target holds yet: it would skip those partitions, and the rows
    would be in neither the table nor any dead-letter target. Those of a partition an
    earlier target holds (:attr:`fanout.Batch.earlier`: the driver wrote them there
    before the target was removed) are not waiting."""
    waiting = letters_waiting(conn, records.state_schema, batch_scope(batch), records.sink,
                              batch.batch_id)  # fmt: skip
    waiting = {p: n for p, n in waiting.items() if refused_elsewhere(batch, p) is None}
    if not waiting:
        return
    raise SinkWriteError(
        f"partitions {sorted(waiting)} of table {records.table} committed this batch with "
        f"{sum(waiting.values())} refused row(s) kept for the dead-letter target it had "
        "(the attempt may have ended before they were written there), and the sink has "
        "no dead_letter now: a replay skips those partitions, so the rows would be in "
        "neither the table nor any dead-letter target. Set dead_letter again until batch "
        f"{batch.batch_id} completes (the target it had: a letter it holds is not "
        "written twice)",
        sink=records.sink, batch_id=batch.batch_id,
    )  # fmt: skip


def refuse_later_batch(records: SinkRecords, batch: Batch, later: int | None) -> None:
    """Upsert: refuse a batch when ``upsert_routes`` holds a ``later`` batch of the sink in
    the scope (:func:`~fanout_postgres.membership.upsert_routes`, read by the sink's
    route check): the pipeline started again with a new ledger and checkpoint under the
    same name (docs/architecture.md §8.2, "A straggler of an earlier batch"), whose
    batches up to that one would put keys back to older values; or, the row
    :data:`~fanout_postgres.statements.EPOCH_FENCE`, a later epoch began writing the sink
    and this batch is of the query a checkpoint reset replaced."""
    scope, state_schema, sink = batch_scope(batch), records.state_schema, records.sink
    if later == EPOCH_FENCE:
        raise SinkWriteError(
            f"{state_schema}.upsert_routes records that a later epoch of pipeline "
            f"{batch.pipeline!r} began writing this sink since (a checkpoint reset was "
            f"accepted as a new epoch): batch {batch.batch_id} of epoch "
            f"{batch.info.epoch}, which Spark hands now, is of the query the reset "
            "replaced, still running, and would put keys of "
            f"{records.table} back to older values. Nothing was written; stop that "
            f"query. {FENCE_LEFT}"
            + lift_by_hand(repr(batch.pipeline), batch.info.epoch + 1, "restart this query.")
            + f" If {restarted(ledger_too=True)}: {RESTORE_OR_RENAME}, or delete "
            "the earlier run's records first: "
            f"{forget_routes_sql(state_schema, scope, sink)}",
            sink=sink,
            batch_id=batch.batch_id,
        )
    if later is not None:
        raise SinkWriteError(
            f"{state_schema}.upsert_routes records batch {later} of this sink "
            f"committed to {records.table} in pipeline {scope!r}, after batch "
            f"{batch.batch_id}, which Spark hands now. The sink writes its batches in "
            f"order and the ledger marks each before the next, so "
            f"{restarted(ledger_too=True)}, or another pipeline of that name writes this "
            f"sink. Nothing was written: batch {batch.batch_id} would put the keys of the "
            f"batches up to {later} back to older values. {RESTORE_OR_RENAME}, or delete "
            "the earlier run's records first: "
            f"{forget_routes_sql(state_schema, scope, sink)}",
            sink=sink,
            batch_id=batch.batch_id,
        )
