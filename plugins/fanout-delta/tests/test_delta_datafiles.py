"""The executor-side file writer of the distributed Delta append
(:mod:`fanout.delta_tables.datafiles`), run in this process on Arrow data: no Spark.

Each test asserts what lands in the files and in the statistics a Delta reader trusts to
skip files: a wrong minimum or maximum would make a reader miss rows, so what cannot be
stated exactly must be absent.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fanout.delta_tables.datafiles import DataFile, FileWriter
from fanout.delta_tables.distributed import delta_schema
from fanout.delta_tables.values import partition_value


def write(path: Path, table: pa.Table, partition_by: tuple[str, ...] = (), chunk: int = 2):
    writer = FileWriter(str(path), delta_schema(table.schema), partition_by)
    return writer.write(iter(table.to_batches(max_chunksize=chunk)))


def test_one_file_per_partition_value_with_exact_rows_and_stats(tmp_path):
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "day": ["a", "b", "a", None, "a"],
            "v": ["x", None, "zz", "y", "w"],
        }
    )
    files = sorted(write(tmp_path, table, ("day",)), key=lambda f: f.path)

    assert [f.path.split("/")[0] for f in files] == [
        "day=__HIVE_DEFAULT_PARTITION__",
        "day=a",
        "day=b",
    ]
    assert [f.partition_values for f in files] == [{"day": None}, {"day": "a"}, {"day": "b"}]
    assert [f.rows for f in files] == [1, 3, 1]
    stats = json.loads(files[1].stats)
    assert stats == {
        "numRecords": 3,
        "minValues": {"id": 1, "v": "w"},
        "maxValues": {"id": 5, "v": "zz"},
        "nullCount": {"id": 0, "v": 0},
    }
    assert json.loads(files[2].stats)["nullCount"] == {"id": 0, "v": 1}
    for f in files:
        on_disk = pq.read_table(tmp_path / f.path)
        assert on_disk.column_names == ["id", "v"]  # partition values live in the path
        assert on_disk.num_rows == f.rows
        assert (tmp_path / f.path).stat().st_size == f.size
    assert pq.read_table(tmp_path / files[1].path).column("id").to_pylist() == [1, 3, 5]


def test_a_partition_column_missing_from_the_batch_is_the_null_partition(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("day", pa.string())])
    writer = FileWriter(str(tmp_path), schema, ("day",))
    (only,) = writer.write(iter(pa.table({"id": pa.array([1, 2], pa.int64())}).to_batches()))
    assert only.partition_values == {"day": None}
    assert only.path.startswith("day=__HIVE_DEFAULT_PARTITION__/")
    assert pq.read_table(tmp_path / only.path).column("id").to_pylist() == [1, 2]


def test_statistics_leave_out_what_they_cannot_state_exactly(tmp_path):
    long = "x" * 33
    table = pa.table(
        {
            "f": pa.array([1.5, float("nan"), -2.0]),
            "g": pa.array([1.5, None, float("inf")]),
            "s": ["a", long, "b"],
            "b": [True, False, None],
            "d": pa.array([date(2024, 1, 2), date(2023, 5, 6), None]),
            "ts": pa.array(
                [datetime(2024, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))), None, None],
                pa.timestamp("ns", tz="+02:00"),
            ),
            "ntz": pa.array([datetime(2024, 1, 1), None, None], pa.timestamp("us")),
            "st": pa.array([{"a": 1}, None, {"a": 2}]),
            "all_null": pa.array([None, None, None], pa.int64()),
        }
    )
    (only,) = write(tmp_path, table, chunk=10)
    stats = json.loads(only.stats)
    assert stats["minValues"] == {"d": "2023-05-06", "ts": "2024-01-01T10:00:00.000000Z"}
    assert stats["maxValues"] == {"d": "2024-01-02", "ts": "2024-01-01T10:00:00.000000Z"}
    assert stats["nullCount"] == {
        "f": 0, "g": 1, "s": 0, "b": 1, "d": 1, "ts": 2, "ntz": 2, "all_null": 3,
    }  # fmt: skip
    assert stats["numRecords"] == 3


def test_types_become_deltas_and_missing_columns_nulls(tmp_path):
    source = pa.table(
        {
            "id": pa.array([1, 2], pa.int32()),
            "u": pa.array([1, 2], pa.uint16()),
            "s": pa.array(["a", "b"], pa.large_string()),
            "ts": pa.array([0, 1_000], pa.timestamp("ns", tz="Europe/Paris")),
        }
    )
    schema = delta_schema(source.schema).append(pa.field("extra", pa.string()))
    assert [str(t) for t in schema.types] == [
        "int32", "int32", "string", "timestamp[us, tz=UTC]", "string",
    ]  # fmt: skip
    (only,) = FileWriter(str(tmp_path), schema).write(iter(source.to_batches()))
    on_disk = pq.read_table(tmp_path / only.path)
    assert on_disk.schema.names == ["id", "u", "s", "ts", "extra"]
    assert on_disk.column("extra").to_pylist() == [None, None]
    assert on_disk.column("ts").type == pa.timestamp("us", tz="UTC")


def test_a_null_in_a_not_null_column_fails_the_write(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    writer = FileWriter(str(tmp_path), schema)
    with pytest.raises(ValueError, match="column 'id' is NOT NULL .* 1 row"):
        writer.write(iter(pa.table({"id": pa.array([1, None], pa.int64())}).to_batches()))


def test_no_rows_write_no_file(tmp_path):
    empty = pa.table({"id": pa.array([], pa.int64())})
    assert write(tmp_path / "t", empty) == []
    assert not (tmp_path / "t").exists()


def test_file_descriptions_survive_their_json_round_trip():
    f = DataFile("day=a/part-1.parquet", 10, {"day": "a"}, 1700000000000, '{"numRecords": 2}', 2)
    assert DataFile.from_json(f.to_json()) == f
    add = f.add_action()
    assert (add.path, add.size, add.partition_values, add.data_change) == (
        "day=a/part-1.parquet", 10, {"day": "a"}, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, None),
        (True, "true"),
        (7, "7"),
        ("a b/c", "a b/c"),
        (date(2024, 2, 29), "2024-02-29"),
        (datetime(2024, 1, 1, 1, 2, 3, 4), "2024-01-01 01:02:03.000004"),
        (
            datetime(2024, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))),
            "2024-01-01 00:00:00.000000",
        ),
        (datetime(2024, 1, 1, tzinfo=UTC), "2024-01-01 00:00:00.000000"),
    ],
)
def test_partition_values_as_delta_serializes_them(value, text):
    assert partition_value(value) == text


def test_an_unsupported_partition_value_is_refused():
    with pytest.raises(TypeError, match="bytes"):
        partition_value(b"x")


def test_only_columns_whose_first_rows_repeat_are_dictionary_encoded(tmp_path):
    rows = 1000
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),  # all distinct: plain
            "status": [["new", "paid", "shipped"][i % 3] for i in range(rows)],  # dictionary
            "half": pa.array([i // 2 for i in range(rows)], pa.int32()),  # half distinct: dict
            "point": [{"x": i} for i in range(rows)],  # nested: no hashing, plain
        }
    )
    (written,) = write(tmp_path, table, chunk=100)

    column_chunks = pq.ParquetFile(tmp_path / written.path).metadata.row_group(0)
    encodings = {
        column_chunks.column(i).path_in_schema: column_chunks.column(i).encodings
        for i in range(column_chunks.num_columns)
    }
    dictionary = {name for name, used in encodings.items() if "RLE_DICTIONARY" in used}
    assert dictionary == {"status", "half"}
    assert pq.read_table(tmp_path / written.path).to_pydict() == table.to_pydict()


@pytest.mark.parametrize("form", ["file:{}", "file://{}", "file://{}/"])
def test_a_local_table_named_by_a_file_uri_is_written_under_its_path(tmp_path, form):
    # Hadoop and Spark write local paths as file:/x; pyarrow's local filesystem takes paths
    lake = tmp_path / "my lake"
    root = form.format(lake.as_posix().replace(" ", "%20"))
    table = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    (only,) = FileWriter(root, delta_schema(table.schema)).write(iter(table.to_batches()))
    assert (only.rows, only.path.startswith("part-")) == (3, True)
    assert pq.read_table(lake / only.path).column("id").to_pylist() == [1, 2, 3]
    assert sorted(p.name for p in lake.iterdir()) == [only.path]
