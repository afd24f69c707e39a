"""MERGE helpers shared by both engines: quoting, the merge condition, the rows whose key is
null (dead letters), one row per key as a MERGE source needs (ties decided by value, never
by arrival order), and the order in which a merge chooses each key's winner and refuses
rows (:func:`winners_then_refusals`, docs/architecture.md §7).

Float keys are compared as Spark compares them: ``-0.0`` is the key ``0.0``, and every NaN
is one key; the rows written keep the batch's values (the winning row as it arrived), so
only which rows share a key is normalised, but for a NaN in a key column, which is written
as the one NaN (:func:`canonical_nan_keys`): delta-rs' MERGE (``t.k = s.k``) matches
``-0.0`` with ``0.0``, but a NaN only with a NaN of the same bits, and Spark makes NaNs of
other bits (``0 * Infinity`` computed in a task is ``0xfff8...``, the literal ``'NaN'`` is
``0x7ff8...``). In
``order_by`` (and the other columns breaking a tie) NaN is greater than any number, as
Spark orders it, and nulls lose.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from fanout.contract.dead_letters import DeadLetter, letter_rows
from fanout.errors import SchemaMismatchError, SinkWriteError

_ROW = "__fanout_row__"

Rows = TypeVar("Rows")
"""A batch's rows as an engine holds them: an Arrow table (rs) or a Spark DataFrame."""


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


