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
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from arrow_batches import batch_of
from deltacheck import ids
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink
from fanout_delta.partition_values import split_unstorable_spark
from fanout_delta.spark_engine import write_spark

from fanout.contract.batch import BatchInfo
from fanout.contract.dead_letters import DeadLetter
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
        ((r["column"], json.loads(r["value"]), json.loads(r["row"]), r["reason"]) for r in rows),
        key=lambda letter: (letter[0], str(letter[1]), json.dumps(letter[2], sort_keys=True)),
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
    assert ids(path) == [2]
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
    kept, letters = split_unstorable_spark(df, ["k"], engine="spark")

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
        assert ids(tmp_path / "a") == [2, 3]
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
    assert ids(tmp_path / "b") == [1, 2, 3]


# -- docs/architecture.md §7: a deduplicated key's winner is chosen before refusals count --


def test_a_merge_chooses_each_keys_winner_before_partition_values_are_refused(tmp_path):
    path, dead = tmp_path / "t", tmp_path / "dead"
    sink = opened(path, dead=dead, mode="merge", keys=["id"], order_by=["v"], partition_by=["k"])
    first = pa.table(
        {"id": pa.array([1, 2], pa.int64()), "v": pa.array([0, 0], pa.int64()), "k": ["a", "a"]}
    )
    sink.write(batch_of(first, 0))
    # key 1: the winner (v=2) is refused, the row it supersedes (v=1) is valid;
    # key 2: the winner (v=3) is valid, the row it supersedes (v=1) is refused
    second = pa.table(
        {
            "id": pa.array([1, 1, 2, 2], pa.int64()),
            "v": pa.array([2, 1, 3, 1], pa.int64()),
            "k": ["", "b", "c", ""],
        }
    )

    result = sink.write(batch_of(second, 1))

    rows = read_delta(str(path)).sort_by("id").to_pylist()
    assert rows == [{"id": 1, "v": 0, "k": "a"}, {"id": 2, "v": 3, "k": "c"}]
    assert letters_of(dead) == [("k", "", {"id": 1, "v": 2, "k": ""}, EMPTY)]
    assert (result.rows, result.dead_lettered) == (1, 1)


def test_a_merge_without_order_by_counts_a_refused_row_for_its_key(tmp_path):
    path, dead = tmp_path / "t", tmp_path / "dead"
    sink = opened(path, dead=dead, mode="merge", keys=["id"], partition_by=["k"])
    table = pa.table({"id": pa.array([1, 1], pa.int64()), "k": ["", "b"]})

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(table))

    assert str(raised.value) == (
        "sink 's', batch 0: 1 key(s) occur more than once in the batch, e.g. {'id': 1} "
        "(2 rows); a MERGE takes one row per key. Set order_by to the column(s) whose "
        "greatest value wins (e.g. an event time or sequence number), or deduplicate the "
        "stream."
    )
    assert not (path / "_delta_log").exists()


def keyed(ids: list[int], vs: list[int], ks: list[str]) -> pa.Table:
    """A merge batch: key ``id``, ``order_by`` column ``v``, partition column ``k``."""
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array(vs, pa.int64()), "k": ks})


def merged(path: Path, dead: Path | None = None, **options: Any) -> DeltaSink:
    """A merge sink on ``id``, partitioned by ``k``, holding ids 1 and 2 (``v=0, k='a'``)."""
    sink = opened(path, dead=dead, mode="merge", keys=["id"], partition_by=["k"], **options)
    sink.write(batch_of(keyed([1, 2], [0, 0], ["a", "a"]), 0))
    return sink


# key 1 (in the table): its winner (v=2) refused, the row it supersedes valid;
# key 2 (in the table): its winner (v=3) valid, the row it supersedes refused;
# keys 3 and 4: the same, on keys new to the table; key 5: a refused row alone
WINNERS_AND_LOSERS = keyed(
    [1, 1, 2, 2, 3, 3, 4, 4, 5],
    [2, 1, 3, 1, 2, 1, 3, 1, 1],
    ["", "b", "c", "", "", "b", "d", "", ""],
)


