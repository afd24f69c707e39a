"""CHECK constraints added with delta-rs are stored in DataFusion's SQL (``"Amount" > 0``,
``get_field(s, 'a')``, ``arrow_cast(...)``, ``'it''s'``), which delta-rs evaluates at each
write: the Delta sink (engine ``rs``) evaluates them in Spark as delta-rs reads them
(:mod:`fanout_delta.dialect`). Read as Spark SQL, ``"Amount"`` was a string, which failed
every batch (ANSI mode) or refused every row, and ``get_field``/``arrow_cast`` refused the
sink at open. Real Spark batches, real Delta tables."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from arrow_batches import batch_of
from deltalake import DeltaTable, Field, Schema
from deltalake.schema import StructType
from fanout_delta import DeltaSink
from fanout_delta.dialect import spark_expression

from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError

UTC = dt.UTC
ARROW_UTC = 'Timestamp(Microsecond, Some("UTC"))'

CONSTRAINTS = {
    "amount_pos": "Amount > 0",
    "col_pos": "`my col` > 0",
    "sa_pos": "St.A > 0",
    "recent": "ts >= '2020-01-01'",
    "s_int": "CAST(s AS INT) > 0",
    "t_quote": "t != 'it''s'",
}
"""Added with delta-rs, which stores each in DataFusion's SQL."""

STORED = {
    "amount_pos": '"Amount" > 0',
    "col_pos": '"my col" > 0',
    "sa_pos": "get_field(\"St\", 'A') > 0",
    "recent": f"ts >= arrow_cast('2020-01-01T00:00:00.000000', '{ARROW_UTC}')",
    "s_int": "arrow_cast(s, 'Int32') > 0",
    "t_quote": "t != 'it''s'",
}


@pytest.mark.parametrize(
    ("stored", "spark"),
    [
        ('"Amount" > 0', "`Amount` > 0"),
        ('"a""b" > 0', '`a"b` > 0'),
        ("t != 'it''s' AND t != 'a\\b'", "t != 'it\\'s' AND t != 'a\\\\b'"),
        ("get_field(\"S\", 'A') > 0", "`S`.`A` > 0"),
        ("get_field(s, 't', 'a b') > 0", "s.`t`.`a b` > 0"),
        ("arrow_cast(get_field(s, 'a'), 'Float64') > 0.5", "CAST(s.`a` AS DOUBLE) > 0.5"),
        (
            f"ts >= arrow_cast('2020-01-01T08:00:00.000000', '{ARROW_UTC}')",
            "ts >= CAST('2020-01-01T08:00:00.000000Z' AS TIMESTAMP)",
        ),
        (
            "ts >= arrow_cast('2020-01-01T00:00:00.000000', 'Timestamp(Microsecond, None)')",
            "ts >= CAST('2020-01-01T00:00:00.000000' AS TIMESTAMP_NTZ)",
        ),
        # left as they are: a zone Spark would read in the session's, a type it lacks
        (
            "arrow_cast(s, 'Timestamp(Microsecond, Some(\"UTC\"))') > ts",
            "arrow_cast(s, 'Timestamp(Microsecond, Some(\"UTC\"))') > ts",
        ),
        ("arrow_cast(s, 'Decimal128(10, 2)') > 1", "arrow_cast(s, 'Decimal128(10, 2)') > 1"),
        ("(x > 0) IS NOT DISTINCT FROM true", "(x > 0) IS NOT DISTINCT FROM true"),
    ],
)
def test_delta_rs_sql_reads_as_spark_sql(stored, spark):
    assert spark_expression(stored) == spark


def row(i: int, amount: int = 1, col: int = 1, a: int = 1, ts: dt.datetime | None = None,
        s: str = "1", t: str = "ok") -> tuple[Any, ...]:  # fmt: skip
    return (i, amount, col, (a,), ts or dt.datetime(2020, 1, 1, 0, 30, tzinfo=UTC), s, t)


def reason(name: str) -> str:
    return (
        f"breaks the Delta table's CHECK constraint {name} ({STORED[name]}): the expression "
        "is false or null for the row"
    )


