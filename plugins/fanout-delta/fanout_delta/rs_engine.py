"""The delta-rs engine of the Delta sink, driver side: converts the batch to Arrow on the
driver and writes it with the ``deltalake`` package, no JVM jars needed. Every merge runs
here (bounded by ``max_merge_rows``), and appends with ``write_from="driver"``; appends
from the executors are :mod:`fanout_delta.rs_executors`.

Idempotence: every commit carries the transaction ``batch.idempotency_key``
and every write first checks the version already recorded for that app id; delta-rs
records transactions but does not skip by itself. The commit also records the batch's plan,
which a skip checks first (:mod:`fanout_delta.plans`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from fanout.contract.batch import Batch
from fanout.contract.dead_letters import DeadLetter
from fanout.contract.sink import SinkResult
from fanout.delta_tables import io as deltaio
from fanout.delta_tables import ntz
from fanout.delta_tables.compaction import compact
from fanout.delta_tables.distributed import delta_schema
from fanout.delta_tables.values import holds_unstorable
from fanout.errors import SchemaMismatchError, SinkWriteError, TransientSinkError
from fanout_delta.constraints import (
    RefusedRows,
    TableConstraints,
    refuse_spark,
    refused_error,
    split_refused_spark,
    violations,
    write_refused,
)
from fanout_delta.fence import batch_version
from fanout_delta.merge import (
    canonical_nan_keys,
    merge_predicate,
    prepare_merge_source,
    split_null_keys,
    winners_then_refusals,
)
from fanout_delta.partition_values import partition_columns, refuse_unstorable, split_unstorable
from fanout_delta.plans import commit_metadata, refuse_replanned, taken_out
from fanout_delta.schema import (
    GENERATION_EXPRESSION,
    check_batch_schema,
    diff_schemas,
    evolves,
    is_generated,
    nullable_new_columns,
    pad_missing_columns,
)

if TYPE_CHECKING:
    from fanout_delta.target import DeltaTarget

logger = logging.getLogger(__name__)

# Substrings of delta-rs commit errors that a retry can fix (another writer won the race).
_TRANSIENT_MARKERS = ("concurrent", "conflict", "version already exists", "max commit attempts")
# What delta-rs says of rows breaking a CHECK constraint or a NOT NULL column.
_VALIDATION_MARKER = "failed validation check"
_CONSTRAINT_PREFIX = "delta.constraints."


def write_rs(sink: DeltaTarget, batch: Batch) -> SinkResult:
    """Write one batch with delta-rs (append or merge), exactly once per batch id.

    The transaction check and the commit use one snapshot of the table: a writer that
    commits the same app id in between (a zombie driver) makes delta-rs refuse the commit,
    and the check runs again on the fresh snapshot, where the batch is then found done.
    """
    key = batch.idempotency_key
    path, batch_id = sink.path, key.version
    assert path is not None  # checked by open()
    if sink.mode == "merge" and sink.max_merge_rows is not None:
        refuse_big_merge(sink, batch)
    dead = 0
    dead_letters = sink.dead_letters
    # the first attempt starts from the snapshot kept since the last batch, brought up to
    # date; after a lost race the table is opened afresh
    table = sink.latest_table()
    constraints = TableConstraints.of(table, spark=getattr(batch.df, "sparkSession", None))
    data, letters = _constrained(sink, batch, constraints)
    if sink.mode == "merge":
        refused_rows = RefusedRows(tuple(letters), tuple(sink.keys or []))
        data, letters = merge_source(
            sink, data, partition_columns(sink, table), batch_id, refused_rows
        )
    elif dead_letters is not None:
        data, refused = split_unstorable(data, partition_columns(sink, table))
        letters = [*letters, *refused]
    held = _holds(sink, table, batch)
    if dead_letters is not None and (sink.mode == "merge" or letters):
        # Written before the data, idempotently: a replay that skips the data below must
        # find the batch's dead letters already in place. A batch the table holds had
        # them written before its commit, to the target of that attempt, which may be
        # another one now: none are written again.
        dead = len(letters) if held else write_refused(dead_letters, batch, letters,
                                                       constraints, path)  # fmt: skip
    for attempt in range(1, deltaio.COMMIT_ATTEMPTS + 1):
        if attempt > 1:
            table = deltaio.open_table(path, sink.storage_options)
        prepare_table(sink, table, data.schema, batch_id)
        if attempt > 1:
            held = _holds(sink, table, batch)
        if held:
            sink.keep_table(table)
            refuse_replanned(batch, sink.name, path, table, ledger=sink.ledger)
            logger.info("sink %r, batch %d: already in %s, skipped", sink.name, batch_id, path)
            return SinkResult(data.num_rows, dead_lettered=dead, already_written=True)
        if data.num_rows == 0:
            # Nothing to commit: the ledger records the batch, and a replay is empty again.
            sink.keep_table(table)
            return SinkResult(0, {"empty": True, "mode": sink.mode}, dead_lettered=dead)
        try:
            rows, details = _commit(sink, batch, table, data)
        except Exception as exc:
            if deltaio.is_commit_conflict(exc) and attempt < deltaio.COMMIT_ATTEMPTS:
                logger.info("sink %r, batch %d: lost a commit race on %s, checking again: %s",
                            sink.name, batch_id, path, exc)  # fmt: skip
                continue
            error = translate_error(exc, sink, batch_id, data.schema, table)
            if error is exc:  # already fanout's (a SinkError): `raise exc from exc` would
                raise  # make it its own cause, a loop for code walking __cause__
            raise error from exc
        return SinkResult(rows=rows, details=details, dead_lettered=dead)
    raise AssertionError("unreachable")


def _holds(sink: DeltaTarget, table: Any, batch: Batch) -> bool:
    """Whether ``table`` holds the batch: its app transaction at the batch or past it, and
    no RESTORE took it out since (:func:`_restored`). A later epoch's fence on it refuses
    (:mod:`fanout_delta.fence`): a commit from ``table`` would write the batch twice."""
    key = batch.idempotency_key
    written = batch_version(table, batch, sink.name, str(sink.path), sinks=sink.sinks,
                            harmless=sink.rewrite_harmless,
                            storage_options=sink.storage_options)  # fmt: skip
    return written is not None and written >= key.version and not _restored(sink, table, batch)


def _restored(sink: DeltaTarget, table: Any, batch: Batch) -> bool:
    """Whether a RESTORE took the batch the table records out again
    (:func:`fanout_delta.plans.taken_out`): then it is written again, not skipped."""
    key = batch.idempotency_key
    if not taken_out(table, key.app_id, key.version, sink.storage_options):
        return False
    logger.warning(
        "sink %r, batch %d: %s records the batch's transaction, but a RESTORE since its "
        "commit took its rows out; writing it again",
        sink.name, key.version, sink.path,
    )  # fmt: skip
    return True


def prepare_table(sink: DeltaTarget, table: Any, schema: pa.Schema, batch_id: int) -> None:
    """Bring ``table`` (``None``: none yet) to where the batch of ``schema`` can be
    checked and written: finish a creation :func:`fanout.delta_tables.ntz.create_table`
    left half done, and, when the sink merges schemas, give the table the
    ``timestampNtz`` feature a new column needs (once the batch's schema is checked, so a
    refused batch changes nothing). Called before the transaction check, which then runs on
    the table's newest snapshot."""
    ntz.finish_create(table)
    if table is None or not sink.merge_schema:
        return
    stored = delta_schema(schema)
    if not any(ntz.holds_ntz(f.type) for f in stored) or ntz.has_feature(table):
        return
    table_schema = pa.schema(table.schema().to_arrow())
    check_batch_schema(table_schema, schema, merge_schema=True, sink=sink.name,
                       batch_id=batch_id)  # fmt: skip
    ntz.enable_feature(table, stored)


