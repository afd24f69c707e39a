"""The delta-rs engine of the Delta sink: writes from the driver with the ``deltalake``
package, no JVM jars needed.

Idempotence: every commit carries the transaction ``batch.idempotency_key``
and every write first checks the version already recorded for that app id; delta-rs
records transactions but does not skip by itself.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.deadletters.model import DeadLetter
from fanout.delta_tables import io as deltaio
from fanout.errors import SchemaMismatchError, SinkWriteError, TransientSinkError
from fanout_delta.schema import check_batch_schema, diff_schemas, pad_missing_columns

if TYPE_CHECKING:
    from fanout_delta.sink import DeltaSink

logger = logging.getLogger(__name__)

_ROW = "__fanout_row__"
# Substrings of delta-rs commit errors that a retry can fix (another writer won the race).
_TRANSIENT_MARKERS = ("concurrent", "conflict", "version already exists", "max commit attempts")


def write_rs(sink: DeltaSink, batch: Batch) -> SinkResult:
    """Write one batch with delta-rs (append or merge), exactly once per batch id.

    The transaction check and the commit use one snapshot of the table: a writer that
    commits the same app id in between (a zombie driver) makes delta-rs refuse the commit,
    and the check runs again on the fresh snapshot, where the batch is then found done.
    """
    key = batch.idempotency_key
    path, batch_id, app_id = sink.path, key.version, key.app_id
    assert path is not None  # checked by open()
    data = batch.arrow()
    dead = 0
    dead_letters = sink.dead_letters()
    if sink.mode == "merge" and dead_letters is not None:
        # Written before the data, idempotently: a replay that skips the data below must
        # find the batch's dead letters already in place.
        data, letters = split_null_keys(data, sink.keys or [])
        dead = dead_letters.write(batch, letters)
    for attempt in range(1, deltaio.COMMIT_ATTEMPTS + 1):
        table = deltaio.open_table(path, sink.storage_options)
        written = deltaio.transaction_version(table, app_id)
        if written is not None and written >= batch_id:
            logger.info("sink %r, batch %d: already in %s, skipped", sink.name, batch_id, path)
            return SinkResult(data.num_rows, dead_lettered=dead, already_written=True)
        if data.num_rows == 0:
            # Nothing to commit: the ledger records the batch, and a replay is empty again.
            return SinkResult(0, {"empty": True, "mode": sink.mode}, dead_lettered=dead)
        try:
            rows, details = _commit(sink, app_id, batch_id, table, data)
        except Exception as exc:
            if deltaio.is_commit_conflict(exc) and attempt < deltaio.COMMIT_ATTEMPTS:
                logger.info("sink %r, batch %d: lost a commit race on %s, checking again: %s",
                            sink.name, batch_id, path, exc)  # fmt: skip
                continue
            raise translate_error(exc, sink, batch_id, data.schema, table) from exc
        return SinkResult(rows=rows, details=details, dead_lettered=dead)
    raise AssertionError("unreachable")


def _commit(
    sink: DeltaSink, app_id: str, batch_id: int, table: Any, data: pa.Table
) -> tuple[int, dict[str, Any]]:
    """Append or merge ``data`` in one commit based on ``table``, the snapshot whose
    transaction version was checked (``None``: no table yet, the commit creates it).
    Returns the rows written and the result details."""
    table_schema = None
    if table is not None:
        table_schema = pa.schema(table.schema().to_arrow())
        check_batch_schema(
            table_schema,
            data.schema,
            merge_schema=sink.merge_schema,
            sink=sink.name,
            batch_id=batch_id,
        )
    commit = deltaio.commit_properties({app_id: batch_id})
    details: dict[str, Any] = {"mode": sink.mode}
    if sink.mode == "merge":
        data = prepare_merge_source(data, sink.keys or [], sink.order_by, sink.name, batch_id)
    if table is None or sink.mode == "append":
        if table_schema is not None:
            data = pad_missing_columns(data, table_schema)
        _append(sink, table, data, commit)
    else:
        metrics = (
            table.merge(
                source=data,
                predicate=merge_predicate(sink.keys or []),
                source_alias="s",
                target_alias="t",
                merge_schema=sink.merge_schema,
                commit_properties=commit,
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        details["inserted"] = metrics.get("num_target_rows_inserted")
        details["updated"] = metrics.get("num_target_rows_updated")
    # write_deltalake and merge advance `table` to the version they committed
    details["version"] = table.version() if table is not None else _version(sink)
    return data.num_rows, details


def _append(sink: DeltaSink, table: Any, data: pa.Table, commit: Any) -> None:
    """Append to the checked snapshot ``table``; with no table yet, create it, failing
    (a commit conflict) if another writer created it since the check."""
    from deltalake import write_deltalake

    assert sink.path is not None  # checked by open()
    create = table is None
    write_deltalake(
        sink.path if create else table,
        data,
        mode="error" if create else "append",
        partition_by=list(sink.partition_by) if sink.partition_by else None,
        schema_mode="merge" if sink.merge_schema else None,  # type: ignore[arg-type]
        configuration=dict(sink.configuration) if create and sink.configuration else None,
        storage_options=dict(sink.storage_options) if create and sink.storage_options else None,
        commit_properties=commit,
    )


def _version(sink: DeltaSink) -> int | None:
    table = deltaio.open_table(sink.path, sink.storage_options)  # type: ignore[arg-type]
    return table.version() if table is not None else None


def compact_rs(path: str, storage_options: Mapping[str, str] | None) -> dict[str, Any]:
    """Bin-pack the table's small files (``OPTIMIZE``); return delta-rs' metrics
    (empty when no table exists yet, e.g. after empty batches only)."""
    table = deltaio.open_table(path, storage_options)
    return dict(table.optimize.compact()) if table is not None else {}


def quote(name: str) -> str:
    """Quote a column name for a delta-rs (DataFusion) or Spark SQL expression."""
    return "`" + name.replace("`", "``") + "`"


def merge_predicate(keys: Sequence[str]) -> str:
    """The MERGE condition matching target ``t`` and source ``s`` on every key."""
    return " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)


def split_null_keys(data: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, list[DeadLetter]]:
    """The rows with every key set, and a dead letter for each row with a null key."""
    present = [k for k in keys if k in data.column_names]
    if not present:
        return data, []
    null_any = functools.reduce(pc.or_kleene, [pc.is_null(data.column(k)) for k in present])
    rejected = data.filter(null_any)
    letters = [
        DeadLetter(row, f"null in key column {column!r}: a null key cannot be merged", column)
        for row in rejected.to_pylist()
        for column in [next(k for k in present if row[k] is None)]
    ]
    return data.filter(pc.invert(null_any)), letters


def prepare_merge_source(
    data: pa.Table, keys: Sequence[str], order_by: Sequence[str] | None, sink: str, batch_id: int
) -> pa.Table:
    """Check the keys and keep one row per key, as a MERGE source must.

    With ``order_by`` the row with the greatest ``order_by`` values wins (nulls lose; on
    ties the row with the greatest values of the other columns, in column order: the
    winner never depends on the order the rows arrived in). Without it a duplicate key is an error:
    which row should win is the user's decision, not ours.
    """
    absent = [c for c in [*keys, *(order_by or [])] if c not in data.column_names]
    if absent:
        raise SchemaMismatchError(
            f"merge column(s) {', '.join(map(repr, absent))} (keys/order_by) missing from "
            "the batch",
            sink=sink,
            batch_id=batch_id,
            columns=absent,
        )
    for key in keys:
        nulls = data.column(key).null_count
        if nulls:
            raise SinkWriteError(
                f"{nulls} row(s) have a null in key column {key!r}; a null key cannot be "
                "merged (it matches nothing). Filter or fill those rows in the stream.",
                sink=sink,
                batch_id=batch_id,
            )
    if order_by:
        return _keep_last(data, keys, order_by)
    counts = data.group_by(list(keys)).aggregate([([], "count_all")])
    duplicated = counts.filter(pc.greater(counts.column("count_all"), 1))
    if duplicated.num_rows:
        first = duplicated.slice(0, 1).to_pylist()[0]
        key_value = {k: first[k] for k in keys}
        raise SinkWriteError(
            f"{duplicated.num_rows} key(s) occur more than once in the batch, e.g. {key_value} "
            f"({first['count_all']} rows); a MERGE takes one row per key. Set order_by to the "
            "column(s) whose greatest value wins (e.g. an event time or sequence number), or "
            "deduplicate the stream.",
            sink=sink,
            batch_id=batch_id,
        )
    return data


def _keep_last(data: pa.Table, keys: Sequence[str], order_by: Sequence[str]) -> pa.Table:
    """One row per key: the greatest ``order_by`` values win (nulls lose), ties go to the
    greatest values of the other columns in batch column order, never to the arrival order
    (a replay may deliver the rows in another order). Rows tied on every column are equal,
    so which of them is kept does not matter.

    The other columns are sort keys only when some key has a tie on ``order_by``: a batch
    without ties (the common case) pays for no more than sorting on keys and ``order_by``
    (turning nested columns into sortable text is a Python loop over every row)."""
    others = [c for c in data.column_names if c not in keys and c not in order_by]
    numbered = data.append_column(_ROW, pa.array(range(data.num_rows), pa.int64()))
    tie_keys: list[str] = []
    if others and _has_ties(data, [*keys, *order_by]):
        numbered, tie_keys = _with_tie_keys(numbered, others)
    sort_keys = [(c, "ascending", "at_start") for c in [*keys, *order_by, *tie_keys, _ROW]]
    ordered = numbered.take(pc.sort_indices(numbered, sort_keys=sort_keys))
    n = ordered.num_rows
    # After the sort, the winner of each key is the last row of its run of equal keys.
    last = pa.array([False] * (n - 1) + [True]) if n else pa.array([], pa.bool_())
    for key in keys:
        column = ordered.column(key)
        changed = pc.not_equal(column.slice(0, n - 1), column.slice(1))
        tail = pa.chunked_array([changed.combine_chunks(), pa.array([True])])
        last = pc.or_(last, tail)
    return ordered.filter(last).sort_by(_ROW).select(data.column_names)


def _has_ties(data: pa.Table, columns: list[str]) -> bool:
    """Whether two rows share the values of every one of ``columns`` (nulls, and NaNs,
    count as equal to each other)."""
    groups = data.select(columns).group_by(columns).aggregate([([], "count_all")])
    return groups.num_rows < data.num_rows


def _with_tie_keys(numbered: pa.Table, others: list[str]) -> tuple[pa.Table, list[str]]:
    """``numbered`` with a sortable stand-in for each of ``others`` Arrow cannot sort as
    it is, and the names of the tie-break sort keys, in column order."""
    tie_keys = []
    for index, name in enumerate(others):
        column = numbered.column(name)
        kind = column.type
        if not (pa.types.is_dictionary(kind) or pa.types.is_nested(kind)):
            tie_keys.append(name)
            continue
        if pa.types.is_dictionary(kind):  # Arrow cannot sort these: by their values
            column = column.cast(kind.value_type)
        if pa.types.is_nested(column.type):  # nor lists, maps and structs: compare JSON
            column = _as_json_text(column)
        key = f"__fanout_tie_{index}__"
        numbered = numbered.append_column(key, column)
        tie_keys.append(key)
    return numbered, tie_keys


def _as_json_text(column: pa.ChunkedArray) -> pa.Array:
    """A nested column as sortable text (nulls stay null, so they lose like others)."""
    import json

    return pa.array(
        [None if v is None else json.dumps(v, sort_keys=True, default=str)
         for v in column.to_pylist()],
        pa.string(),
    )  # fmt: skip


def translate_error(
    exc: Exception, sink: DeltaSink, batch_id: int, batch_schema: pa.Schema, table: Any
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
    if isinstance(exc, CommitFailedError) and any(m in text for m in _TRANSIENT_MARKERS):
        return TransientSinkError(f"commit conflict, will retry: {exc}", sink=sink.name,
                                  batch_id=batch_id)  # fmt: skip
    return SinkWriteError(
        f"delta-rs {sink.mode} to {sink.path} failed: {type(exc).__name__}: {exc}",
        sink=sink.name,
        batch_id=batch_id,
    )
