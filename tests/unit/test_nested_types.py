"""The one walk over nested types (:mod:`fanout.contract.nested_types`): the type itself is
tested, then struct fields, list and array elements, map keys and values, at any depth;
and the questions the modules ask through it keep their answers."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from fanout.contract.nested_types import holds_arrow_type, holds_spark_type


def _is_map(kind: pa.DataType) -> bool:
    return bool(pa.types.is_map(kind))


def _is_ntz(kind: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(kind)) and kind.tz is None


NTZ = pa.timestamp("us")
ZONED = pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize(
    ("kind", "ntz", "map_"),
    [
        (NTZ, True, False),  # the type itself
        (ZONED, False, False),
        (pa.int64(), False, False),
        (pa.struct([("a", pa.int32()), ("b", NTZ)]), True, False),
        (pa.struct([("a", pa.int32()), ("b", ZONED)]), False, False),
        (pa.struct([("s", pa.struct([("t", pa.list_(NTZ))]))]), True, False),
        (pa.list_(pa.struct([("a", NTZ)])), True, False),
        (pa.large_list(NTZ), True, False),
        (pa.list_(NTZ, 2), True, False),
        (pa.list_view(NTZ), True, False),
        (pa.large_list_view(NTZ), True, False),
        (pa.map_(NTZ, pa.int32()), True, True),  # a map's keys
        (pa.map_(pa.string(), pa.list_(NTZ)), True, True),  # and values
        (pa.map_(pa.string(), ZONED), False, True),
        (pa.list_(pa.map_(pa.string(), pa.int32())), False, True),
        (pa.struct([("m", pa.map_(pa.string(), pa.struct([("t", NTZ)])))]), True, True),
        (pa.dictionary(pa.int32(), pa.list_(NTZ)), True, False),
        (pa.struct([]), False, False),
    ],
)
def test_arrow_types(kind: pa.DataType, ntz: bool, map_: bool) -> None:
    assert holds_arrow_type(kind, _is_ntz) is ntz
    assert holds_arrow_type(kind, _is_map) is map_


def test_arrow_unions_are_not_entered() -> None:
    union = pa.dense_union([pa.field("a", NTZ)])
    assert holds_arrow_type(union, _is_ntz) is False
    assert holds_arrow_type(pa.list_(union), pa.types.is_union) is True


def test_arrow_walk_visits_each_type_once_in_order() -> None:
    seen: list[str] = []

    def record(kind: pa.DataType) -> bool:
        seen.append(str(kind))
        return False

    kind = pa.struct([("m", pa.map_(pa.string(), pa.list_(pa.int8()))), ("f", pa.float32())])
    assert holds_arrow_type(kind, record) is False
    assert seen == [
        str(kind),
        "map<string, list<item: int8>>",
        "string",
        "list<item: int8>",
        "int8",
        "float",
    ]


def test_arrow_walk_stops_at_the_first_match() -> None:
    seen: list[str] = []

    def record(kind: pa.DataType) -> bool:
        seen.append(str(kind))
        return bool(pa.types.is_string(kind))

    kind = pa.struct([("a", pa.string()), ("b", pa.int64())])
    assert holds_arrow_type(kind, record) is True
    assert seen == [str(kind), "string"]


def _map_or_variant(data_type: Any) -> bool:
    return isinstance(data_type, T.MapType | T.VariantType)


def _is_string(data_type: Any) -> bool:
    return isinstance(data_type, T.StringType)


class Point(T.UserDefinedType):
    """A UDT stored as a map: the walk does not enter its ``sqlType()``."""

    @classmethod
    def sqlType(cls) -> T.DataType:
        return T.MapType(T.StringType(), T.DoubleType())


MAP = T.MapType(T.StringType(), T.LongType())
INNER = T.StructType([T.StructField("l", T.ArrayType(T.StringType()))])


@pytest.mark.parametrize(
    ("data_type", "map_", "string"),
    [
        (T.LongType(), False, False),
        (T.StringType(), False, True),  # the type itself
        (MAP, True, True),  # a map's keys
        (T.MapType(T.LongType(), T.StringType()), True, True),  # and values
        (T.MapType(T.LongType(), T.LongType()), True, False),
        (T.VariantType(), True, False),
        (T.ArrayType(T.LongType()), False, False),
        (T.ArrayType(T.ArrayType(MAP)), True, True),
        (T.StructType([T.StructField("a", T.LongType())]), False, False),
        (T.StructType([T.StructField("v", T.VariantType())]), True, False),
        (T.StructType([T.StructField("s", INNER)]), False, True),
        (T.ArrayType(T.StructType([T.StructField("m", MAP)])), True, True),
        (T.StructType([]), False, False),
        (Point(), False, False),
        (T.ArrayType(Point()), False, False),
    ],
)
def test_spark_types(data_type: Any, map_: bool, string: bool) -> None:
    assert holds_spark_type(data_type, _map_or_variant) is map_
    assert holds_spark_type(data_type, _is_string) is string


def test_spark_walk_visits_each_type_once_in_order() -> None:
    seen: list[str] = []

    def record(data_type: Any) -> bool:
        seen.append(data_type.simpleString())
        return False

    data_type = T.StructType([
        T.StructField("m", T.MapType(T.StringType(), T.ArrayType(T.ByteType()))),
        T.StructField("f", T.FloatType()),
    ])  # fmt: skip
    assert holds_spark_type(data_type, record) is False
    assert seen == [
        "struct<m:map<string,array<tinyint>>,f:float>",
        "map<string,array<tinyint>>",
        "string",
        "array<tinyint>",
        "tinyint",
        "float",
    ]


# -- the questions asked through the walk keep their answers ------------------------------


def test_membership_refuses_maps_and_variants_at_any_depth_but_not_in_a_udt() -> None:
    from fanout.partitioned.membership import unhashable

    schema = T.StructType([
        T.StructField("id", T.LongType()),
        T.StructField("tags", T.ArrayType(T.StructType([T.StructField("m", MAP)]))),
        T.StructField("v", T.StructType([T.StructField("x", T.VariantType())])),
        T.StructField("p", Point()),
        T.StructField("l", T.ArrayType(T.StringType())),
    ])  # fmt: skip
    assert unhashable(schema, ["id", "tags", "v", "p", "l"]) == [
        ("tags", "array<struct<m:map<string,bigint>>>"),
        ("v", "struct<x:variant>"),
    ]


def test_ntz_is_found_anywhere_and_hidden_only_inside_a_map() -> None:
    from fanout.delta_tables.ntz import hidden_ntz, holds_ntz

    in_list = pa.schema([("a", pa.list_(pa.struct([("t", NTZ)])))])
    in_key = pa.schema([("a", pa.struct([("m", pa.map_(NTZ, pa.int32()))]))])
    in_value = pa.schema([("a", pa.list_(pa.map_(pa.string(), pa.list_(NTZ))))])
    zoned = pa.schema([("a", pa.map_(pa.string(), ZONED)), ("b", ZONED)])
    assert [holds_ntz(s.field(0).type) for s in (in_list, in_key, in_value, zoned)] == [
        True, True, True, False,
    ]  # fmt: skip
    assert [hidden_ntz(s) for s in (in_list, in_key, in_value, zoned)] == [
        False, True, True, False,
    ]  # fmt: skip


def test_dead_letter_rows_mark_nested_maps_only() -> None:
    from fanout.contract.dead_letters import MapPairs, letter_rows

    in_list = pa.list_(pa.struct([("m", pa.map_(pa.string(), pa.int64()))]))
    table = pa.table({
        "id": pa.array([1], pa.int64()),
        "l": pa.array([[{"m": [("k", 1)]}]], in_list),
        "s": pa.array([{"x": [1, 2]}], pa.struct([("x", pa.list_(pa.int64()))])),
    })  # fmt: skip
    [row] = letter_rows(table)
    assert row == {"id": 1, "l": [{"m": [("k", 1)]}], "s": {"x": [1, 2]}}
    assert type(row["l"][0]["m"]) is MapPairs
    assert type(row["s"]["x"]) is list


def test_float32_is_widened_at_any_depth_only_where_it_is() -> None:
    from fanout.contract.float32 import widened

    table = pa.table({
        "f": pa.array([[0.1]], pa.list_(pa.float32())),
        "m": pa.array([[("k", 0.1)]], pa.map_(pa.string(), pa.float32())),
        "d": pa.array([[0.1]], pa.list_(pa.float64())),
    })  # fmt: skip
    out = widened(table)
    assert out.schema.types == [
        pa.list_(pa.float64()), pa.map_(pa.string(), pa.float64()), pa.list_(pa.float64()),
    ]  # fmt: skip
    assert out.to_pylist() == [{"f": [0.1], "m": [("k", 0.1)], "d": [0.1]}]
