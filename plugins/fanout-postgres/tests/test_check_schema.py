"""``PostgresSink.check_schema`` (what ``fanout validate`` asks of a sink whose source
declares its schema): on the real server, after ``open()``, every mismatch a batch of that
schema would meet at its first arrival is raised before the stream starts, with the first
batch's text less the batch id; nothing is written, not even a table ``create_table`` would
create."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query
from pyspark.sql.pandas.types import from_arrow_schema
from write_plan import write_plan

from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError, SchemaMismatchError

PRICES = (
    "CREATE TABLE prices (id bigint PRIMARY KEY, sku text NOT NULL, price numeric(10,2), "
    "qty integer)"
)
SKUS = "CREATE TABLE skus (sku text UNIQUE, price numeric)"
FITS = pa.schema(
    [("id", pa.int64()), ("sku", pa.string()), ("price", pa.decimal128(10, 2)), ("qty", pa.int32())]
)


def _opened(url: str, **options: Any) -> PostgresSink:
    sink = PostgresSink("pg", url=url, **options)
    sink.open(SinkContext("checks"))
    return sink


def _with(schema: pa.Schema, name: str, type_: pa.DataType | None) -> pa.Schema:
    """``schema`` with column ``name`` of ``type_`` (replaced, or added), or without it."""
    fields = [f for f in schema if f.name != name]
    if type_ is None:
        return pa.schema(fields)
    at = schema.get_field_index(name)
    field = pa.field(name, type_)
    return pa.schema(fields[:at] + [field] + fields[at:] if at >= 0 else [*fields, field])


CASES = [
    pytest.param(
        PRICES, {"table": "prices"}, _with(FITS, "colour", pa.string()), ["colour"],
        "batch column 'colour' has no column colour in table prices (columns: id, sku, price, "
        "qty); add the column to the table, or choose and rename columns with option 'columns'",
        id="column-missing-from-the-table",
    ),
    pytest.param(
        PRICES, {"table": "prices"}, _with(FITS, "qty", pa.bool_()), ["qty"],
        "batch column 'qty' (boolean) cannot be written to column qty of table prices "
        "(INTEGER); cast it in the query, or write it as a string for PostgreSQL to parse",
        id="incompatible-type",
    ),
    pytest.param(
        PRICES, {"table": "prices"}, _with(FITS, "price", pa.float64()), ["price"],
        "batch column 'price' (double) cannot be written to column price of table prices "
        "(NUMERIC(10, 2)) without loss: PostgreSQL would round its values to 2 decimal places; "
        'cast it in the query so the rounding is yours: F.col("price").cast("decimal(10,2)") '
        "(in a sink's select: CAST(price AS decimal(10,2)) AS price), or change the column's "
        "type",
        id="rounded-silently",
    ),
    pytest.param(
        PRICES, {"table": "prices"}, _with(FITS, "sku", None), ["sku"],
        "table prices requires sku (NOT NULL, no default) but the batch does not provide them",
        id="not-null-column-not-provided",
    ),
    pytest.param(
        SKUS, {"table": "skus", "keys": "sku"}, pa.schema([("price", pa.decimal128(10, 2))]),
        ["sku"],
        "option 'keys' names sku, which the batch does not write to table skus (written: price)",
        id="key-column-missing",
    ),
    pytest.param(
        None, {"table": "fresh", "create_table": True, "keys": "order_id"}, FITS, ["order_id"],
        "option 'keys' names order_id, which the batch does not write to table fresh (written: "
        "id, sku, price, qty); create_table needs the keys as columns of the new table (its "
        "primary key)",
        id="create-table-key-missing",
    ),
    pytest.param(
        None, {"table": "fresh", "create_table": True, "mode": "append"},
        _with(FITS, "__fanout_row", pa.string()), ["__fanout_row"],
        "column name '__fanout_row' is reserved by the postgres sink",
        id="create-table-reserved-column",
    ),
    pytest.param(
        None, {"table": "fresh", "create_table": True, "keys": "id"},
        _with(FITS, "took", pa.duration("us")), ["took"],
        "batch column 'took' (interval day to second) cannot be written to column took of "
        "table fresh (TEXT); cast it in the query, or write it as a string for PostgreSQL to "
        "parse",
        id="create-table-type-it-cannot-hold",
    ),
    pytest.param(
        None, {"table": "fresh", "create_table": True, "keys": "id"},
        _with(FITS, "x" * 64, pa.int64()), ["x" * 64],
        f"column name(s) {'x' * 64} are longer than the 63 bytes PostgreSQL keeps of a "
        "name: create_table would make table fresh with the names cut, and the batch's "
        "columns would not be found in it; rename them in the query, the sink's select or "
        "option 'columns'",
        id="create-table-name-postgresql-would-cut",
    ),
    pytest.param(
        None, {"table": "fresh", "create_table": True, "mode": "append"},
        _with(FITS, "attrs", pa.map_(pa.string(), pa.int64())), ["attrs"],
        "column(s) 'attrs' (map<string,bigint>) cannot assign rows to partitions: Spark "
        "cannot hash a map or a variant (DATATYPE_MISMATCH.HASH_MAP_TYPE or "
        "HASH_VARIANT_TYPE). This sink has no key, so it partitions by every column it "
        "writes: give it key columns (Kafka 'key', PostgreSQL 'keys'), or drop the column or "
        "convert it in the query or the sink's select (e.g. to_json(attrs))",
        id="keyless-append-over-a-map",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("ddl", "options", "schema", "columns", "message"), CASES)
def test_a_schema_the_table_cannot_take_fails_as_its_first_batch_would(
    pg_url: str, ddl: str | None, options: dict[str, Any], schema: pa.Schema,
    columns: list[str], message: str,
) -> None:  # fmt: skip
    if ddl is not None:
        execute(pg_url, ddl)
    sink = _opened(pg_url, **options)
    with pytest.raises(SchemaMismatchError) as checked:
        sink.check_schema(schema)
    assert str(checked.value) == f"sink 'pg': {message}"
    assert checked.value.columns == columns
    assert checked.value.batch_id is None
    # the first batch of that schema is refused in the same words (its plan, on the driver)
    with pytest.raises(SchemaMismatchError) as first_batch:
        write_plan(sink, from_arrow_schema(schema), 3)
    assert str(first_batch.value) == f"sink 'pg', batch 3: {message}"
    assert query(pg_url, "SELECT to_regclass('public.fresh')") == [(None,)]


def test_a_schema_the_table_takes_passes(pg_url: str) -> None:
    execute(pg_url, PRICES, SKUS)
    _opened(pg_url, table="prices").check_schema(FITS)
    strings = pa.schema([(f.name, pa.string()) for f in FITS])  # PostgreSQL's to parse
    # in one partition: a string key into bigint has spellings Spark would hash apart
    # (test_equal_keys.py)
    _opened(pg_url, table="prices", partitions=1).check_schema(strings)
    skus = pa.schema([("sku", pa.string()), ("price", pa.float64())])  # numeric: no scale
    _opened(pg_url, table="skus", keys="sku").check_schema(skus)


def test_a_missing_table_create_table_would_make_passes_and_stays_missing(pg_url: str) -> None:
    sink = _opened(pg_url, table="fresh", create_table=True, keys="id")
    schema = pa.schema(
        [
            *FITS,
            ("at", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("us")),
            ("day", pa.date32()), ("ok", pa.bool_()), ("ratio", pa.float32()),
            ("score", pa.float64()), ("small", pa.int16()), ("tiny", pa.int8()),
            ("blob", pa.binary()), ("tags", pa.list_(pa.string())),
            ("attrs", pa.map_(pa.string(), pa.int64())),
            ("pos", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
            ("nothing", pa.null()),
        ]
    )  # fmt: skip
    sink.check_schema(schema)
    assert query(pg_url, "SELECT to_regclass('public.fresh')") == [(None,)]
    assert query(
        pg_url, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'fresh'"
    ) == [(0,)]
    write_plan(sink, from_arrow_schema(schema), 0)  # the first batch creates it
    assert query(pg_url, "SELECT to_regclass('public.fresh')::text") == [("fresh",)]


def test_a_missing_table_without_create_table_fails_open_and_the_check(pg_url: str) -> None:
    sink = PostgresSink("pg", url=pg_url, table="fresh")
    with pytest.raises(ConfigurationError):
        sink.open(SinkContext("checks"))
    with pytest.raises(SchemaMismatchError) as checked:
        sink.check_schema(FITS)
    assert str(checked.value) == "sink 'pg': table fresh does not exist"
