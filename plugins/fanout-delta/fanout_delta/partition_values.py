"""The rows whose partition value no Delta table can keep, refused alike by every writer of
the sink (:mod:`fanout.delta_tables.values` says which values): an empty string, which a
Delta reader reads as null, and a date or timestamp past the year 9999 (in UTC), which
delta-rs writes but cannot read back. Such rows go to the sink's dead-letter target when it
has one; otherwise the batch fails naming sink, batch, column and value. The executors'
append refuses them in its Spark tasks (:mod:`fanout.delta_tables.datafiles`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.dead_letters import DeadLetter, letter_rows
from fanout.delta_tables.values import (
    EMPTY_PROBLEM,
    refusal,
    spark_unstorable,
    unstorable_rows,
)
from fanout.errors import SinkWriteError

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout_delta.target import DeltaTarget


def partition_columns(sink: DeltaTarget, table: Any) -> list[str]:
    """The table's partition columns: an existing table's (``table``, delta-rs), else the
    sink's ``partition_by``, which creates it."""
    if table is not None:
        return list(table.metadata().partition_columns)
    return list(sink.partition_by or [])


def split_unstorable(data: pa.Table, columns: Sequence[str]) -> tuple[pa.Table, list[DeadLetter]]:
    """The rows every partition ``columns``' value of which a Delta table can keep, and a
    dead letter for each other row."""
    import pyarrow.compute as pc

    mask, faults = unstorable_rows(data, columns)
    if mask is None:
        return data, []
    rejected = data.filter(mask)
    letters = [
        DeadLetter(row, refusal(column, problem), column, row[column])
        for row, (column, problem) in zip(letter_rows(rejected), faults, strict=True)
    ]
    return data.filter(pc.invert(mask)), letters


def refuse_unstorable(data: pa.Table, columns: Sequence[str], sink: str, batch_id: int) -> None:
    """Fail the batch when one of its rows holds a partition value no Delta table can
    keep, naming the column and value (the first such row's) and how many rows do."""
    mask, faults = unstorable_rows(data, columns)
    if mask is None:
        return
    column, problem = faults[0]
    raise SinkWriteError(f"{len(faults)} row(s): {refusal(column, problem)}", sink=sink,
                         batch_id=batch_id)  # fmt: skip


def split_unstorable_spark(
    df: Any, columns: Sequence[str], *, years: bool
) -> tuple[Any, list[DeadLetter]]:
    """:func:`split_unstorable` of a Spark DataFrame (``years``: also the timestamps past
    the year 9999 in UTC, which only delta-rs refuses). The refused rows are collected to
    the driver (as Arrow: Python's datetime cannot hold such a timestamp), one Spark job;
    they are expected to be few. No job when no partition column may hold such a value."""
    import functools

    conditions = spark_unstorable(df.schema, columns, years=years)
    if not conditions:
        return df, []
    bad = functools.reduce(lambda a, b: a | b, [c for _, c in conditions])
    rejected = df.filter(bad).toArrow()
    _, letters = split_unstorable(rejected, columns)
    if len(letters) != rejected.num_rows:  # Spark's condition and Arrow's must agree
        raise AssertionError(f"{rejected.num_rows} row(s) refused, {len(letters)} explained")
    return df.filter(~_or_false(bad)), letters


def holds_unstorable_spark(df: Any, columns: Sequence[str], *, years: bool) -> bool:
    """:func:`~fanout.delta_tables.values.holds_unstorable` of a Spark DataFrame (``years``
    as in :func:`split_unstorable_spark`): one Spark job stopping at the first such row,
    none when no partition column may hold one."""
    import functools

    conditions = spark_unstorable(df.schema, columns, years=years)
    if not conditions:
        return False
    bad = functools.reduce(lambda a, b: a | b, [c for _, c in conditions])
    return bool(df.filter(bad).limit(1).count())


def refuse_unstorable_spark(df: Any, columns: Sequence[str], sink: str, batch_id: int) -> None:
    """:func:`refuse_unstorable` of a Spark DataFrame for delta-spark: the empty string
    (one Spark job, only when a partition column holds strings)."""
    from pyspark.sql import functions as F

    conditions = spark_unstorable(df.schema, columns, years=False)
    if not conditions:
        return
    counts = df.agg(*[F.count_if(c).alias(f"c{i}") for i, (_, c) in enumerate(conditions)])
    found = counts.first()
    for index, (column, _) in enumerate(conditions):
        if found[index]:
            raise SinkWriteError(f"{found[index]} row(s): {refusal(column, EMPTY_PROBLEM)}",
                                 sink=sink, batch_id=batch_id)  # fmt: skip


def _or_false(condition: Any) -> Any:
    """``condition``, false where it is null (a null partition value is kept)."""
    from pyspark.sql import functions as F

    return F.coalesce(condition, F.lit(False))
