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
from deltalake.schema import ArrayType, MapType, StructType
from fanout_delta import DeltaSink
from fanout_delta.dialect import Untranslatable, integer_divisions, spark_expression

from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import ConfigurationError, SinkWriteError

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
        # an operand of any nesting: DataFusion folds ``a / 2 * 1.0`` into a cast
        ("arrow_cast(a / 2, 'Float64') >= 1", "CAST(a / 2 AS DOUBLE) >= 1"),
        ("arrow_cast((a + 1) / (2), 'Int32') > 0", "CAST((a + 1) / (2) AS INT) > 0"),
        (
            "arrow_cast(arrow_cast(a, 'Float64'), 'Int32') > 0",
            "CAST(CAST(a AS DOUBLE) AS INT) > 0",
        ),
        (
            "arrow_cast(f(a, ')'), 'Utf8View') != 'arrow_cast(a, ''Int32'')'",
            "CAST(f(a, ')') AS STRING) != 'arrow_cast(a, \\'Int32\\')'",
        ),
        (
            "arrow_cast(arrow_cast(a, 'Int64'), 'Decimal128(10, 2)') > 1",
            "arrow_cast(CAST(a AS BIGINT), 'Decimal128(10, 2)') > 1",
        ),
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


TYPES = {"a": "bigint", "b": "int", "x": "double", "2": "int", "-2": "int", "(a * 3)": "bigint",
         "(a DIV 2)": "bigint", "-a": "bigint", "s.`a`": "bigint",
         "'150'::decimal(10, 2)": "decimal(10,2)",
         "((a + 1))": "bigint"}  # fmt: skip


def type_of(expression: str) -> str:
    return TYPES[expression]


@pytest.mark.parametrize(
    ("spark", "divided"),
    [
        ("a / 2 > 1", "(a DIV 2) > 1"),
        ("a/2>1", "(a DIV 2)>1"),
        ("a / 2 >= -1 AND x / 2 > 1", "(a DIV 2) >= -1 AND (x / 2) > 1"),
        ("a * 3 / 2 > 1", "((a * 3) DIV 2) > 1"),
        ("-a / 2 > 1 OR a / -2 > 1", "(-a DIV 2) > 1 OR (a DIV -2) > 1"),
        ("a / 2 / 2 > 0", "((a DIV 2) DIV 2) > 0"),
        ("a - -2 / 2 > b", "a - (-2 DIV 2) > b"),
        ("NOT s.`a` / b IN (1, 2)", "NOT (s.`a` DIV b) IN (1, 2)"),
        ("((a + 1)) / 2 > 1", "(((a + 1)) DIV 2) > 1"),
        (
            "CASE WHEN a / 2 > 1 THEN a ELSE x / 2 END > 0",
            "CASE WHEN (a DIV 2) > 1 THEN a ELSE (x / 2) END > 0",
        ),
        ("a % 2 = 1 AND 'a / 2' != `a/b`", "a % 2 = 1 AND 'a / 2' != `a/b`"),
        # delta-rs' decimal literal (unscaled): a cast binding tighter than the division
        ("x / '150'::decimal(10, 2) > 1", "(x / '150'::decimal(10, 2)) > 1"),
    ],
)
def test_a_division_of_whole_numbers_reads_as_spark_div(spark, divided):
    """DataFusion divides whole numbers as whole numbers (``3 / 2`` is 1), Spark's ``/``
    does not (1.5); ``DIV`` does, truncating toward zero as DataFusion does."""
    assert integer_divisions(spark, type_of) == divided


def test_a_division_whose_operand_has_no_known_type_cannot_be_read():
    with pytest.raises(Untranslatable, match="the type of 'f\\(a\\)', an operand of a division"):
        integer_divisions("f(a) / 2 > 1", type_of)


def letters_of(dead: str) -> list[tuple[int, str]]:
    return sorted((json.loads(r["row"])["id"], r["reason"]) for r in read_delta(dead).to_pylist())