@pytest.mark.integration
def test_constraints_delta_rs_stored_refuse_the_rows_delta_rs_refuses(spark, tmp_path):
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    DeltaTable.create(
        path,
        Schema([Field("id", "long"), Field("Amount", "long"), Field("my col", "long"),
                Field("St", StructType([Field("A", "long")])), Field("ts", "timestamp"),
                Field("s", "string"), Field("t", "string")]),
    )  # fmt: skip
    DeltaTable(path).alter.add_constraint(CONSTRAINTS)
    stored = DeltaTable(path).metadata().configuration
    assert {k[len("delta.constraints.") :]: v for k, v in stored.items()} == STORED
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=DeltaDeadLetters(dead)))
    df = spark.createDataFrame(
        [
            row(1),
            row(2, amount=-1),
            row(3, col=-1),
            row(4, a=-1),
            row(5, ts=dt.datetime(2019, 12, 31, 20, 0, tzinfo=UTC)),  # before, in UTC
            row(6, s="-3"),
            row(7, t="it's"),
            row(8, t="its"),
        ],
        "id long, Amount long, `my col` long, St struct<A: long>, ts timestamp, s string, t string",
    )

    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (2, 6)
    assert sorted(r["id"] for r in read_delta(path).to_pylist()) == [1, 8]
    letters = sorted(
        (json.loads(r["row"])["id"], r["reason"]) for r in read_delta(dead).to_pylist()
    )
    assert letters == [
        (2, reason("amount_pos")),
        (3, reason("col_pos")),
        (4, reason("sa_pos")),
        (5, reason("recent")),
        (6, reason("s_int")),
        (7, reason("t_quote")),
    ]


@pytest.mark.integration
def test_a_check_on_a_column_named_in_capitals_refuses_only_its_breaking_rows(spark, tmp_path):
    """delta-rs stores ``Amount > 0`` as ``"Amount" > 0``: read as Spark SQL, a string
    compared with 0, which failed every batch (ANSI mode: ``CAST_INVALID_INPUT``), or
    without ANSI mode sent every row to the dead letters."""
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("Amount", "long")]))
    DeltaTable(path).alter.add_constraint({"amount_pos": "Amount > 0"})
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=DeltaDeadLetters(dead)))

    result = sink.write(batch_of(spark.createDataFrame([(1, 5), (2, -1)], "id long, Amount long")))

    assert (result.rows, result.dead_lettered) == (1, 1)
    assert read_delta(path).to_pylist() == [{"id": 1, "Amount": 5}]
    assert [(json.loads(r["row"]), r["reason"]) for r in read_delta(dead).to_pylist()] == [
        ({"id": 2, "Amount": -1}, reason("amount_pos"))
    ]


@pytest.mark.integration
def test_a_check_spark_fails_on_for_a_row_fails_the_batch_naming_it(spark, tmp_path):
    """A cast of a malformed value (ANSI mode): delta-rs' check fails on that row too, so
    the batch fails, nothing written, naming the sink, the batch and the constraint (it
    was Spark's bare ``CAST_INVALID_INPUT``)."""
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("s", "string")]))
    DeltaTable(path).alter.add_constraint({"s_int": "CAST(s AS INT) > 0"})
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=DeltaDeadLetters(dead)))
    df = spark.createDataFrame([(1, "5"), (2, "abc")], "id long, s string")

    with pytest.raises(SinkWriteError) as failed:
        sink.write(batch_of(df, 3))

    assert str(failed.value).startswith(
        "sink 's', batch 3: Spark cannot evaluate the Delta table's constraints (CHECK s_int "
        "(arrow_cast(s, 'Int32') > 0)) on a row of the batch: [CAST_INVALID_INPUT] The value "
        '\'abc\' of the type "STRING" cannot be cast to "INT"'
    )
    assert str(failed.value).endswith(
        "Nothing was written, and every replay fails alike (delta-rs' own check fails on "
        "such a row too): fix or filter those rows in the stream, or change the constraint "
        "(e.g. try_divide, try_cast)"
    )
    assert read_delta(path).num_rows == 0