def _constrained(
    sink: DeltaTarget, batch: Batch, constraints: TableConstraints
) -> tuple[pa.Table, list[DeadLetter]]:
    """The batch as Arrow, and the letters of its rows the table's ``constraints`` refuse
    (:mod:`fanout_delta.constraints`), evaluated in Spark on the batch's DataFrame (a batch
    without Spark is left to delta-rs' own check, which fails it whole).

    An append gets the batch without those rows when it has a dead-letter target (the
    batch converted again without them: only when some row is refused), and fails before
    any write naming the first without one. A merge gets the whole batch and every
    refused row's letter: it refuses only the rows that win their key."""
    df = batch.df
    if not constraints or not hasattr(df, "mapInArrow"):
        return batch.arrow(), []
    where = {"sink": sink.name, "batch_id": batch.batch_id}
    if sink.mode == "merge":
        return batch.arrow(), violations(df, constraints, **where)  # type: ignore[arg-type]
    if sink.dead_letters is None:
        refuse_spark(df, constraints, table=sink.path, **where)  # type: ignore[arg-type]
        return batch.arrow(), []
    kept, letters = split_refused_spark(df, constraints, **where)  # type: ignore[arg-type]
    return (kept.toArrow() if letters else batch.arrow()), letters


def merge_source(
    sink: DeltaTarget,
    data: pa.Table,
    partitions: list[str],
    batch_id: int,
    constrained: RefusedRows | None = None,
) -> tuple[pa.Table, list[DeadLetter]]:
    """The batch's one row per key to merge, and the dead letters of the rows set aside:
    each key's winner is chosen among all its rows before a refused one counts
    (:func:`~fanout_delta.merge.winners_then_refusals`). With a dead-letter target, rows
    with a null key (no key to win) and refused winners become dead letters; without one,
    either fails the batch. A winner is refused for its partition value, or when it is
    one of the rows the table's constraints refuse (``constrained``)."""
    keys, order_by, name = sink.keys or [], sink.order_by, sink.name
    letters: list[DeadLetter] = []
    if sink.dead_letters is not None:
        data, letters = split_null_keys(data, keys)
    constrained = constrained or RefusedRows((), tuple(keys))

    def choose(rows: pa.Table) -> pa.Table:
        return prepare_merge_source(rows, keys, order_by, name, batch_id)

    def split(rows: pa.Table) -> tuple[pa.Table, list[DeadLetter]]:
        if sink.dead_letters is not None:
            rows, broken = constrained.split(rows)
            rows, unstorable = split_unstorable(rows, partitions)
            return rows, [*broken, *unstorable]
        _, broken = constrained.split(rows)
        if broken:  # fails on a winner the constraints refuse
            raise refused_error(broken[0], len(broken), sink=name, batch_id=batch_id,
                                table=str(sink.path))  # fmt: skip
        refuse_unstorable(rows, partitions, name, batch_id)  # fails on a refused winner
        return rows, []  # every refused row lost its key

    data, refused = winners_then_refusals(
        data,
        choose=choose,
        any_refused=lambda rows: holds_unstorable(rows, partitions) or constrained.any_in(rows),
        split_refused=split,
    )
    return canonical_nan_keys(data, keys), [*letters, *refused]