@pytest.mark.integration
def test_a_division_of_whole_numbers_refuses_the_rows_delta_rs_refuses(spark, tmp_path):
    """delta-rs keeps ``a = -3`` under ``a / 2 >= -1`` (-3 / 2 is -1, truncated toward
    zero) and ``a = 3`` under ``a / 2 <= 1`` (1): read as Spark's fractional ``/``, both
    went to the dead letters (-1.5, 1.5). A division of doubles stays fractional."""
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("a", "long"), Field("x", "double")]))
    DeltaTable(path).alter.add_constraint({"low": "a / 2 >= -1"})
    DeltaTable(path).alter.add_constraint({"high": "a / 2 <= 1", "x_half": "x / 2 > 1"})
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=DeltaDeadLetters(dead)))
    rows = [(1, -5, 3.0), (2, -4, 3.0), (3, -3, 3.0), (4, 0, 3.0), (5, 3, 3.0), (6, 4, 3.0),
            (7, 5, 3.0), (8, 1, 2.0), (9, 1, 2.5)]  # fmt: skip
    df = spark.createDataFrame(rows, "id long, a long, x double")

    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (4, 5)
    assert sorted(r["id"] for r in read_delta(path).to_pylist()) == [3, 4, 5, 9]

    def why(name: str, expression: str) -> str:
        return (
            f"breaks the Delta table's CHECK constraint {name} ({expression}): the "
            "expression is false or null for the row"
        )

    assert letters_of(dead) == [
        (1, why("low", "a / 2 >= -1")),
        (2, why("low", "a / 2 >= -1")),
        (6, why("high", "a / 2 <= 1")),
        (7, why("high", "a / 2 <= 1")),
        (8, why("x_half", "x / 2 > 1")),
    ]


@pytest.mark.integration
def test_open_refuses_a_division_whose_operands_spark_cannot_type(spark, tmp_path):
    """A division Spark cannot type (here of a cast to an Arrow type Spark does not know):
    it cannot tell whether delta-rs divides as whole numbers, so the sink refuses to open
    rather than keep or refuse rows delta-rs would not."""
    path = str(tmp_path / "t")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("s", "string")]))
    DeltaTable(path).alter.add_constraint({"d": "CAST(s AS DECIMAL(10, 2)) / 2 > 1"})
    stored = "arrow_cast(s, 'Decimal128(10, 2)') / 2 > '1000000'::decimal(14, 6)"
    assert DeltaTable(path).metadata().configuration["delta.constraints.d"] == stored
    sink = DeltaSink(name="s", path=path, write_from="driver")

    with pytest.raises(ConfigurationError) as refused:
        sink.open(SinkContext(pipeline="p", spark=spark))

    message = str(refused.value)
    assert message.startswith(
        f"Delta sink 's': the table's CHECK d ({stored}) cannot be evaluated by Spark as "
        "delta-rs evaluates it, so the sink cannot tell which rows it refuses: the type of "
        "\"arrow_cast(s, 'Decimal128(10, 2)')\", an operand of a division, cannot be resolved "
        "on the table's columns ("
    )
    assert message.endswith(
        "Rewrite the constraint so both read it alike (e.g. CAST the operands of a division "
        "to DOUBLE, or use DIV for a whole number division) before starting the pipeline"
    )


@pytest.mark.integration
def test_open_without_spark_types_a_division_at_the_first_batch(spark, tmp_path):
    """Without a Spark session at open() (``fanout.testing.open_sink`` without one) a
    division's operands cannot be typed: the table opens, and the first batch's session
    types it (open() refused every table with a whole-number division)."""
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("a", "long")]))
    DeltaTable(path).alter.add_constraint({"high": "a / 2 <= 1"})
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=None, dead_letters=DeltaDeadLetters(dead)))

    df = spark.createDataFrame([(1, 3), (2, 4), (3, -5)], "id long, a long")
    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (2, 1)
    assert sorted(r["id"] for r in read_delta(path).to_pylist()) == [1, 3]
    reason = (
        "breaks the Delta table's CHECK constraint high (a / 2 <= 1): the expression is "
        "false or null for the row"
    )
    assert letters_of(dead) == [(2, reason)]


