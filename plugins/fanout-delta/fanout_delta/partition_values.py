"""The rows whose partition value no Delta table can keep, refused alike by every writer of
the sink (:mod:`fanout.delta_tables.values` says which values): an empty string, which a
Delta reader reads as null, a value whose partition directory's name, as the sink's engine
makes it, would be longer than a file system allows (255 bytes), and with delta-rs a date
or timestamp past the year 9999 (in UTC), which delta-rs writes but cannot read back, and a
negative decimal with a fractional part, which delta-rs writes as ``-1.-50`` and then fails
its commit on (a decimal partition column is always written from the driver). Such
rows go to the sink's dead-letter target when it has one; otherwise the batch fails naming
sink, batch, column and value. The executors' append refuses them in its Spark tasks
(:mod:`fanout.delta_tables.datafiles`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.dead_letters import DeadLetter, letter_rows
from fanout.delta_tables.values import Engine, refusal, spark_unstorable, unstorable_rows
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


def split_unstorable(
    data: pa.Table, columns: Sequence[str], engine: Engine = "rs"
) -> tuple[pa.Table, list[DeadLetter]]:
    """The rows every partition ``columns``' value of which a Delta table written by
    ``engine`` can keep, and a dead letter for each other row."""
    import pyarrow.compute as pc

    mask, faults = unstorable_rows(data, columns, engine)
    if mask is None:
        return data, []
    rejected = data.filter(mask)
    letters = [
        DeadLetter(row, refusal(column, problem), column, row[column])
        for row, (column, problem) in zip(letter_rows(rejected), faults, strict=True)
    ]
    return data.filter(pc.invert(mask)), letters


def refuse_unstorable(
    data: pa.Table, columns: Sequence[str], sink: str, batch_id: int, engine: Engine = "rs"
) -> None:
    """Fail the batch when one of its rows holds a partition value no Delta table written
    by ``engine`` can keep, naming the column and value (the first such row's) and how
    many rows do."""
    mask, faults = unstorable_rows(data, columns, engine)
    if mask is None:
        return
    column, problem = faults[0]
    raise SinkWriteError(f"{len(faults)} row(s): {refusal(column, problem)}", sink=sink,
                         batch_id=batch_id)  # fmt: skip


def split_unstorable_spark(
    df: Any, columns: Sequence[str], *, engine: Engine
) -> tuple[Any, list[DeadLetter]]:
    """:func:`split_unstorable` of a Spark DataFrame written by ``engine`` (for ``rs``
    also the timestamps past the year 9999 in UTC). The refused rows are collected to the
    driver (as Arrow: Python's datetime cannot hold such a timestamp), one Spark job; they
    are expected to be few. No job when no partition column may hold such a value."""
    bad = _unstorable_condition(df, columns, engine)
    if bad is None:
        return df, []
    rejected = df.filter(bad).toArrow()
    _, letters = split_unstorable(rejected, columns, engine)
    if len(letters) != rejected.num_rows:  # Spark's condition and Arrow's must agree
        raise AssertionError(f"{rejected.num_rows} row(s) refused, {len(letters)} explained")
    return df.filter(~_or_false(bad)), letters


def holds_unstorable_spark(df: Any, columns: Sequence[str], *, engine: Engine) -> bool:
    """:func:`~fanout.delta_tables.values.holds_unstorable` of a Spark DataFrame written
    by ``engine``: one Spark job stopping at the first such row, none when no partition
    column may hold one."""
    bad = _unstorable_condition(df, columns, engine)
    return bad is not None and bool(df.filter(bad).limit(1).count())


def refuse_unstorable_spark(df: Any, columns: Sequence[str], sink: str, batch_id: int) -> None:
    """:func:`refuse_unstorable` of a Spark DataFrame for delta-spark, with the same text:
    one Spark job finding the first refused row (only when a partition column holds
    strings), and one more counting them when there is one."""
    bad = _unstorable_condition(df, columns, "spark")
    if bad is None:
        return
    first = df.filter(bad).limit(1).toArrow()
    if not first.num_rows:
        return
    _, faults = unstorable_rows(first, columns, "spark")
    column, problem = faults[0]
    raise SinkWriteError(f"{df.filter(bad).count()} row(s): {refusal(column, problem)}",
                         sink=sink, batch_id=batch_id)  # fmt: skip


def _unstorable_condition(df: Any, columns: Sequence[str], engine: Engine) -> Any:
    """The Spark condition of the rows :func:`~fanout.delta_tables.values.spark_unstorable`
    finds, ``None`` when no partition column may hold such a value."""
    conditions = spark_unstorable(df.schema, columns, engine=engine)
    if not conditions:
        return None
    return functools.reduce(lambda a, b: a | b, [c for _, c in conditions])


def _or_false(condition: Any) -> Any:
    """``condition``, false where it is null (a null partition value is kept)."""
    from pyspark.sql import functions as F

    return F.coalesce(condition, F.lit(False))
