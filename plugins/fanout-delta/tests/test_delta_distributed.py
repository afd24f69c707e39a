"""The Delta sink's append from the executors (engine rs, ``write_from="executors"``): the
Spark tasks write the Parquet files, the driver commits them once with the app
transaction. Real Spark DataFrames, real tables; every check reads the table back twice,
with delta-rs and with Spark reading exactly the Parquet files the Delta log references,
and the two must agree row for row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import distributed_driver
import pytest
from delta_masters import SessionOnMaster
from deltalake import DeltaTable
from fanout_delta import DeltaSink

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext, SinkResult
from fanout.delta_tables import distributed
from fanout.delta_tables.io import read_delta
from fanout.errors import (
    ConfigurationError,
    SchemaMismatchError,
    SinkWriteError,
    TransientSinkError,
)

APP_ID = txn_app_id("p", "s")
DRIVER = Path(__file__).with_name("distributed_driver.py")


def batch_of(df: Any, batch_id: int) -> Batch:
    return Batch(df=df, info=BatchInfo(pipeline="p", batch_id=batch_id), sink_name="s",
                 txn_app_id=APP_ID)  # fmt: skip


def opened(path: Path, **options: Any) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), **{"write_from": "executors", **options})
    sink.open(SinkContext(pipeline="p"))
    return sink


def orders(spark: Any, start: int, n: int, partitions: int = 3) -> Any:
    """Rows ``id`` in [start, start+n), ``v = "v<id>"``, ``amount = id / 2``."""
    return spark.range(start, start + n, numPartitions=partitions).selectExpr(
        "id", "IF(id >= -1000, concat('v', id), NULL) AS v", "id / 2 AS amount"
    )


def delta_rows(path: Path, sort: str = "id") -> list[dict[str, Any]]:
    return read_delta(str(path)).sort_by(sort).to_pylist()


def spark_rows(spark: Any, path: Path) -> list[dict[str, Any]]:
    """The rows of exactly the files the table's log references, read by Spark as plain
    Parquet (a file the log does not reference would be a second copy; one it references
    but that is missing would fail here)."""
    files = DeltaTable(str(path)).file_uris()
    if not files:
        return []
    return sorted((r.asDict() for r in spark.read.parquet(*files).collect()),
                  key=lambda r: r["id"])  # fmt: skip


def parquet_on_disk(path: Path) -> int:
    return sum(1 for _ in path.rglob("*.parquet"))


def expected(start: int, n: int) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"v{i}", "amount": i / 2} for i in range(start, start + n)]


# -- appends ---------------------------------------------------------------------------


def test_batches_are_written_by_the_executors_exactly(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    assert sink.reads == "dataframe"
    results = [sink.write(batch_of(orders(spark, 100 * b, 50 + b), b)) for b in range(3)]

    assert [r.rows for r in results] == [50, 51, 52]
    assert [r.details["write_from"] for r in results] == ["executors"] * 3
    assert [r.details["version"] for r in results] == [0, 1, 2]
    want = expected(0, 50) + expected(100, 51) + expected(200, 52)
    assert delta_rows(path) == want
    assert spark_rows(spark, path) == want
    table = DeltaTable(str(path))
    assert table.transaction_version(APP_ID) == 2
    assert table.history()[-1]["operation"] == "CREATE TABLE"


def test_statistics_in_the_log_match_each_file(spark, tmp_path):
    path = tmp_path / "t"
    opened(path).write(batch_of(orders(spark, 10, 20, partitions=2), 0))
    adds = [
        json.loads(line)["add"]
        for line in (path / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
        if "add" in json.loads(line)
    ]
    assert len(adds) == 2
    stats = sorted((json.loads(a["stats"]) for a in adds), key=lambda s: s["minValues"]["id"])
    # spark.range splits [10, 30) into two tasks of 10 rows
    assert [(s["numRecords"], s["minValues"]["id"], s["maxValues"]["id"]) for s in stats] == [
        (10, 10, 19),
        (10, 20, 29),
    ]
    assert stats[0]["minValues"]["amount"] == 5.0 and stats[0]["maxValues"]["v"] == "v19"
    assert stats[0]["nullCount"] == {"id": 0, "v": 0, "amount": 0}
    assert {a["size"] for a in adds} == {(path / a["path"]).stat().st_size for a in adds}


def test_partitioned_table_with_null_and_odd_values(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path, partition_by=["day"])
    df = orders(spark, 0, 9).selectExpr(
        "id", "v", "amount",
        "CASE WHEN id % 3 = 0 THEN 'd 1/x' WHEN id % 3 = 1 THEN 'd2' END AS day",
    )  # fmt: skip
    sink.write(batch_of(df, 0))
    sink.write(batch_of(df.selectExpr("id + 100 AS id", "v", "amount", "day"), 1))

    table = DeltaTable(str(path))
    assert table.metadata().partition_columns == ["day"]
    got = delta_rows(path)
    assert [r["id"] for r in got] == [*range(9), *range(100, 109)]
    days = {r["id"]: r["day"] for r in got}
    assert [days[i] for i in (0, 1, 2, 103, 104, 105)] == ["d 1/x", "d2", None, "d 1/x", "d2", None]
    directories = sorted({p.parent.name for p in path.rglob("*.parquet")})
    assert directories == ["day=__HIVE_DEFAULT_PARTITION__", "day=d%201%2Fx", "day=d2"]
    assert [r["id"] for r in spark_rows(spark, path)] == [*range(9), *range(100, 109)]
    # delta-rs filters on the partition values written in the log
    assert sorted(read_delta(str(path), filters=[("day", "=", "d2")]).column("id").to_pylist()) \
        == [1, 4, 7, 101, 104, 107]  # fmt: skip


def test_merge_schema_commits_the_merged_schema(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path, merge_schema=True)
    sink.write(batch_of(orders(spark, 0, 3), 0))
    sink.write(batch_of(orders(spark, 3, 2).selectExpr("id", "v", "amount", "'x' AS extra"), 1))
    sink.write(batch_of(orders(spark, 5, 1).selectExpr("id", "amount"), 2))

    assert DeltaTable(str(path)).schema().to_arrow().names == ["id", "v", "amount", "extra"]
    got = [(r["id"], r["v"], r["extra"]) for r in delta_rows(path)]
    assert got == [(0, "v0", None), (1, "v1", None), (2, "v2", None), (3, "v3", "x"),
                   (4, "v4", "x"), (5, None, None)]  # fmt: skip
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 2


def test_a_batch_that_does_not_fit_fails_before_any_file_is_written(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(batch_of(orders(spark, 0, 2), 0))
    files = parquet_on_disk(path)
    with pytest.raises(SchemaMismatchError) as info:
        sink.write(batch_of(orders(spark, 2, 2).selectExpr("id", "v", "'x' AS extra"), 1))
    assert (info.value.sink, info.value.batch_id, info.value.columns) == ("s", 1, ["extra"])
    assert parquet_on_disk(path) == files


def test_replay_is_skipped_by_the_transaction_check_without_a_job(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(batch_of(orders(spark, 0, 7), 4))
    files = parquet_on_disk(path)

    again = sink.write(batch_of(orders(spark, 0, 7), 4))
    older = sink.write(batch_of(orders(spark, 50, 7), 3))

    assert again == SinkResult(rows=7, already_written=True)
    assert older.already_written is True
    assert parquet_on_disk(path) == files  # the check runs before the executors write
    assert delta_rows(path) == expected(0, 7) == spark_rows(spark, path)
    assert DeltaTable(str(path)).version() == 0


def test_a_failed_commit_leaves_its_files_unreferenced_and_the_replay_writes_once(
    spark, tmp_path, monkeypatch
):
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(batch_of(orders(spark, 0, 10), 0))
    real = distributed._commit
    failures = []

    def fails_once(*args: Any, **kwargs: Any) -> None:
        if not failures:
            failures.append(1)
            raise OSError("the store went away")
        real(*args, **kwargs)

    monkeypatch.setattr(distributed, "_commit", fails_once)
    with pytest.raises(SinkWriteError) as info:
        sink.write(batch_of(orders(spark, 10, 10), 1))
    assert (info.value.sink, info.value.batch_id) == ("s", 1)
    assert "the store went away" in str(info.value)
    orphans = parquet_on_disk(path) - len(DeltaTable(str(path)).file_uris())
    assert orphans == 3  # written by the failed attempt, referenced by nothing
    assert delta_rows(path) == expected(0, 10)

    replay = sink.write(batch_of(orders(spark, 10, 10), 1))

    assert (replay.rows, replay.already_written) == (10, False)
    assert delta_rows(path) == expected(0, 20) == spark_rows(spark, path)
    table = DeltaTable(str(path))
    assert len(table.file_uris()) == 6 and parquet_on_disk(path) == 9
    assert table.transaction_version(APP_ID) == 1
    # the table's normal cleanup removes the failed attempt's files
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True)
    assert parquet_on_disk(path) == 6
    assert delta_rows(path) == expected(0, 20)


def test_first_batch_creates_the_table_with_its_configuration(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path, configuration={"delta.appendOnly": "true"}, partition_by=["v"])
    result = sink.write(batch_of(orders(spark, 0, 4), 0))
    table = DeltaTable(str(path))
    assert (result.rows, result.details["version"], table.version()) == (4, 0, 0)
    assert table.metadata().configuration["delta.appendOnly"] == "true"
    assert table.metadata().partition_columns == ["v"]
    assert delta_rows(path) == expected(0, 4)


def test_a_batch_of_no_rows_commits_nothing(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    empty = sink.write(batch_of(orders(spark, 0, 0), 0))
    assert empty == SinkResult(rows=0, details={"empty": True, "mode": "append"})
    assert not path.exists()  # no table, no file
    sink.write(batch_of(orders(spark, 0, 2), 1))
    assert sink.write(batch_of(orders(spark, 5, 5).where("id < 0"), 2)).rows == 0
    assert DeltaTable(str(path)).version() == 0
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1
    assert delta_rows(path) == expected(0, 2)


def test_write_from_driver_keeps_the_old_path(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    assert sink.reads == "arrow"
    result = sink.write(batch_of(orders(spark, 0, 5), 0))
    assert "write_from" not in result.details
    assert DeltaTable(str(path)).history()[-1]["operation"] == "WRITE"
    assert delta_rows(path) == expected(0, 5)


@pytest.mark.parametrize(
    ("master", "where", "reads"),
    [
        ("local[2]", "driver", "arrow"),
        ("local", "driver", "arrow"),
        ("local-cluster[2,1,1024]", "executors", "dataframe"),  # one host
        # a local path on a cluster (or one the session does not say): the executors may
        # run where the path is not (test_delta_object_store.py: an S3 table on them)
        ("spark://host:7077", "driver", "arrow"),
        ("yarn", "driver", "arrow"),
        (None, "driver", "arrow"),
    ],
)
def test_auto_writes_a_local_path_from_the_driver_unless_on_one_host(
    spark, tmp_path, master, where, reads
):
    path = tmp_path / "t"
    sink = DeltaSink(name="s", path=str(path))  # write_from="auto", the default
    sink.open(SinkContext(pipeline="p", spark=SessionOnMaster(spark, master)))
    assert (sink.resolved_write_from, sink.reads) == (where, reads)
    result = sink.write(batch_of(orders(spark, 0, 5), 0))
    assert result.details.get("write_from", "driver") == where
    assert delta_rows(path) == expected(0, 5)


def test_auto_without_a_session_writes_from_the_driver(tmp_path):
    sink = DeltaSink(name="s", path=str(tmp_path / "t"))
    sink.open(SinkContext(pipeline="p"))
    assert (sink.resolved_write_from, sink.reads) == ("driver", "arrow")


def test_a_table_with_check_constraints_is_written_from_the_driver(spark, tmp_path):
    path = tmp_path / "t"
    opened(path).write(batch_of(orders(spark, 0, 2), 0))
    DeltaTable(str(path)).alter.add_constraint({"positive": "id >= 0"})
    sink = opened(path)
    result = sink.write(batch_of(orders(spark, 2, 2), 1))
    assert "write_from" not in result.details  # the executor writer does not check them
    with pytest.raises(SinkWriteError, match=r"2 row\(s\) break the constraints of the Delta"):
        sink.write(batch_of(orders(spark, -5, 2), 2))
    assert delta_rows(path) == expected(0, 4)


# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (
            {"write_from": "nodes"},
            "'write_from' must be one of auto, executors, driver, got 'nodes'",
        ),
        ({"max_merge_rows": 0}, "'max_merge_rows' must be a positive integer"),
        ({"max_merge_rows": "9"}, "'max_merge_rows' must be a positive integer"),
    ],
)
def test_bad_new_options_fail_at_open(tmp_path, options, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        opened(tmp_path / "t", **options)


def test_merge_past_max_merge_rows_is_refused_naming_the_option(spark, tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"], max_merge_rows=10)
    sink.write(batch_of(orders(spark, 0, 10), 0))
    with pytest.raises(SinkWriteError) as info:
        sink.write(batch_of(orders(spark, 0, 11), 1))
    message = str(info.value)
    assert (info.value.sink, info.value.batch_id) == ("s", 1)
    assert "more than 10 rows" in message and "max_merge_rows" in message
    assert DeltaTable(str(path)).version() == 0
    assert (
        opened(path, mode="merge", keys=["id"], max_merge_rows=None)
        .write(batch_of(orders(spark, 0, 11), 1))
        .rows
        == 11
    )


# -- a driver killed between the executors' files and the commit -------------------------


def test_driver_killed_before_the_commit_then_restarted_writes_every_row_once(spark, tmp_path):
    """A real subprocess driver (its own Spark) streams three input files through FanOut
    into a Delta sink and SIGKILLs itself in batch 1 after the executors wrote the files
    and before the commit. The restart replays batch 1 from its checkpoint: every row is in
    the table exactly once, the killed attempt's files are on disk but unreferenced. The
    restart runs in the test's process, which shares nothing with the killed driver but
    its files (a driver subprocess starts Spark, ~15 s)."""
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    killed = subprocess.run(
        [sys.executable, str(DRIVER), str(work), "--kill-before-commit", "1"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "KILLED before the commit of batch 1" in killed.stderr
    lake = work / "lake"
    assert DeltaTable(str(lake)).transaction_version(txn_app_id("dist", "lake")) == 0
    written = parquet_on_disk(lake)
    assert written > len(DeltaTable(str(lake)).file_uris())  # batch 1's files, unreferenced

    distributed_driver.run(spark, work)  # the restart

    ids = sorted(r["id"] for r in read_delta(str(lake)).to_pylist())
    assert ids == list(range(300))
    assert sorted(r["id"] for r in spark_rows(spark, lake)) == list(range(300))
    assert DeltaTable(str(lake)).transaction_version(txn_app_id("dist", "lake")) == 2


# -- per-partition commit hooks ---------------------------------------------------------


def test_each_task_calls_the_partition_commit_hook_once_its_files_are_written(spark, tmp_path):
    from fanout.testing.faults import VetoOnce

    path, state = tmp_path / "t", tmp_path / "veto.json"
    sink = DeltaSink(name="s", path=str(path), write_from="executors")
    sink.open(SinkContext(pipeline="p", plugins=[VetoOnce(batch=0, partition=1, state=str(state))]))
    if int(spark.conf.get("spark.task.maxFailures", "1")) > 1:
        # a cluster retries the vetoed task: the batch commits once, the retry's files
        result = sink.write(batch_of(orders(spark, 0, 6), 0))
    else:
        with pytest.raises(TransientSinkError, match="injected veto before commit") as caught:
            sink.write(batch_of(orders(spark, 0, 6), 0))
        assert (caught.value.sink, caught.value.batch_id) == ("s", 0)
        assert not (path / "_delta_log").exists()  # nothing was committed
        result = sink.write(batch_of(orders(spark, 0, 6), 0))  # the replay commits once
    # partition 1's two rows were written as a file, then vetoed: that file is never
    # referenced
    assert json.loads(state.read_text()) == {"batch": 0, "partition": 1, "records": 2}
    assert (result.rows, result.details["write_from"]) == (6, "executors")
    assert delta_rows(path) == expected(0, 6)
    referenced = {Path(uri).name for uri in DeltaTable(str(path)).file_uris()}
    assert len(referenced) == 3
    assert len({p.name for p in path.glob("part-*.parquet")} - referenced) >= 1