def refuse_big_merge(sink: DeltaTarget, batch: Batch) -> None:
    """Fail a merge batch of more than ``max_merge_rows`` rows before converting it on the
    driver, whose memory it would exhaust (counted in Spark: one job, no rows moved)."""
    bound = sink.max_merge_rows
    assert bound is not None
    df = batch.df
    if hasattr(df, "limit") and hasattr(df, "count"):
        rows = int(df.limit(bound + 1).count())
    else:
        rows = batch.arrow().num_rows
    if rows > bound:
        raise SinkWriteError(
            f"the batch holds more than {bound} rows, the sink's max_merge_rows: a merge "
            "runs on the driver (the batch converted to Arrow there) and would exhaust its "
            "memory. Raise max_merge_rows if the driver has the memory (see "
            "docs/architecture.md, the Delta sink), use mode 'append', or make the stream's "
            "batches smaller (maxFilesPerTrigger, maxOffsetsPerTrigger).",
            sink=sink.name,
            batch_id=batch.batch_id,
        )


def _commit(
    sink: DeltaTarget, batch: Batch, table: Any, data: pa.Table
) -> tuple[int, dict[str, Any]]:
    """Append or merge ``data`` (for a merge, one row per key: :func:`merge_source`) in one
    commit based on ``table``, the snapshot whose transaction version was checked
    (``None``: no table yet, the commit creates it), with the batch's transaction and plan.
    Returns the rows written and the result details; the table at the version committed is
    kept for the next batch."""
    key = batch.idempotency_key
    app_id, batch_id = key.app_id, key.version
    table_schema = None
    if table is not None:
        table_schema = pa.schema(table.schema().to_arrow())
        check_batch_schema(
            table_schema,
            data.schema,
            merge_schema=sink.merge_schema,
            sink=sink.name,
            batch_id=batch_id,
            merge=sink.mode == "merge",
        )
    if sink.mode == "append":  # without a dead-letter target (else split off already)
        refuse_unstorable(data, partition_columns(sink, table), sink.name, batch_id)
    commit = deltaio.commit_properties({app_id: batch_id}, commit_metadata(batch))
    details: dict[str, Any] = {"mode": sink.mode}
    # only a batch adding columns asks for schema evolution (refused with column mapping)
    merge_schema = sink.merge_schema and (
        table_schema is None or evolves(table_schema, data.schema)
    )
    if merge_schema and table_schema is not None:
        data = nullable_new_columns(data, table_schema)
    if table is None or sink.mode == "append":
        if table_schema is not None:
            data = pad_missing_columns(data, table_schema)
        table = _append(sink, table, data, commit, merge_schema=merge_schema)
    else:
        metrics = (
            table.merge(
                source=data,
                predicate=merge_predicate(sink.keys or []),
                source_alias="s",
                target_alias="t",
                merge_schema=merge_schema,
                commit_properties=commit,
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        details["inserted"] = metrics.get("num_target_rows_inserted")
        details["updated"] = metrics.get("num_target_rows_updated")
    # write_deltalake and merge advance `table` to the version they committed
    if table is None:
        table = deltaio.open_table(sink.path, sink.storage_options)  # type: ignore[arg-type]
    details["version"] = table.version() if table is not None else None
    sink.keep_table(table)
    return data.num_rows, details


def _append(
    sink: DeltaTarget, table: Any, data: pa.Table, commit: Any, *, merge_schema: bool
) -> Any:
    """Append to the checked snapshot ``table``; with no table yet, create it, failing
    (a commit conflict) if another writer created it since the check. Returns the table
    appended to (``None`` when this call created it with the data). ``merge_schema``:
    the batch adds columns the table gains."""
    from deltalake import write_deltalake

    assert sink.path is not None  # checked by open()
    if table is None and ntz.hidden_ntz(data.schema):
        # delta-rs would not give the table the timestampNtz feature: create it empty
        # with the feature first, then append to that snapshot.
        table = ntz.create_table(
            sink.path,
            delta_schema(data.schema),
            partition_by=sink.partition_by,
            configuration=sink.configuration,
            storage_options=sink.storage_options,
        )
    create = table is None
    write_deltalake(
        sink.path if create else table,
        data,
        mode="error" if create else "append",
        partition_by=list(sink.partition_by) if sink.partition_by else None,
        schema_mode="merge" if merge_schema else None,  # type: ignore[arg-type]
        configuration=dict(sink.configuration) if create and sink.configuration else None,
        storage_options=dict(sink.storage_options) if create and sink.storage_options else None,
        commit_properties=commit,
    )
    return table


def compact_rs(path: str, storage_options: Mapping[str, str] | None, what: str) -> dict[str, Any]:
    """Bin-pack the table's small files (``OPTIMIZE``), taken back at once when another
    compaction of the same files came first (:func:`fanout.delta_tables.compaction.compact`);
    return what it did (empty when no table exists yet, e.g. after empty batches only)."""
    table = deltaio.open_table(path, storage_options)
    if table is None:
        return {}
    done = compact(table, what, storage_options)
    return {
        "numFilesRemoved": done.files_removed,
        "numFilesAdded": done.files_added,
        "takenBack": done.taken_back,
    }


def translate_error(
    exc: Exception, sink: DeltaTarget, batch_id: int, batch_schema: pa.Schema, table: Any
) -> Exception:
    """Turn a delta-rs exception into the fanout error that says what happened."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.exceptions import SchemaMismatchError as DeltaSchemaMismatch

    from fanout.errors import SinkError

    if isinstance(exc, SinkError):
        return exc
    if isinstance(exc, DeltaSchemaMismatch):
        columns: list[str] = []
        if table is not None:
            diff = diff_schemas(
                pa.schema(table.schema().to_arrow()), batch_schema, merge_schema=False
            )
            columns = diff.new_columns + [name for name, _, _ in diff.conflicts]
        return SchemaMismatchError(
            f"delta-rs rejected the batch schema: {exc}",
            sink=sink.name,
            batch_id=batch_id,
            columns=columns,
        )
    text = str(exc).lower()
    if _VALIDATION_MARKER in text and table is not None:
        return _constraint_error(exc, sink, batch_id, table)
    if isinstance(exc, CommitFailedError) and any(m in text for m in _TRANSIENT_MARKERS):
        return TransientSinkError(f"commit conflict, will retry: {exc}", sink=sink.name,
                                  batch_id=batch_id)  # fmt: skip
    return SinkWriteError(
        f"delta-rs {sink.mode} to {sink.path} failed: {type(exc).__name__}: {exc}",
        sink=sink.name,
        batch_id=batch_id,
    )


def _constraint_error(exc: Exception, sink: DeltaTarget, batch_id: int, table: Any) -> Exception:
    """The error for rows the table's constraints refuse at delta-rs' own check (a batch
    that is no Spark DataFrame, which :mod:`fanout_delta.constraints` cannot evaluate, or a
    constraint another writer added after the sink's snapshot): delta-rs previews the rows but
    names neither the constraint nor the column, so say which the table has (its CHECK
    constraints, NOT NULL columns, invariants, arrays and maps that may hold no null) and
    that every replay fails alike until the rows are fixed or filtered."""
    configuration = table.metadata().configuration
    checks = [
        f"CHECK {name[len(_CONSTRAINT_PREFIX) :]} ({expression})"
        for name, expression in sorted(configuration.items())
        if name.startswith(_CONSTRAINT_PREFIX)
    ]
    fields = pa.schema(table.schema().to_arrow())
    not_null = [f"NOT NULL {f.name!r}" for f in fields if not f.nullable]
    nested = ("invariant", "not_null_element", "not_null_value")
    not_null += [r.label for r in TableConstraints.of(table).rules if r.kind in nested]
    # a merge's update keeps a generated column's old value (delta-rs does not compute it)
    generated = [
        f"GENERATED {f.name!r} AS ({(f.metadata or {})[GENERATION_EXPRESSION].decode()})"
        for f in fields
        if is_generated(f)
    ]
    return SinkWriteError(
        f"rows of the batch break the constraints of the Delta table {sink.path} "
        f"({', '.join([*checks, *not_null, *generated]) or 'none found'}); nothing was "
        "written and every replay fails alike: fix or filter those rows in the stream (a "
        "route's 'where' sends them to the dead letters; a merge updating a generated "
        "column's inputs must carry its value), or change the table's constraints. "
        f"delta-rs: {exc}",
        sink=sink.name,
        batch_id=batch_id,
    )
