"""Values as the COPY paths carry them, driven through the partition writer itself (a real
write plan from a real server, Arrow rows built here, no Spark): which row a COPY error
names, instants that mean the same on the binary and the CSV path, and dead letters of
rows holding what ``jsonb`` and ``text`` cannot (NUL, NaN, Infinity), and arrays, maps and
structs as JSON (a map an object, empty too; a decimal a number); and upserts into columns
of types without an equality operator (or with one that compares areas).

A refused row is found by the line COPY's error names; the contexts of a json input
function or a trigger name lines of their own, and a quoted line break in a value makes
COPY's line count run ahead of the rows."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal
from typing import Any

import psycopg2
import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.sqlstate import copy_position
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import dsn, execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.contract.sink import SinkContext
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink


def _writer(url: str, table: str, schema: T.StructType, **options: Any) -> Any:
    """The partition writer of ``table`` for batches of ``schema``, as an executor runs it."""
    sink = open_sink(PostgresSink("pg", url=url, table=table, **options), "values")
    plan = write_plan(sink, schema, 0)
    return PostgresPartitionWriter(
        sink.connection_url(), plan, BatchMeta("values", 0, "q"), False, 0.0
    )


def _write(writer: Any, rows: pa.Table, partition: int = 0) -> Any:
    hooks = CommitHooks("values", "pg", 0)
    return writer.write_partition(partition, iter(rows.to_batches()), hooks, MemberDigest())


def test_a_bad_json_value_rejects_its_own_row_only(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE docs (id bigint PRIMARY KEY, doc jsonb, j json, note text)")
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("doc", T.StringType()),
         T.StructField("j", T.StringType()), T.StructField("note", T.StringType())]
    )  # fmt: skip
    rows = pa.table(
        {
            "id": pa.array(range(1, 9), pa.int64()),
            "doc": [
                '{"a": 1}',
                "{}",
                '{\n  "a": [1,\n 2]\n}',
                "{bad",
                "[]",
                None,
                "{}",
                "{\n\n x}",
            ],
            "j": ["{}", None, "[]", "{}", "1", "{\n bad", "{}", None],
            "note": ["first\rrow", "two\nlines", None, "x", "\r\n", "y", "a\nb\nc", None],
        }
    )
    writer = _writer(pg_url, "docs", schema, dead_letter="postgres:rejects")
    outcome = _write(writer, rows)
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 5, 3)
    assert query(pg_url, "SELECT id FROM docs ORDER BY id") == [(1,), (2,), (3,), (5,), (7,)]
    letters = query(pg_url, "SELECT (row->>'id')::int, column_name, value FROM rejects ORDER BY 1")
    assert letters == [(4, "doc", "{bad"), (6, "j", "{\n bad"), (8, "doc", "{\n\n x}")]
    reasons = query(pg_url, "SELECT reason FROM rejects")
    assert all("invalid input syntax for type json" in r for (r,) in reasons)


def test_the_line_of_a_copy_error_is_copy_s_own_not_a_trigger_s(pg_url: str) -> None:
    execute(
        pg_url,
        "CREATE TABLE g (id bigint, v bigint)",
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN\n"
        "IF NEW.v < 0 THEN\nRAISE EXCEPTION 'negative' USING ERRCODE = '23514';\n"
        "END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse BEFORE INSERT ON g FOR EACH ROW EXECUTE FUNCTION refuse()",
    )
    conn = psycopg2.connect(dsn(pg_url))
    try:
        data = b"1,1\n2,1\n3,1\n4,1\n5,-1\n"
        try:
            conn.cursor().copy_expert("COPY g FROM STDIN WITH (FORMAT csv)", io.BytesIO(data))
        except psycopg2.Error as exc:
            assert "line 3 at RAISE" in exc.diag.context  # the trigger's own line comes first
            assert copy_position(exc) == (5, None)
        else:
            raise AssertionError("the trigger did not refuse the row")
    finally:
        conn.close()


NEW_YORK = "America/New_York"  # Spark's session zone here: Arrow columns carry it
INSTANTS = [
    dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.UTC),
    dt.datetime(1880, 1, 1, 0, 0, tzinfo=dt.UTC),  # New York at -04:56:02 then
    dt.datetime(2024, 7, 1, 3, 4, 5, 678901, tzinfo=dt.UTC),
]
STORED = [  # `timestamp`: the UTC wall clock; `timestamptz`: the instant (read in UTC)
    ("2024-01-01 12:00:00", "2024-01-01 12:00:00+00"),
    ("1880-01-01 00:00:00", "1880-01-01 00:00:00+00"),
    ("2024-07-01 03:04:05.678901", "2024-07-01 03:04:05.678901+00"),
]


@pytest.mark.parametrize("path", ["binary", "csv", "csv after a refused row"])
def test_an_instant_is_stored_alike_on_every_copy_path(pg_url: str, path: str) -> None:
    # a numeric column has no binary form here: its table takes the CSV path; a refused
    # row (not json) moves the rest of a binary partition to CSV
    extra = ", n numeric" if path == "csv" else ""
    execute(
        pg_url,
        f"CREATE TABLE times (id bigint PRIMARY KEY, at timestamp, atz timestamptz, "
        f"note jsonb{extra})",
    )
    fields = [
        T.StructField("id", T.LongType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("atz", T.TimestampType()),
        T.StructField("note", T.StringType()),
    ]
    instants = pa.array(INSTANTS, pa.timestamp("us", tz="UTC")).cast(
        pa.timestamp("us", tz=NEW_YORK)
    )
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "at": instants,
            "atz": instants,
            "note": ["1", "2", "3"],
        }
    )
    if path == "csv":
        fields.append(T.StructField("n", T.DecimalType(10, 2)))
        rows = rows.append_column("n", pa.array([None] * 3, pa.decimal128(10, 2)))
    if path == "csv after a refused row":
        rows = pa.concat_tables(
            [
                rows,
                pa.table(
                    {
                        "id": pa.array([4], pa.int64()),
                        "at": instants[:1],
                        "atz": instants[:1],
                        "note": ["{bad"],
                    }
                ),
            ]
        )
    writer = _writer(pg_url, "times", T.StructType(fields), dead_letter="postgres:rejects")
    outcome = _write(writer, rows)
    assert (outcome.status, outcome.rows) == ("committed", 3), outcome.failure
    stored = query(pg_url, "SET TIME ZONE 'UTC'; SELECT at::text, atz::text FROM times ORDER BY id")
    assert stored == STORED


LETTER_ROWS = pa.table(
    {
        "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        # too long for varchar(3), refused by the executor; a NUL: refused by the server
        "name": ["ok", "a\x00bcd", None, None, None, "b\x00"],
        "x": [1.0, 2.0, float("nan"), float("inf"), float("-inf"), 6.0],
    }
)
LETTER_SCHEMA = T.StructType(
    [T.StructField("id", T.LongType()), T.StructField("name", T.StringType()),
     T.StructField("x", T.DoubleType())]
)  # fmt: skip
LETTERS = [  # id, column, value, row->>'name', row->>'x'
    (2, "name", "a\\u0000bcd", "a\\u0000bcd", "2.0"),
    (3, "name", None, None, "NaN"),
    (4, "name", None, None, "Infinity"),
    (5, "name", None, None, "-Infinity"),
    # COPY names no column for an invalid byte: the column holding it is named
    (6, "name", "b\\u0000", "b\\u0000", "6.0"),
]


def test_dead_letters_of_rows_with_nul_nan_and_infinity_are_recorded(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE t (id bigint PRIMARY KEY, name varchar(3) NOT NULL, x float8)")
    writer = _writer(pg_url, "t", LETTER_SCHEMA, dead_letter="postgres:rejects")
    outcome = _write(writer, LETTER_ROWS)
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 1, 5)
    assert query(pg_url, "SELECT id FROM t") == [(1,)]
    letters = query(
        pg_url,
        "SELECT (row->>'id')::int, column_name, value, row->>'name', row->>'x' FROM rejects "
        "ORDER BY 1",
    )
    assert letters == LETTERS


class _ElsewhereLetters:
    """A dead-letter target other than a PostgreSQL table (the driver writes its letters;
    append mode keeps them in the partition's progress mark meanwhile)."""

    def describe(self) -> str:
        return "elsewhere"


def test_append_keeps_such_letters_in_its_progress_mark(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE ap (id bigint, name varchar(3) NOT NULL, x float8)")
    sink = PostgresSink("pg", url=pg_url, table="ap", mode="append")
    sink.open(SinkContext("values", dead_letters=_ElsewhereLetters()))
    plan = write_plan(sink, LETTER_SCHEMA, 0)
    meta = BatchMeta("values", 0, "q")
    writer = PostgresPartitionWriter(sink.connection_url(), plan, meta, False, 0.0)
    outcome = _write(writer, LETTER_ROWS)
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 1, 5)
    kept = query(pg_url, "SELECT r FROM fanout.progress, jsonb_array_elements(rejects) r")
    # the letters as the other target gets them: row and value_json are the core's JSON,
    # which keeps a NUL (no jsonb holds them there: they are strings in the mark)
    letters = sorted([(r["value"], r["value_json"], r["row"]) for (r,) in kept], key=lambda t: t[2])
    assert letters == [
        ("a\\u0000bcd", '"a\\u0000bcd"', '{"id": 2, "name": "a\\u0000bcd", "x": 2.0}'),
        (None, None, '{"id": 3, "name": null, "x": "NaN"}'),
        (None, None, '{"id": 4, "name": null, "x": "Infinity"}'),
        (None, None, '{"id": 5, "name": null, "x": "-Infinity"}'),
        ("b\\u0000", '"b\\u0000"', '{"id": 6, "name": "b\\u0000", "x": 6.0}'),
    ]


def test_nested_values_are_json_by_their_arrow_type(pg_url: str) -> None:
    execute(
        pg_url, "CREATE TABLE nested (id bigint PRIMARY KEY, m jsonb, mj json, s jsonb, a json)"
    )
    money = T.DecimalType(10, 2)
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("m", T.MapType(T.StringType(), money)),
            T.StructField("mj", T.MapType(T.StringType(), T.LongType())),
            T.StructField(
                "s",
                T.StructType(
                    [
                        T.StructField("d", money),
                        T.StructField("i", T.MapType(T.StringType(), T.IntegerType())),
                    ]
                ),
            ),
            T.StructField("a", T.ArrayType(T.DecimalType(20, 10))),
        ]
    )
    struct = pa.struct([("d", pa.decimal128(10, 2)), ("i", pa.map_(pa.string(), pa.int32()))])
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "m": pa.array(
                [[], [("x", Decimal("1.50"))]], pa.map_(pa.string(), pa.decimal128(10, 2))
            ),
            "mj": pa.array([[], [("k", 1)]], pa.map_(pa.string(), pa.int64())),
            "s": pa.array([{"d": Decimal("-0.10"), "i": []}, {"d": None, "i": [("a", 1)]}], struct),
            "a": pa.array(
                [[Decimal("1.5000000000"), Decimal("0")], []], pa.list_(pa.decimal128(20, 10))
            ),
        }
    )
    outcome = _write(_writer(pg_url, "nested", schema), rows)
    assert outcome.status == "committed", outcome.failure
    stored = query(pg_url, "SELECT m::text, mj::text, s::text, a::text FROM nested ORDER BY id")
    assert stored == [
        ("{}", "{}", '{"d": -0.10, "i": {}}', "[1.5000000000, 0.0000000000]"),
        ('{"x": 1.50}', '{"k": 1}', '{"d": null, "i": {"a": 1}}', "[]"),
    ]