def test_a_merge_dead_letters_refused_winners_only_on_keys_old_and_new(tmp_path):
    """With a dead-letter target, a refused winner is its key's one dead letter and the
    key keeps its table value (key 1) or stays absent (keys 3, 5); a refused row that
    loses is superseded, not a dead letter (keys 2, 4). A replay writes nothing twice."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    sink = merged(path, dead, order_by=["v"])

    result = sink.write(batch_of(WINNERS_AND_LOSERS, 1))
    again = sink.write(batch_of(WINNERS_AND_LOSERS, 1))

    assert (result.rows, result.dead_lettered, result.already_written) == (2, 3, False)
    assert (again.rows, again.dead_lettered, again.already_written) == (2, 3, True)
    assert read_delta(str(path)).sort_by("id").to_pylist() == [
        {"id": 1, "v": 0, "k": "a"},
        {"id": 2, "v": 3, "k": "c"},
        {"id": 4, "v": 3, "k": "d"},
    ]
    assert letters_of(dead) == [
        ("k", "", {"id": 1, "v": 2, "k": ""}, EMPTY),
        ("k", "", {"id": 3, "v": 2, "k": ""}, EMPTY),
        ("k", "", {"id": 5, "v": 1, "k": ""}, EMPTY),
    ]


def test_a_merge_without_a_dead_letter_target_fails_on_refused_winners_only(tmp_path):
    """Without a dead-letter target the batch fails counting its refused winners (keys 1,
    3 and 5, not the losers of keys 2 and 4), and the table is left as it was."""
    path = tmp_path / "t"
    sink = merged(path, order_by=["v"])

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(WINNERS_AND_LOSERS, 1))

    assert str(raised.value) == f"sink 's', batch 1: 3 row(s): {EMPTY}"
    assert DeltaTable(str(path)).version() == 0


def test_a_merge_without_a_dead_letter_target_writes_a_batch_whose_refused_rows_all_lose(
    tmp_path,
):
    """A refused row superseded by a valid row of its key would never have been written:
    the batch does not fail for it, on a key in the table (2) or not (4)."""
    path = tmp_path / "t"
    sink = merged(path, order_by=["v"])
    batch = keyed([2, 2, 4, 4], [3, 1, 3, 1], ["c", "", "d", ""])

    result = sink.write(batch_of(batch, 1))

    assert (result.rows, result.dead_lettered) == (2, 0)
    assert read_delta(str(path)).sort_by("id").to_pylist() == [
        {"id": 1, "v": 0, "k": "a"},
        {"id": 2, "v": 3, "k": "c"},
        {"id": 4, "v": 3, "k": "d"},
    ]


@pytest.mark.parametrize("dead_letter", [True, False])
def test_a_timestamp_past_year_9999_is_refused_only_where_it_wins_its_key(tmp_path, dead_letter):
    """The rule holds for every partition value a Delta table cannot keep: a timestamp
    past the year 9999 refused as a winner (key 1), superseded as a loser (key 2)."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    sink = opened(path, dead=dead if dead_letter else None, mode="merge", keys=["id"],
                  order_by=["v"], partition_by=["ts"])  # fmt: skip
    batch = pa.table(
        {
            "id": pa.array([1, 1, 2, 2], pa.int64()),
            "v": pa.array([2, 1, 2, 1], pa.int64()),
            "ts": timestamps(YEAR_10000, 0, 0, YEAR_10000),
        }
    )

    if not dead_letter:
        with pytest.raises(SinkWriteError) as raised:
            sink.write(batch_of(batch))
        assert str(raised.value) == f"sink 's', batch 0: 1 row(s): {PAST_9999}"
        assert not (path / "_delta_log").exists()
        return
    result = sink.write(batch_of(batch))

    assert (result.rows, result.dead_lettered) == (1, 1)
    rows = read_delta(str(path)).to_pylist()
    assert rows == [{"id": 2, "v": 2, "ts": datetime(1970, 1, 1, tzinfo=UTC)}]
    assert letters_of(dead) == [
        (
            "ts",
            "+10000-01-01T00:00:00+00:00",  # as Spark's to_json spells it
            {"id": 1, "v": 2, "ts": "+10000-01-01T00:00:00+00:00"},
            PAST_9999,
        )
    ]