@pytest.mark.integration
def test_open_without_spark_refuses_an_untypable_division_at_the_first_batch(spark, tmp_path):
    """The division Spark cannot type: the sink opened without a session refuses it when
    the first batch brings one, with open()'s message, nothing written."""
    path = str(tmp_path / "t")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("s", "string")]))
    DeltaTable(path).alter.add_constraint({"d": "CAST(s AS DECIMAL(10, 2)) / 2 > 1"})
    stored = "arrow_cast(s, 'Decimal128(10, 2)') / 2 > '1000000'::decimal(14, 6)"
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=None))

    with pytest.raises(ConfigurationError) as refused:
        sink.write(batch_of(spark.createDataFrame([(1, "5")], "id long, s string")))

    message = str(refused.value)
    assert message.startswith(
        f"Delta sink 's': the table's CHECK d ({stored}) cannot be evaluated by Spark as "
        "delta-rs evaluates it, so the sink cannot tell which rows it refuses: the type of "
        "\"arrow_cast(s, 'Decimal128(10, 2)')\", an operand of a division, cannot be resolved "
        "on the table's columns ("
    )
    assert message.endswith(
        "Rewrite the constraint so both read it alike (e.g. CAST the operands of a division "
        "to DOUBLE, or use DIV for a whole number division) before starting the pipeline"
    )
    assert read_delta(path).num_rows == 0


def refused_by_delta_rs(tmp_path: Any, constraints: dict[str, str], rows: list[tuple[int, int]]
                        ) -> list[int]:  # fmt: skip
    """The ids of ``rows`` (id, a) delta-rs refuses under ``constraints``: each written
    alone to a table holding them."""
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path / "delta_rs")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("a", "long")]))
    DeltaTable(path).alter.add_constraint(constraints)
    refused = []
    for i, a in rows:
        try:
            write_deltalake(path, pa.table({"id": [i], "a": [a]}), mode="append")
        except Exception:
            refused.append(i)
    return refused


@pytest.mark.integration
def test_a_cast_of_a_division_refuses_the_rows_delta_rs_refuses(spark, tmp_path):
    """delta-rs stores ``a / 2 * 1.0 >= 1`` as ``arrow_cast(a / 2, 'Float64') >= 1``: a
    cast of an expression, which was left as ``arrow_cast``, a function Spark does not
    know, so the sink's open() refused the table. Read as Spark SQL, it refuses the rows
    delta-rs refuses, row by row."""
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    checks = {"half": "a / 2 * 1.0 >= 1", "up": "CAST((a + 1) / 2 AS DOUBLE) <= 3"}
    DeltaTable.create(path, Schema([Field("id", "long"), Field("a", "long")]))
    DeltaTable(path).alter.add_constraint(checks)
    stored = {k: DeltaTable(path).metadata().configuration[f"delta.constraints.{k}"]
              for k in checks}  # fmt: skip
    assert stored == {
        "half": "arrow_cast(a / 2, 'Float64') >= 1",
        "up": "arrow_cast((a + 1) / 2, 'Float64') <= 3",
    }
    rows = [(i, a) for i, a in enumerate(range(-3, 9))]
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=DeltaDeadLetters(dead)))

    result = sink.write(batch_of(spark.createDataFrame(rows, "id long, a long")))

    refused = refused_by_delta_rs(tmp_path, checks, rows)
    assert refused == [0, 1, 2, 3, 4, 10, 11]  # a < 2 (1 / 2 is 0), a > 6 ((7 + 1) / 2 is 4)
    assert (result.rows, result.dead_lettered) == (5, 7)
    assert sorted(r["id"] for r in read_delta(path).to_pylist()) == [5, 6, 7, 8, 9]
    assert [i for i, _ in letters_of(dead)] == refused


def invariant(expression: str) -> dict[str, str]:
    return {"delta.invariants": json.dumps({"expression": {"expression": expression}})}