NO_EQUALITY = {  # a column type without an equality PostgreSQL can compare by; two values
    "point": ("(1,2)", "(3,4)"),
    "xml": ("<a>1</a>", "<a>2</a>"),
    "box": ("(1,1),(0,0)", "(2,2),(1,1)"),  # same area: box's = calls them equal
    "circle": ("<(0,0),1>", "<(5,5),1>"),
    "point[]": ('{"(1,2)"}', '{"(3,4)"}'),
    "json[]": ('{"{\\"a\\": 1}"}', '{"{\\"a\\": 2}"}'),
    "spot": ("(1,2)", "(3,4)"),  # a domain over point
}


@pytest.mark.parametrize("pg_type", sorted(NO_EQUALITY))
@pytest.mark.filterwarnings("error::sqlalchemy.exc.SAWarning")  # handled: nothing to warn of
def test_upserts_into_a_type_without_equality_compare_its_text(pg_url: str, pg_type: str) -> None:
    first: str | None
    second: str | None
    first, second = NO_EQUALITY[pg_type]
    if pg_type == "xml":
        try:
            query(pg_url, "SELECT '<a/>'::xml")
        except psycopg2.errors.FeatureNotSupported:
            first = second = None  # a server without libxml parses no xml: nulls still upsert
    execute(
        pg_url,
        "CREATE DOMAIN spot AS point",
        f"CREATE TABLE shapes (id bigint PRIMARY KEY, v {pg_type}, ver bigint)",
    )
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("v", T.StringType()),
         T.StructField("ver", T.LongType())]
    )  # fmt: skip
    writer = _writer(pg_url, "shapes", schema, order_by="ver")

    def write(*rows: tuple[int, str | None, int]) -> int:
        ids, values, versions = zip(*rows, strict=True)
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "v": list(values),
                "ver": pa.array(versions, pa.int64()),
            }
        )
        outcome = _write(writer, table)
        assert outcome.status == "committed", outcome.failure
        return int(outcome.counters["changed"])

    def stored() -> list[tuple[Any, ...]]:
        return query(pg_url, "SELECT v::text FROM shapes")

    def text(value: str | None) -> list[tuple[Any, ...]]:
        return query(pg_url, f"SELECT CAST(%s AS {pg_type})::text", (value,))

    assert write((1, first, 1)) == 1
    if first is None:  # xml on a server without libxml: the statements run on nulls
        assert write((1, None, 1)) == 0
        assert write((1, None, 3), (1, None, 2)) == 1
        return
    assert write((1, second, 1)) == 1  # only v changes; one row per key: MERGE on PG 15+
    assert stored() == text(second)
    assert write((1, second, 1)) == 0  # unchanged: not rewritten
    assert write((1, first, 3), (1, second, 2)) == 1  # a key twice: INSERT ... ON CONFLICT
    assert stored() == text(first)


