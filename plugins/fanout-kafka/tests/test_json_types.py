"""Column types the Kafka sink's JSON cannot hold faithfully are refused on the schema, by
``check_schema`` (``fanout validate``) and by the first batch's plan, before any record is
made; maps with string keys are written as JSON objects. No broker, no JVM."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.records import Encoder
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from fanout.errors import SchemaMismatchError

F = T.StructField
INTERVAL = (
    "an interval has no faithful JSON form here (written as a float of seconds, or not at "
    "all); cast it in the query, e.g. CAST({c} AS STRING), or a number of a stated unit"
)
MAP_KEYS = (
    "a map's keys become the keys of a JSON object, which are text; cast them in the query, "
    "e.g. transform_keys({c}, (k, v) -> CAST(k AS STRING)), or write map_entries({c}) (an "
    "array of key/value objects)"
)
VARIANT = (
    "a variant would be written as its binary encoding; write its JSON text in the query, "
    "to_json({c}), or extract its fields with variant_get"
)
GEOSPATIAL = (
    "a geometry or geography would be written in its stored form (an object of its SRID "
    "and WKB bytes), not as a JSON value; write its WKB in the query, {wkb} (base64 in the "
    "JSON), and its SRID with ST_SRID when it matters"
)


def _sink(**options: Any) -> KafkaSink:
    return KafkaSink("events", bootstrap_servers="h:1", topic="t", **options)


def _schema(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([F(name, kind) for name, kind in (("id", T.LongType()), *fields)])


REFUSED = [
    pytest.param(
        _schema(("tags", T.MapType(T.IntegerType(), T.StringType()))), ["tags"],
        "column 'tags' (map<int,string>): " + MAP_KEYS.format(c="tags"), id="map-int-keys",
    ),
    pytest.param(
        _schema(("took", T.DayTimeIntervalType(0, 3))), ["took"],
        "column 'took' (interval day to second): " + INTERVAL.format(c="took"),
        id="day-time-interval",
    ),
    pytest.param(
        _schema(("doc", T.VariantType())), ["doc"],
        "column 'doc' (variant): " + VARIANT.format(c="doc"), id="variant",
    ),
    pytest.param(
        _schema(("s", T.StructType([F("a", T.ArrayType(T.MapType(
            T.StringType(), T.DayTimeIntervalType(0, 3))))]))), ["s"],
        "column 's' at s.a[]{} (interval day to second): " + INTERVAL.format(c="s"),
        id="nested-interval",
    ),
    pytest.param(
        _schema(("g", T.GeometryType(4326))), ["g"],
        "column 'g' (geometry(4326)): " + GEOSPATIAL.format(wkb="ST_AsBinary(g)"),
        id="geometry",
    ),
    pytest.param(
        _schema(("s", T.StructType([F("at", T.ArrayType(T.GeographyType(4326)))]))), ["s"],
        "column 's' at s.at[] (geography(4326)): "
        + GEOSPATIAL.format(wkb="ST_AsBinary of the value at s.at[]"),
        id="nested-geography",
    ),
    pytest.param(
        _schema(("s", T.StructType([F("a", T.LongType()), F("a", T.StringType())]))), ["s"],
        "column 's' (struct<a:bigint,a:string>): field(s) 'a' appear more than once and a "
        "JSON object keeps one of them; rename them in the query (named_struct(...))",
        id="struct-field-twice",
    ),
    pytest.param(
        _schema(("id", T.StringType())), ["id"],
        "column 'id' (bigint, string): 2 columns have this name and a JSON object keeps one "
        "of them; rename them in the query (... AS other_name)",
        id="column-twice",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "columns", "problem"), REFUSED)
def test_check_schema_refuses_a_type_json_cannot_hold(
    schema: T.StructType, columns: list[str], problem: str
) -> None:
    with pytest.raises(SchemaMismatchError) as checked:
        _sink().check_schema(to_arrow_schema(schema, timezone="UTC"))
    assert str(checked.value) == (
        f"sink 'events': batch column(s) cannot be written as JSON faithfully: {problem}"
    )
    assert checked.value.columns == columns
    assert checked.value.batch_id is None


def test_the_first_batch_plan_refuses_them_all_at_once_naming_the_batch() -> None:
    schema = _schema(
        ("tags", T.MapType(T.IntegerType(), T.StringType())),
        ("age", T.YearMonthIntervalType(0, 1)),  # no Arrow form: check_schema never sees it
        ("doc", T.VariantType()),
    )
    df = SimpleNamespace(schema=schema, columns=schema.fieldNames())
    with pytest.raises(SchemaMismatchError) as planned:
        _sink().partition_input(SimpleNamespace(df=df, batch_id=4))  # type: ignore[arg-type]
    assert str(planned.value) == (
        "sink 'events', batch 4: batch column(s) cannot be written as JSON faithfully: "
        f"column 'tags' (map<int,string>): {MAP_KEYS.format(c='tags')}; "
        f"column 'age' (interval year to month): {INTERVAL.format(c='age')}; "
        f"column 'doc' (variant): {VARIANT.format(c='doc')}"
    )
    assert planned.value.columns == ["tags", "age", "doc"]


def test_only_the_columns_written_as_json_or_text_are_checked() -> None:
    schema = _schema(
        ("payload", T.BinaryType()),
        ("took", T.DayTimeIntervalType(0, 3)),  # not written: value is 'payload'
        ("tags", T.MapType(T.IntegerType(), T.StringType())),
    )
    arrow = to_arrow_schema(schema, timezone="UTC")
    _sink(key="id", value="payload").check_schema(arrow)
    with pytest.raises(SchemaMismatchError) as checked:
        _sink(key="tags", value="payload").check_schema(arrow)
    assert str(checked.value) == (
        "sink 'events': batch column(s) cannot be written as JSON faithfully: "
        f"column 'tags' (map<int,string>): {MAP_KEYS.format(c='tags')}"
    )


def test_the_types_json_holds_pass() -> None:
    schema = _schema(
        ("name", T.StringType()), ("flag", T.BooleanType()), ("price", T.DecimalType(10, 2)),
        ("ratio", T.DoubleType()), ("day", T.DateType()), ("at", T.TimestampType()),
        ("local", T.TimestampNTZType()), ("raw", T.BinaryType()),
        ("chunks", T.ArrayType(T.BinaryType())),
        ("attrs", T.MapType(T.StringType(), T.ArrayType(T.LongType()))),
        ("s", T.StructType([F("a", T.LongType()), F("b", T.StringType())])),
        ("nothing", T.NullType()),
    )  # fmt: skip
    # keyed: a keyless sink hashes every column, and Spark cannot hash the map
    _sink(key="name").check_schema(to_arrow_schema(schema, timezone="UTC"))


def test_a_map_with_string_keys_is_written_as_a_json_object() -> None:
    encoder = Encoder(None, None, (), (), 1000)
    attrs = pa.array([[("color", 1), ("size", 2)], None], pa.map_(pa.string(), pa.int64()))
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), attrs], ["id", "attrs"])
    good, bad = encoder.encode_arrow([batch])
    assert bad == []
    assert [json.loads(r.value or b"") for r in good] == [
        {"id": 1, "attrs": {"color": 1, "size": 2}},
        {"id": 2, "attrs": None},
    ]
    assert [r.value for r in good] == [
        b'{"id":1,"attrs":{"color":1,"size":2}}',
        b'{"id":2,"attrs":null}',
    ]