def canonical_nan_keys(data: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``data`` with every NaN of its float ``keys`` columns made the one NaN (``0x7ff8...``),
    so that the MERGE, which matches NaNs by their bits, finds the key whatever NaN the
    batch that wrote it or this one holds (Spark makes NaNs of other bits). Nothing is
    copied when no key column is a float."""
    for key in keys:
        index = data.schema.get_field_index(key)
        if index < 0 or not _is_float(data.schema.field(index).type):
            continue
        column = data.column(index)
        nan = pa.scalar(float("nan"), column.type)
        data = data.set_column(index, data.field(index), pc.if_else(pc.is_nan(column), nan, column))
    return data


def winners_then_refusals(
    rows: Rows,
    *,
    choose: Callable[[Rows], Rows],
    any_refused: Callable[[Rows], bool],
    split_refused: Callable[[Rows], tuple[Rows, list[DeadLetter]]],
) -> tuple[Rows, list[DeadLetter]]:
    """A merge's source and its refused rows' dead letters, in the order architecture §7
    sets for a sink keeping one row per key: each key's winner is chosen among all the
    batch's rows of the key, refused or not, and only then are rows refused.

    ``choose`` keeps one row per key (with ``order_by`` the greatest; without, it fails on
    a key held twice, a refused row counting for its key); ``split_refused`` sets the
    refused winners aside as dead letters, or fails the batch when there is no
    dead-letter target. A refused row that lost its key is gone with the other losers:
    superseded, never a dead letter. A refused winner is its key's one dead letter and
    the key keeps its value in the table (its other rows were superseded by it).

    ``any_refused`` (over the whole batch, without building letters) keeps the common
    path as it was: with no refused row, only ``choose`` runs. Rows with no key (a null
    key) take no part: the caller sets them aside before, as they have no key to win."""
    if not any_refused(rows):
        return choose(rows), []
    return split_refused(choose(rows))


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
    normalised = pa.table({k: _normalised(data.column(k)) for k in keys})
    counts = normalised.group_by(list(keys)).aggregate([([], "count_all")])
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
    """One row per key: the greatest ``order_by`` values win (nulls lose, NaN beats any
    number), ties go to the greatest values of the other columns in batch column order,
    never to the arrival order (a replay may deliver the rows in another order). Rows
    tied on every column are equal, so which of them is kept does not matter; values
    equal as numbers but not as bits (``0.0`` and ``-0.0``, NaNs), in a key column too
    (``0.0`` wins over ``-0.0``), are last ordered by their bits.

    The other columns are sort keys only when some key has a tie on ``order_by``: a batch
    without ties (the common case) pays for no more than sorting on keys and ``order_by``
    (turning nested columns into sortable text is a Python loop over every row)."""
    others = [c for c in data.column_names if c not in keys and c not in order_by]
    numbered = data.append_column(_ROW, pa.array(range(data.num_rows), pa.int64()))
    key_columns = []
    for index, key in enumerate(keys):
        column = data.column(key)
        if not _is_float(column.type):
            key_columns.append(key)
            continue
        # one key for 0.0 and -0.0, one for every NaN: compared as bits, NaN equals NaN
        stand_in = f"__fanout_key_{index}__"
        numbered = numbered.append_column(stand_in, _bits(_normalised(column)))
        key_columns.append(stand_in)
    numbered, order_keys = _sort_keys(numbered, list(order_by), "order")
    tie_keys: list[str] = []
    exact: list[str] = []
    if _has_ties(data, [*keys, *order_by]):
        if others:
            numbered, tie_keys = _with_tie_keys(numbered, others)
        # keys too: 0.0 and -0.0 are one key, and the one written must not be the arrival's
        floats = [c for c in [*keys, *order_by, *others] if _is_float(data.column(c).type)]
        for index, name in enumerate(floats):
            exact.append(f"__fanout_bits_{index}__")
            numbered = numbered.append_column(exact[-1], _bits(numbered.column(name)))
    sort_keys = [(c, "ascending", "at_start")
                 for c in [*key_columns, *order_keys, *tie_keys, *exact, _ROW]]  # fmt: skip
    ordered = numbered.take(pc.sort_indices(numbered, sort_keys=sort_keys))
    n = ordered.num_rows
    # After the sort, the winner of each key is the last row of its run of equal keys.
    last = pa.array([False] * (n - 1) + [True]) if n else pa.array([], pa.bool_())
    for key in key_columns:
        column = ordered.column(key)
        changed = pc.not_equal(column.slice(0, n - 1), column.slice(1))
        tail = pa.chunked_array([changed.combine_chunks(), pa.array([True])])
        last = pc.or_(last, tail)
    return ordered.filter(last).sort_by(_ROW).select(data.column_names)


def _has_ties(data: pa.Table, columns: list[str]) -> bool:
    """Whether two rows share the values of every one of ``columns`` (nulls count as
    equal to each other, and so do ``0.0`` and ``-0.0``, and all NaNs)."""
    normalised = pa.table({c: _normalised(data.column(c)) for c in columns})
    groups = normalised.group_by(columns).aggregate([([], "count_all")])
    return groups.num_rows < data.num_rows


def _sort_keys(numbered: pa.Table, columns: list[str], prefix: str) -> tuple[pa.Table, list[str]]:
    """``numbered`` with a stand-in for each float of ``columns`` making NaN sort greatest
    (Arrow sorts it first among non-nulls), and the sort keys in column order: for a float,
    whether it is NaN (null for a null, which sorts first and loses), then the value."""
    keys: list[str] = []
    for index, name in enumerate(columns):
        column = numbered.column(name)
        if _is_float(column.type):
            stand_in = f"__fanout_{prefix}_nan_{index}__"
            numbered = numbered.append_column(stand_in, pc.is_nan(column))
            keys.append(stand_in)
        keys.append(name)
    return numbered, keys


def _is_float(kind: pa.DataType) -> bool:
    """A float type whose NaNs and zeros are normalised (Delta has no 16-bit float)."""
    return pa.types.is_float32(kind) or pa.types.is_float64(kind)


def _normalised(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A float column with ``-0.0`` as ``0.0`` and every NaN as the one NaN, as Spark
    compares keys (other types as they are)."""
    if not _is_float(column.type):
        return column
    nan = pa.scalar(float("nan"), column.type)
    # x + 0.0 is x for every x but -0.0, which becomes 0.0
    return pc.if_else(pc.is_nan(column), nan, pc.add(column, pa.scalar(0.0, column.type)))


def _bits(column: pa.ChunkedArray) -> pa.Array:
    """A float column's bits as integers: equal exactly when the floats are the same."""
    width = pa.int32() if pa.types.is_float32(column.type) else pa.int64()
    return column.combine_chunks().view(width)


def _with_tie_keys(numbered: pa.Table, others: list[str]) -> tuple[pa.Table, list[str]]:
    """``numbered`` with a sortable stand-in for each of ``others`` Arrow cannot sort as
    it is (and for a float, whether it is NaN: NaN sorts greatest, as in ``order_by``),
    and the names of the tie-break sort keys, in column order."""
    tie_keys: list[str] = []
    for index, name in enumerate(others):
        column = numbered.column(name)
        kind = column.type
        if pa.types.is_dictionary(kind):  # Arrow cannot sort these: by their values
            column = column.cast(kind.value_type)
        if pa.types.is_nested(column.type):  # nor lists, maps and structs: compare JSON
            column = _as_json_text(column)
        key = name
        if column is not numbered.column(name):
            key = f"__fanout_tie_{index}__"
            numbered = numbered.append_column(key, column)
        if _is_float(column.type):
            tie_keys.append(f"__fanout_tie_nan_{index}__")
            numbered = numbered.append_column(tie_keys[-1], pc.is_nan(column))
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