def test_nested_floats_are_spark_s_text_in_a_json_column(pg_url: str) -> None:
    """A float in an array, map or struct reaches a ``json`` column (which keeps the text
    as sent) spelled as Spark's ``to_json`` spells it: ``1.0E20``, a ``float`` ``0.1``,
    a NaN as ``"NaN"``. Python's JSON wrote ``1e+20``, ``0.10000000149011612`` and a bare
    ``NaN``, which PostgreSQL refuses as JSON (the batch failed)."""
    execute(pg_url, "CREATE TABLE nf (id bigint PRIMARY KEY, a json, s json)")
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("a", T.ArrayType(T.DoubleType())),
            T.StructField(
                "s",
                T.StructType(
                    [T.StructField("f", T.FloatType()), T.StructField("d", T.DecimalType(4, 2))]
                ),
            ),
        ]
    )
    struct = pa.struct([("f", pa.float32()), ("d", pa.decimal128(4, 2))])
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "a": pa.array([[1e20, 1e-4], [float("nan"), -0.0]], pa.list_(pa.float64())),
            "s": pa.array([{"f": 0.1, "d": Decimal("1.50")}, {"f": 1.4e-45, "d": None}], struct),
        }
    )
    outcome = _write(_writer(pg_url, "nf", schema), rows)
    assert outcome.status == "committed", outcome.failure
    assert query(pg_url, "SELECT a::text, s::text FROM nf ORDER BY id") == [
        ("[1.0E20, 1.0E-4]", '{"f": 0.1, "d": 1.50}'),
        ('["NaN", -0.0]', '{"f": 1.4E-45, "d": null}'),
    ]


def test_a_refused_float_s_value_is_spark_s_text() -> None:
    """A dead letter's ``value`` (``text``) of a float column is Spark's text, as COPY
    sent it: ``1.0E20``, a ``float`` ``0.1`` (was ``1e+20``, ``0.10000000149011612``)."""
    from fanout_postgres.encode import value_text

    table = pa.table({"d": pa.array([1e20]), "f": pa.array([0.1], pa.float32())})
    assert (value_text(table, 0, "d"), value_text(table, 0, "f")) == ("1.0E20", "0.1")