@pytest.mark.integration
def test_invariants_refuse_the_rows_delta_rs_refuses(spark, tmp_path):
    """An older table's column invariants (``delta.invariants``): delta-rs refuses a row
    whose invariant is false or null, top-level or in a struct, in DataFusion's SQL
    (``b / 2`` of whole numbers); they were not evaluated, and delta-rs failed the batch."""
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    DeltaTable.create(
        path,
        Schema([Field("id", "long"), Field("a", "long", metadata=invariant("a > 0")),
                Field("s", StructType([Field("b", "long", metadata=invariant("s.b / 2 > 0"))]))]),
    )  # fmt: skip
    sink = DeltaSink(name="s", path=path, write_from="driver")
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=DeltaDeadLetters(dead)))
    rows = [(1, 1, (2,)), (2, -1, (2,)), (3, None, (2,)), (4, 1, (1,)), (5, 1, (3,)), (6, 1, None)]
    df = spark.createDataFrame(rows, "id long, a long, s struct<b: long>")

    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (2, 4)
    assert sorted(r["id"] for r in read_delta(path).to_pylist()) == [1, 5]
    a, b = (
        f"breaks the Delta table's invariant of column {column!r} ({expression}): the "
        "expression is false or null for the row"
        for column, expression in (("a", "a > 0"), ("s.b", "s.b / 2 > 0"))
    )
    assert letters_of(dead) == [(2, a), (3, a), (4, b), (6, b)]
    columns = sorted(
        (json.loads(r["row"])["id"], r["column"]) for r in read_delta(dead).to_pylist()
    )
    assert columns == [(2, "a"), (3, "a"), (4, "s.b"), (6, "s.b")]


APPENDS = [
    pytest.param({"write_from": "driver"}, id="append-driver"),
    pytest.param({"write_from": "executors"}, id="append-executors"),
]
"""Not a merge: delta-rs 1.6's merge cannot cast a batch's ``struct<array<long>>`` to the
table's array of non-null elements in a struct (``Unsupported CAST``), whatever the rows."""


@pytest.mark.integration
@pytest.mark.parametrize("options", APPENDS)
def test_null_elements_of_arrays_and_values_of_maps_delta_rs_refuses(spark, tmp_path, options):
    """An array whose elements (``containsNull: false``) or a map whose values
    (``valueContainsNull: false``) may not be null, top-level or in a struct: delta-rs
    refuses a row holding such a null (not a null array or map); they were not checked,
    and delta-rs failed the batch."""
    path, dead = str(tmp_path / "t"), str(tmp_path / "dead")
    DeltaTable.create(
        path,
        Schema([Field("id", "long"), Field("arr", ArrayType("long", contains_null=False)),
                Field("m", MapType("string", "long", value_contains_null=False)),
                Field("s", StructType([Field("inner", ArrayType("long", contains_null=False))]))]),
    )  # fmt: skip
    sink = DeltaSink(name="s", path=path, **options)
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=DeltaDeadLetters(dead)))
    rows = [
        (1, [1], {"k": 1}, ([1],)),
        (2, [1, None], {"k": 1}, ([1],)),
        (3, None, None, None),
        (4, [], {"k": None}, ([1],)),
        (5, [2], {}, ([None],)),
        (6, [3], {"k": 2}, (None,)),
    ]
    df = spark.createDataFrame(
        rows, "id long, arr array<long>, m map<string, long>, s struct<inner: array<long>>"
    )

    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (3, 3)
    assert sorted(r["id"] for r in read_delta(path).to_pylist()) == [1, 3, 6]
    elements = "null element in the Delta table's array column {!r}, whose elements may not be null"
    assert letters_of(dead) == [
        (2, elements.format("arr")),
        (4, "null value in the Delta table's map column 'm', whose values may not be null"),
        (5, elements.format("s.inner")),
    ]


@pytest.mark.integration
def test_a_division_is_typed_once_per_table_schema_not_at_every_batch(spark, tmp_path, monkeypatch):
    """Typing a division's operands is a Spark analysis; the constraints are read at each
    batch's write, so the translation is kept per table schema and expression."""
    from fanout_delta import constraints

    path = str(tmp_path / "t")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("a", "long")]))
    DeltaTable(path).alter.add_constraint({"half": "a / 2 <= 7"})
    asked: list[str] = []
    typed_by_spark = constraints._types_on

    def counting(schema: Any, session: Any) -> Any:
        type_of = typed_by_spark(schema, session)

        def counted(expression: str) -> str:
            asked.append(expression)
            return type_of(expression)

        return counted

    monkeypatch.setattr(constraints, "_types_on", counting)
    monkeypatch.setattr(constraints, "_TRANSLATED", {}, raising=False)

    first = constraints.TableConstraints.of(DeltaTable(path), spark=spark)
    again = constraints.TableConstraints.of(DeltaTable(path), spark=spark)

    assert [r.spark for r in first.rules] == [r.spark for r in again.rules] == ["(a DIV 2) <= 7"]
    assert asked == ["a", "2"]
