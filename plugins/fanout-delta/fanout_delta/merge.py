"""MERGE helpers shared by both engines: quoting, the merge condition, the rows whose key is
null (dead letters), and one row per key as a MERGE source needs (ties decided by value,
never by arrival order)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from fanout.contract.dead_letters import DeadLetter, letter_rows
from fanout.errors import SchemaMismatchError, SinkWriteError

_ROW = "__fanout_row__"


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
        for row in letter_rows(rejected)
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
