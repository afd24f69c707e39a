"""The Delta sink (engine rs) and timestamps without a time zone nested in maps, structs
and arrays: delta-rs 1.6 gives a table it creates the ``timestampNtz`` feature only when it
finds the type outside maps, and the kernel refuses a table whose schema needs the feature
and lacks it. Every test reads the table back and compares the nested values exactly.

Both write paths: from the driver (``write_from="driver"``, every merge) and the executors'
append (``write_from="executors"``; with an Arrow batch the sink runs the same file writer
a Spark task runs, in this process), plus one real Spark batch.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from arrow_batches import APP_ID, batch_of
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink

from fanout.contract.sink import SinkContext
from fanout.delta_tables import ntz
from fanout.delta_tables.io import read_delta
from fanout.errors import SchemaMismatchError, SinkWriteError

NTZ = pa.timestamp("us")
T1 = datetime(2024, 2, 29, 23, 59, 59, 999999)
T2 = datetime(1, 1, 1, 0, 0, 0)
T3 = datetime(9999, 12, 31, 12, 30, 0, 1)

NESTED = {
    "map_value": (pa.map_(pa.string(), NTZ), [[("a", T1), ("b", None)], [("c", T2)]]),
    "map_key": (pa.map_(NTZ, pa.int32()), [[(T3, 7)], []]),
    "struct_in_map": (
        pa.map_(pa.string(), pa.struct([("at", NTZ), ("n", pa.int64())])),
        [[("k", {"at": T1, "n": 1})], None],
    ),
    "map_in_list": (pa.list_(pa.map_(pa.int32(), NTZ)), [[[(1, T2)], [(2, T3)]], [None]]),
    "map_in_struct": (pa.struct([("m", pa.map_(pa.string(), NTZ))]), [{"m": [("x", T3)]}, None]),
    "struct": (pa.struct([("at", NTZ)]), [{"at": T1}, {"at": None}]),
    "list": (pa.list_(NTZ), [[T1, T2, None], []]),
}
PATHS = [
    pytest.param({}, id="driver-append"),
    pytest.param({"write_from": "executors"}, id="executors-append"),
    pytest.param({"mode": "merge", "keys": ["id"]}, id="driver-merge"),
]


def column(name: str) -> pa.Array:
    kind, values = NESTED[name]
    return pa.array(values, kind)


def opened(path: Path, **options: Any) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), **{"write_from": "driver", **options})
    sink.open(SinkContext(pipeline="p"))
    return sink


def read_back(path: Path) -> list[dict[str, Any]]:
    return read_delta(str(path)).sort_by("id").to_pylist()


def features(path: Path) -> tuple[list[str], list[str]]:
    protocol = DeltaTable(str(path)).protocol()
    return sorted(protocol.reader_features or []), sorted(protocol.writer_features or [])


@pytest.mark.parametrize("options", PATHS)
@pytest.mark.parametrize("name", sorted(NESTED))
def test_a_nested_ntz_column_creates_the_table_with_the_feature(tmp_path, options, name):
    path = tmp_path / "t"
    sink = opened(path, **options)
    data = pa.table({"id": pa.array([1, 2], pa.int64()), name: column(name)})

    sink.write(batch_of(data, 0))
    sink.write(batch_of(pa.table({"id": pa.array([3], pa.int64()), name: column(name)[:1]}), 1))

    _, values = NESTED[name]
    assert read_back(path) == [
        {"id": 1, name: values[0]},
        {"id": 2, name: values[1]},
        {"id": 3, name: values[0]},
    ]
    assert features(path) == (["timestampNtz"], ["timestampNtz"])
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1
    # a replay writes nothing again
    assert sink.write(batch_of(data, 1)).already_written


NEW_COLUMNS = {
    "map_value": ([("a", T1), ("b", None)], [("c", T2)]),
    "top": (T1, None),
    "struct": ({"at": T1}, {"at": None}),
}


@pytest.mark.parametrize("added", [["map_value"], ["top"], ["map_value", "top", "struct"]])
@pytest.mark.parametrize("options", PATHS)
def test_a_table_without_the_feature_gains_ntz_columns_by_merge_schema(tmp_path, options, added):
    path = tmp_path / "t"
    sink = opened(path, merge_schema=True, **options)
    sink.write(batch_of(pa.table({"id": pa.array([1], pa.int64())}), 0))
    assert features(path) == ([], [])
    kinds = {"map_value": NESTED["map_value"][0], "top": NTZ, "struct": NESTED["struct"][0]}
    data = pa.table(
        {"id": pa.array([2, 3], pa.int64())}
        | {name: pa.array(list(NEW_COLUMNS[name]), kinds[name]) for name in added}
    )

    sink.write(batch_of(data, 1))

    assert read_back(path) == [
        {"id": 1} | {name: None for name in added},
        {"id": 2} | {name: NEW_COLUMNS[name][0] for name in added},
        {"id": 3} | {name: NEW_COLUMNS[name][1] for name in added},
    ]
    assert features(path) == (["timestampNtz"], ["timestampNtz"])
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1


@pytest.mark.parametrize("options", PATHS)
def test_without_merge_schema_a_new_ntz_column_is_refused_and_the_protocol_kept(tmp_path, options):
    path = tmp_path / "t"
    sink = opened(path, **options)
    sink.write(batch_of(pa.table({"id": pa.array([1], pa.int64())}), 0))
    data = pa.table({"id": pa.array([2, 3], pa.int64()), "map_value": column("map_value")})

    with pytest.raises(SchemaMismatchError) as caught:
        sink.write(batch_of(data, 1))

    assert "sink 's', batch 1" in str(caught.value) and "'map_value'" in str(caught.value)
    assert "merge_schema" in str(caught.value)
    assert features(path) == ([], [])
    assert read_back(path) == [{"id": 1}]


@pytest.mark.parametrize("options", PATHS)
def test_a_creation_stopped_after_its_first_commit_is_finished_by_the_next_attempt(
    tmp_path, options, monkeypatch
):
    path = tmp_path / "t"
    sink = opened(path, **options)
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "map_key": column("map_key")})
    real = ntz._set_schema

    def crash(*args: Any) -> None:
        raise OSError("killed between the two commits")

    monkeypatch.setattr(ntz, "_set_schema", crash)
    with pytest.raises(SinkWriteError):
        sink.write(batch_of(data, 0))
    assert DeltaTable(str(path)).version() == 0
    monkeypatch.setattr(ntz, "_set_schema", real)

    sink.write(batch_of(data, 0))

    assert read_back(path) == [{"id": 1, "map_key": [(T3, 7)]}, {"id": 2, "map_key": []}]
    assert features(path) == (["timestampNtz"], ["timestampNtz"])
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 0


def test_a_spark_batch_with_ntz_in_a_map_is_written_by_the_executors(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path, write_from="executors")
    df = spark.createDataFrame(
        [(1, {"a": T1}), (2, {"b": T3, "c": None})],
        "id BIGINT, m MAP<STRING, TIMESTAMP_NTZ>",
    ).repartition(2)

    result = sink.write(batch_of(df, 0))

    assert result.rows == 2
    assert read_back(path) == [
        {"id": 1, "m": [("a", T1)]},
        {"id": 2, "m": [("b", T3), ("c", None)]},
    ]
    assert features(path) == (["timestampNtz"], ["timestampNtz"])


def test_helpers_find_ntz_where_delta_rs_does_not():
    assert ntz.hidden_ntz(pa.schema([("m", NESTED["map_in_list"][0])]))
    assert ntz.hidden_ntz(pa.schema([("m", NESTED["map_key"][0])]))
    assert not ntz.hidden_ntz(pa.schema([("s", NESTED["struct"][0]), ("l", NESTED["list"][0])]))
    assert not ntz.hidden_ntz(pa.schema([("m", pa.map_(pa.string(), pa.timestamp("us", "UTC")))]))
    assert ntz.holds_ntz(NESTED["struct"][0])
    assert not ntz.holds_ntz(pa.map_(pa.string(), pa.timestamp("us", "UTC")))


def test_a_table_delta_rs_created_with_the_feature_is_left_alone(tmp_path):
    path = tmp_path / "t"
    write_deltalake(
        str(path), pa.table({"id": pa.array([1], pa.int64()), "t": pa.array([T1], NTZ)})
    )
    table = DeltaTable(str(path))
    ntz.finish_create(table)
    assert not ntz.enable_feature(table, pa.schema([("t", NTZ)]))
    assert table.version() == 0