def test_a_merge_without_order_by_fails_naming_a_key_a_refused_row_shares_without_a_target(
    tmp_path,
):
    path = tmp_path / "t"
    sink = merged(path)

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(keyed([3, 3], [1, 1], ["", "b"]), 1))

    assert str(raised.value).startswith(
        "sink 's', batch 1: 1 key(s) occur more than once in the batch, e.g. {'id': 3} (2 rows)"
    )
    assert DeltaTable(str(path)).version() == 0


def test_a_merge_without_order_by_dead_letters_a_refused_row_alone_on_its_key_only(tmp_path):
    """Batch 1: a refused row alone on its key is a dead letter, the others are merged.
    Batch 2: a refused row sharing its key fails the batch naming the key, and writes no
    dead letter (the key's other row is not written as its only one)."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    sink = merged(path, dead)

    result = sink.write(batch_of(keyed([1, 3], [5, 5], ["", "b"]), 1))
    with pytest.raises(SinkWriteError, match=r"e\.g\. \{'id': 4\} \(2 rows\)"):
        sink.write(batch_of(keyed([4, 4], [6, 6], ["", "b"]), 2))

    assert (result.rows, result.dead_lettered) == (1, 1)
    assert read_delta(str(path)).sort_by("id").to_pylist() == [
        {"id": 1, "v": 0, "k": "a"},
        {"id": 2, "v": 0, "k": "a"},
        {"id": 3, "v": 5, "k": "b"},
    ]
    assert letters_of(dead) == [("k", "", {"id": 1, "v": 5, "k": ""}, EMPTY)]


@pytest.mark.integration
@pytest.mark.parametrize("dead_letter", [True, False])
def test_the_spark_engines_merge_source_chooses_winners_before_refusing(
    spark, tmp_path, dead_letter
):
    """The delta-spark engine's merge source follows the same rule (plain Spark: the
    source is built before Delta runs, so this needs no Delta jars)."""
    from fanout_delta.spark_engine import merge_source_spark
    from fanout_delta.target import DeltaTarget

    letters_target = DeltaDeadLetters(str(tmp_path / "dead")) if dead_letter else None
    target = DeltaTarget(name="s", path=str(tmp_path / "t"), mode="merge", keys=["id"],
                         order_by=["v"], dead_letters=letters_target)  # fmt: skip
    df = spark.createDataFrame(
        [tuple(r.values()) for r in WINNERS_AND_LOSERS.to_pylist()], "id long, v long, k string"
    )

    if not dead_letter:
        with pytest.raises(SinkWriteError) as raised:
            merge_source_spark(target, df, ["k"], 1)
        assert str(raised.value) == f"sink 's', batch 1: 3 row(s): {EMPTY}"
        kept, letters = merge_source_spark(target, df.filter("id in (2, 4)"), ["k"], 1)
        assert sorted(tuple(r) for r in kept.collect()) == [(2, 3, "c"), (4, 3, "d")]
        assert letters == []
        return
    kept, letters = merge_source_spark(target, df, ["k"], 1)

    assert sorted(tuple(r) for r in kept.collect()) == [(2, 3, "c"), (4, 3, "d")]
    assert sorted((x.column, x.value, x.reason, tuple(x.row.items())) for x in letters) == [
        ("k", "", EMPTY, (("id", i), ("v", v), ("k", ""))) for i, v in [(1, 2), (3, 2), (5, 1)]
    ]


@pytest.mark.integration
def test_the_spark_engines_merge_without_order_by_counts_a_refused_row_for_its_key(spark, tmp_path):
    """Plain Spark, as above: the key a refused row shares fails the batch, with a
    dead-letter target (before anything is written) or without."""
    sink = DeltaSink(name="s", path=str(tmp_path / "t"), engine="spark", mode="merge",
                     keys=["id"], partition_by=["k"])  # fmt: skip
    df = spark.createDataFrame([(1, ""), (1, "b"), (2, "c")], "id long, k string")

    with pytest.raises(SinkWriteError) as raised:
        write_spark(sink.target(), batch_of(df))

    assert str(raised.value).startswith("sink 's', batch 0: key {'id': 1} occurs 2 times")
    assert not (tmp_path / "t").exists()


# -- the one helper both engines' merges use (unit: rows as plain lists) --------------------


def test_winners_are_chosen_among_all_rows_before_the_winners_alone_are_refused():
    """``split_refused`` sees only what ``choose`` kept: a refused loser never reaches it."""
    from fanout_delta.merge import winners_then_refusals

    calls: list[tuple[str, list[str]]] = []

    def choose(rows: list[str]) -> list[str]:
        calls.append(("choose", rows))
        return [r for r in rows if r.rstrip("!").endswith("2")]  # each key's greatest

    def split(rows: list[str]) -> tuple[list[str], list[DeadLetter]]:
        calls.append(("split", rows))
        refused = [DeadLetter({"r": r}, "refused") for r in rows if "!" in r]
        return [r for r in rows if "!" not in r], refused

    kept, letters = winners_then_refusals(
        ["a1", "a2!", "b1!", "b2"],
        choose=choose,
        any_refused=lambda rows: any("!" in r for r in rows),
        split_refused=split,
    )

    assert kept == ["b2"]
    assert letters == [DeadLetter({"r": "a2!"}, "refused")]
    assert calls == [("choose", ["a1", "a2!", "b1!", "b2"]), ("split", ["a2!", "b2"])]


def test_without_a_refused_row_only_the_winners_are_chosen():
    """The common path: nothing refused, no split (no pass looking for letters)."""
    from fanout_delta.merge import winners_then_refusals

    def split(rows: list[str]) -> tuple[list[str], list[DeadLetter]]:
        raise AssertionError("split called without a refused row")

    kept, letters = winners_then_refusals(
        ["a1", "a2"], choose=lambda rows: rows[-1:], any_refused=lambda rows: False,
        split_refused=split,
    )  # fmt: skip

    assert (kept, letters) == (["a2"], [])


def test_holds_unstorable_finds_an_empty_string_or_a_year_past_9999_in_partition_columns():
    from fanout.delta_tables.values import holds_unstorable

    table = pa.table(
        {
            "k": pa.array(["a", None]),
            "e": pa.array(["a", ""]),
            "d": pa.array(["a", ""]).dictionary_encode(),
            "ts": timestamps(0, YEAR_10000),
            "day": pa.array([0, 2_932_897], pa.int32()).cast(pa.date32()),
            "n": pa.array([1, 2], pa.int64()),
        }
    )

    found = {c: holds_unstorable(table, [c]) for c in table.column_names}

    assert found == {"k": False, "e": True, "d": True, "ts": True, "day": True, "n": False}
    assert holds_unstorable(table, ["k", "n", "absent"]) is False
    assert holds_unstorable(table, ["k", "ts"]) is True


# -- negative decimals with a fractional part (delta-rs: '-1.-50') -------------------------


def negative_fraction(text: str) -> str:
    return (
        f"partition column 'd' holds {text}, a negative decimal with a fractional part, "
        "which delta-rs cannot write as a partition value (it writes -1.50 as '-1.-50' and "
        'fails the commit: "Failed to parse value"); partition by the value as text or '
        "scaled to an integer instead, or use engine 'spark'. Replace the value in the "
        "stream (e.g. with null), or set the sink's option 'dead_letter' to set such rows "
        "aside"
    )


def decimals(*texts: str | None, kind: pa.DataType | None = None) -> pa.Table:
    values = [None if t is None else Decimal(t) for t in texts]
    return pa.table(
        {
            "id": pa.array(range(1, len(texts) + 1), pa.int64()),
            "d": pa.array(values, kind or pa.decimal128(10, 2)),
        }
    )


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_a_negative_decimal_partition_value_with_a_fraction_fails_naming_it(tmp_path, mode):
    """delta-rs writes -1.50 as the partition value '-1.-50', then fails its own commit
    ("Kernel error: Failed to parse value '-1.-50' as 'decimal(10,2)'"), every replay
    alike: refused before anything is written, naming the column and the value."""
    path = tmp_path / "t"
    keys = {"keys": ["id"]} if mode == "merge" else {}
    sink = opened(path, mode=mode, partition_by=["d"], **keys)

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(decimals("2.00", "-1.50", "-0.05")))

    assert str(raised.value) == f"sink 's', batch 0: 2 row(s): {negative_fraction('-1.50')}"
    assert not (path / "_delta_log").exists()


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_negative_decimal_partition_values_with_a_fraction_go_to_the_dead_letters(tmp_path, mode):
    """The other decimals round-trip, negative integers and zero included; the refused
    rows are dead letters (the batch failed, every replay alike)."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    keys = {"keys": ["id"]} if mode == "merge" else {}
    sink = opened(path, dead=dead, mode=mode, partition_by=["d"], **keys)
    table = decimals("2.00", "-1.50", "-12.00", "0.00", "-0.05", None, "99999999.99")

    result = sink.write(batch_of(table))

    assert (result.rows, result.dead_lettered) == (5, 2)
    rows = read_delta(str(path)).sort_by("id")
    assert rows.column("id").to_pylist() == [1, 3, 4, 6, 7]
    assert rows.column("d").to_pylist() == [
        Decimal("2.00"), Decimal("-12.00"), Decimal("0.00"), None, Decimal("99999999.99")
    ]  # fmt: skip
    assert letters_of(dead) == [
        ("d", "-0.05", {"id": 5, "d": "-0.05"}, negative_fraction("-0.05")),
        ("d", "-1.50", {"id": 2, "d": "-1.50"}, negative_fraction("-1.50")),
    ]


