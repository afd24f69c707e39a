"""Dates and timestamps of any year in the executors' partition values and statistics, and
the partition values no Delta table can keep (an empty string, a date or timestamp past the
year 9999 in UTC), refused alike by every writer of the Delta sink: the batch fails naming
sink, batch, column and value, or the rows go to the sink's dead-letter target.

Tables are real Delta tables on the local disk, read back through delta-rs; the tests
marked ``integration`` run the executors' append in real Spark tasks.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from arrow_batches import batch_of
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink
from fanout_delta.partition_values import split_unstorable_spark
from fanout_delta.spark_engine import write_spark

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.datafiles import FileWriter
from fanout.delta_tables.distributed import delta_schema
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError

YEAR_10000 = 253_402_300_800_000_000  # 10000-01-01T00:00:00Z, epoch microseconds
EMPTY = (
    "partition column 'k' holds the empty string '', which a Delta table cannot keep in a "
    "partition column (Delta reads an empty partition value as null). Replace the value in "
    "the stream (e.g. with null), or set the sink's option 'dead_letter' to set such rows "
    "aside"
)
PAST_9999 = (
    "partition column 'ts' holds 10000-01-01 00:00:00.000000 UTC, which a Delta table "
    "cannot keep in a partition column (a partition value holds the years 0 to 9999 only, "
    "in UTC for a timestamp; delta-rs cannot read a table holding another). Replace the "
    "value in the stream (e.g. with null), or set the sink's option 'dead_letter' to set "
    "such rows aside"
)


def opened(path: Path, spark: Any = None, dead: Path | None = None, **options: Any) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), **options)
    letters = DeltaDeadLetters(str(dead)) if dead is not None else None
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=letters))
    return sink


def timestamps(*micros: int | None) -> pa.Array:
    return pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def letters_of(dead: Path) -> list[tuple[str, str, dict[str, Any], str]]:
    rows = read_delta(str(dead)).to_pylist()
    return sorted(
        (r["column"], json.loads(r["value"]), json.loads(r["row"]), r["reason"]) for r in rows
    )


# -- the executors' partition values and statistics, any year -----------------------------


@pytest.mark.parametrize("year", [1, 9, 99, 999])
def test_years_below_1000_are_padded_in_partition_values_and_statistics(tmp_path, year):
    utc = pa.timestamp("us", "UTC")
    table = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "ts": pa.array([datetime(year, 5, 1, 1, 2, 3, 4, tzinfo=UTC)], utc),
            "d": pa.array([date(year, 5, 1)], pa.date32()),
            "pts": pa.array([datetime(year, 5, 1, tzinfo=UTC)], utc),
            "pntz": pa.array([datetime(year, 5, 1, 7)], pa.timestamp("us")),
            "pd": pa.array([date(year, 5, 1)], pa.date32()),
        }
    )
    partitions = ("pts", "pntz", "pd")
    writer = FileWriter(str(tmp_path), delta_schema(table.schema), partitions)

    (only,) = writer.write(iter(table.to_batches()))

    y = f"{year:04d}"
    assert only.partition_values == {
        "pts": f"{y}-05-01 00:00:00.000000",
        "pntz": f"{y}-05-01 07:00:00.000000",
        "pd": f"{y}-05-01",
    }
    stats = json.loads(only.stats)
    assert stats["minValues"] == {"id": 1, "ts": f"{y}-05-01T01:02:03.000004Z", "d": f"{y}-05-01"}
    assert stats["maxValues"] == stats["minValues"]


def test_statistics_leave_out_dates_and_timestamps_outside_the_years_1_to_9999(tmp_path):
    year_0 = -62_135_596_800_000_000 - 3_600_000_000  # 0000-12-31T23:00:00Z
    table = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "ts": timestamps(YEAR_10000, year_0, None),
            "d": pa.array([2_932_897, 0, None], pa.int32()).cast(pa.date32()),  # 10000-01-01
            "ok": timestamps(0, 1, None),
        }
    )
    writer = FileWriter(str(tmp_path), delta_schema(table.schema))

    (only,) = writer.write(iter(table.to_batches()))

    stats = json.loads(only.stats)
    assert stats == {
        "numRecords": 3,
        "minValues": {"id": 1, "ok": "1970-01-01T00:00:00.000000Z"},
        "maxValues": {"id": 3, "ok": "1970-01-01T00:00:00.000001Z"},
        "nullCount": {"id": 0, "ts": 1, "d": 1, "ok": 1},
    }
    on_disk = pq.read_table(tmp_path / only.path)  # the values themselves, exact
    assert on_disk.column("ts").cast(pa.int64()).to_pylist() == [YEAR_10000, year_0, None]


def test_a_year_0_timestamp_partition_value_is_written_as_delta_rs_writes_it(tmp_path):
    """'0001-01-01 00:00:00' in a session east of UTC is the year 0 in UTC: Python has no
    such datetime, delta-rs writes and reads it."""
    year_0 = -62_135_596_800_000_000 - 3_600_000_000
    table = pa.table({"id": pa.array([1], pa.int64()), "ts": timestamps(year_0)})
    opened(tmp_path / "e", write_from="executors", partition_by=["ts"]).write(batch_of(table))
    write_deltalake(str(tmp_path / "d"), table, partition_by=["ts"])

    for name in ("e", "d"):  # the executors' writer, delta-rs' own
        dt = DeltaTable(str(tmp_path / name))
        assert dt.to_pyarrow_table().column("ts").cast(pa.int64()).to_pylist() == [year_0]
        log = (tmp_path / name / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
        (add,) = [a["add"] for a in map(json.loads, log) if "add" in a]
        assert add["partitionValues"] == {"ts": "0000-12-31 23:00:00.000000"}


# -- partition values no Delta table can keep ----------------------------------------------


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_a_timestamp_partition_value_past_year_9999_is_refused(tmp_path, write_from):
    """delta-rs writes it as '+10000-01-01 00:00:00.000000' and then cannot read its own
    table ("Failed to parse string"): refused before anything is written."""
    path = tmp_path / "t"
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "ts": timestamps(YEAR_10000, 0)})
    sink = opened(path, write_from=write_from, partition_by=["ts"])

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(table))

    counted = "1 row(s): " if write_from == "driver" else ""
    assert str(raised.value) == f"sink 's', batch 0: {counted}{PAST_9999}"
    assert not (path / "_delta_log").exists()


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_a_date_partition_value_past_year_9999_is_refused(tmp_path, write_from):
    path = tmp_path / "t"
    days = pa.array([2_932_897], pa.int32()).cast(pa.date32())  # 10000-01-01
    table = pa.table({"id": pa.array([1], pa.int64()), "d": days})
    sink = opened(path, write_from=write_from, partition_by=["d"])

    with pytest.raises(SinkWriteError, match=r"partition column 'd' holds 10000-01-01, which"):
        sink.write(batch_of(table))

    assert not (path / "_delta_log").exists()


def test_a_merge_refuses_an_empty_string_partition_value(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"], partition_by=["k"])
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "k": pa.array(["", "x"])})

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(table))

    assert str(raised.value) == f"sink 's', batch 0: 1 row(s): {EMPTY}"
    assert not (path / "_delta_log").exists()


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_refused_partition_values_go_to_the_dead_letter_target_once(tmp_path, write_from):
    path, dead = tmp_path / "t", tmp_path / "dead"
    sink = opened(path, dead=dead, write_from=write_from, partition_by=["k", "ts"])
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "k": pa.array(["", None, "x", "y"]),
            "ts": timestamps(0, 0, 0, YEAR_10000),
        }
    )

    result = sink.write(batch_of(table))
    again = sink.write(batch_of(table))  # a replay: skipped, the letters not written twice

    assert (result.rows, result.dead_lettered, result.already_written) == (2, 2, False)
    assert (again.rows, again.dead_lettered, again.already_written) == (2, 2, True)
    rows = DeltaTable(str(path)).to_pyarrow_table().sort_by("id")
    assert rows.column("id").to_pylist() == [2, 3]
    assert rows.column("k").to_pylist() == [None, "x"]
    assert letters_of(dead) == [
        ("k", "", {"id": 1, "k": "", "ts": "1970-01-01T00:00:00+00:00"}, EMPTY),
        (
            "ts",
            "+10000-01-01T00:00:00+00:00",
            {"id": 4, "k": "y", "ts": "+10000-01-01T00:00:00+00:00"},
            PAST_9999,
        ),
    ]


# -- in real Spark tasks -------------------------------------------------------------------


@pytest.mark.integration
def test_the_executors_spark_tasks_refuse_an_empty_string_naming_the_column(spark, tmp_path):
    path = tmp_path / "t"
    df = spark.createDataFrame([(1, ""), (2, "x")], "id long, k string").coalesce(1)
    sink = opened(path, spark, write_from="executors", partition_by=["k"])

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(df))

    assert str(raised.value) == f"sink 's', batch 0: {EMPTY}"
    assert not (path / "_delta_log").exists()


@pytest.mark.integration
def test_the_executors_set_refused_rows_aside_in_spark(spark, tmp_path):
    path, dead = tmp_path / "t", tmp_path / "dead"
    df = spark.sql(
        f"select * from values (1L, '', 0L), (2L, 'x', 0L), (3L, 'y', {YEAR_10000}L) as t(id, k, m)"
    ).selectExpr("id", "k", "timestamp_micros(m) as ts")
    sink = opened(path, spark, dead=dead, write_from="executors", partition_by=["k", "ts"])

    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (1, 2)
    assert DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist() == [2]
    assert [(c, v) for c, v, _, _ in letters_of(dead)] == [
        ("k", ""),
        ("ts", "+10000-01-01T00:00:00+00:00"),
    ]


@pytest.mark.integration
def test_the_spark_engine_refuses_an_empty_string_partition_value(spark, tmp_path):
    """delta-spark writes ``""`` as null (delta-io/delta#2100): refused before Delta runs
    (so this needs no Delta jars), and split off as the other writers do."""
    sink = DeltaSink(name="s", path=str(tmp_path / "t"), engine="spark", partition_by=["k"])
    df = spark.createDataFrame([(1, ""), (2, None), (3, "x")], "id long, k string")

    with pytest.raises(SinkWriteError) as raised:
        write_spark(sink.target(), batch_of(df))
    kept, letters = split_unstorable_spark(df, ["k"], years=False)

    assert str(raised.value) == f"sink 's', batch 0: 1 row(s): {EMPTY}"
    assert sorted(r.id for r in kept.collect()) == [2, 3]
    assert [(letter.column, letter.value, letter.row) for letter in letters] == [
        ("k", "", {"id": 1, "k": ""})
    ]


@pytest.mark.integration
@pytest.mark.parametrize("dead_letter", [True, False])
def test_two_delta_appends_sharing_a_job_refuse_an_empty_string_alike(spark, tmp_path, dead_letter):
    """Two appends from the executors share one Spark job. With a dead-letter target the
    partitioned one writes alone (its rows are filtered first) and the other keeps the
    shared job; without, its shared task refuses the row, and its retry alone fails with
    the same text as the driver's writer (the other sink's write stands)."""
    from fanout import BatchFailedError, FanOut
    from fanout.ledger.memory import MemoryLedger

    a = {"type": "delta", "name": "a", "path": str(tmp_path / "a"), "partition_by": ["k"],
         "write_from": "executors"}  # fmt: skip
    if dead_letter:
        a["dead_letter"] = str(tmp_path / "dead")
    b = {"type": "delta", "name": "b", "path": str(tmp_path / "b"), "write_from": "executors"}
    fan = FanOut("p", MemoryLedger(), [a, b], retries=1, backoff_s=0.01)
    df = spark.createDataFrame([(1, ""), (2, "x"), (3, None)], "id long, k string")

    if dead_letter:
        results = fan.process(df, BatchInfo("p", 0, "q"))
        assert (results["a"].rows, results["a"].dead_lettered) == (2, 1)
        assert "shared_with" not in results["a"].details
        assert sorted(DeltaTable(str(tmp_path / "a")).to_pyarrow_table()["id"].to_pylist()) == [
            2, 3,
        ]  # fmt: skip
        assert [(c, v) for c, v, _, _ in letters_of(tmp_path / "dead")] == [("k", "")]
    else:
        with pytest.raises(BatchFailedError) as raised:
            fan.process(df, BatchInfo("p", 0, "q"))
        assert str(raised.value) == (
            "pipeline 'p', batch 0: 1 sink(s) failed (a); b committed the batch and will be "
            "skipped when the query restarts and Spark replays it:\n"
            f"  - a: SinkWriteError: sink 'a', batch 0: {EMPTY}"
        )
        assert not (tmp_path / "a" / "_delta_log").exists()
    assert sorted(DeltaTable(str(tmp_path / "b")).to_pyarrow_table()["id"].to_pylist()) == [
        1, 2, 3,
    ]  # fmt: skip