def test_holds_unstorable_finds_negative_decimals_with_a_fraction_at_any_precision():
    from fanout.delta_tables.values import holds_unstorable, unstorable_rows

    cases = {
        "d": decimals("2.00", "-12.00", "0.00", None),
        "fraction": decimals("-99999999.99", "99999999.99"),  # the widest: ceil, floor
        "scale30": decimals("-0.000000000000000000000000000001", kind=pa.decimal128(38, 30)),
        "wide": decimals("-1.5", kind=pa.decimal256(40, 3)),
        "integers": decimals("-150", kind=pa.decimal128(10, 0)),
    }

    found = {name: holds_unstorable(table, ["d"]) for name, table in cases.items()}
    mask, faults = unstorable_rows(cases["scale30"], ["d"])

    assert found == {"d": False, "fraction": True, "scale30": True, "wide": True,
                     "integers": False}  # fmt: skip
    assert mask is not None and mask.to_pylist() == [True]
    assert faults == [
        (
            "d",
            "holds -0.000000000000000000000000000001, a negative decimal with a fractional "
            "part, which delta-rs cannot write as a partition value (it writes -1.50 as "
            "'-1.-50' and fails the commit: \"Failed to parse value\"); partition by the value "
            "as text or scaled to an integer instead, or use engine 'spark'",
        )
    ]


@pytest.mark.integration
def test_a_spark_batch_with_negative_decimal_partition_values_sets_them_aside(spark, tmp_path):
    """A Spark batch asked to be written from the executors: a decimal partition column
    sends it to delta-rs on the driver, which set the refused rows aside (it failed the
    whole batch on '-3.-25')."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    df = spark.sql(
        "select * from values (1L, -3.25bd), (2L, -3.00bd), (3L, 0.10bd) as t(id, d)"
    ).selectExpr("id", "cast(d as decimal(10, 2)) as d")
    sink = opened(path, spark, dead=dead, write_from="executors", partition_by=["d"])

    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (2, 1)
    rows = read_delta(str(path)).sort_by("id")
    assert rows.column("d").to_pylist() == [Decimal("-3.00"), Decimal("0.10")]
    assert letters_of(dead) == [("d", "-3.25", {"id": 1, "d": "-3.25"}, negative_fraction("-3.25"))]
