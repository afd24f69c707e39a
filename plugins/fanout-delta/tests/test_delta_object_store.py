"""The Delta sink on an object store (S3, served by moto in a subprocess): the append from
the executors writes its files through delta-rs' object store from the Spark tasks (other
processes than the driver), the driver commits them; the driver-side append and merge
write there too; a replay is skipped. Every table is read back through S3 with delta-rs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from delta_masters import SessionOnMaster
from deltalake import DeltaTable
from fanout_delta import DeltaSink

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext

BUCKET = "lake"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """A moto S3 server in its own process (in this one, delta-rs' filesystem calls made
    while holding the GIL would starve the server's thread), with one bucket; yields the
    storage options reaching it."""
    import boto3

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)
        credentials = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     **credentials).create_bucket(Bucket=BUCKET)  # fmt: skip
        yield {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "conditional_put": "etag",  # moto takes If-None-Match: commits are exclusive
        }
    finally:
        server.terminate()
        server.wait(10)


def batch_of(df: Any, batch_id: int) -> Batch:
    return Batch(df=df, info=BatchInfo(pipeline="p", batch_id=batch_id), sink_name="s",
                 txn_app_id=txn_app_id("p", "s"))  # fmt: skip


def orders(spark: Any, start: int, n: int) -> Any:
    return spark.range(start, start + n, numPartitions=3).selectExpr(
        "id", "concat('v', id) AS v", "CAST(id % 2 AS INT) AS half"
    )


def table_rows(uri: str, options: dict[str, str]) -> list[dict[str, Any]]:
    table = DeltaTable(uri, storage_options=options)
    return sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def rows(start: int, n: int) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"v{i}", "half": i % 2} for i in range(start, start + n)]


def test_the_executors_append_to_s3_once_per_batch(spark, s3):
    uri = f"s3://{BUCKET}/executors"
    sink = DeltaSink(name="s", path=uri, write_from="executors", partition_by=["half"],
                     storage_options=s3)  # fmt: skip
    sink.open(SinkContext(pipeline="p", spark=spark))
    first = sink.write(batch_of(orders(spark, 0, 6), 0))
    second = sink.write(batch_of(orders(spark, 6, 4), 1))
    replay = sink.write(batch_of(orders(spark, 6, 4), 1))
    assert [(r.rows, r.details.get("write_from")) for r in (first, second)] == [
        (6, "executors"), (4, "executors")]  # fmt: skip
    assert replay.already_written
    assert table_rows(uri, s3) == rows(0, 10)
    table = DeltaTable(uri, storage_options=s3)
    assert table.version() == 1
    assert table.transaction_version(txn_app_id("p", "s")) == 1
    assert table.metadata().partition_columns == ["half"]
    files = table.file_uris()
    assert files and all(f.startswith(f"{uri}/half=") and "/part-" in f for f in files)


def test_the_driver_append_and_merge_write_to_s3(spark, s3):
    appended = f"s3://{BUCKET}/driver"
    sink = DeltaSink(name="s", path=appended, write_from="driver", storage_options=s3)
    sink.open(SinkContext(pipeline="p", spark=spark))
    assert sink.write(batch_of(orders(spark, 0, 5), 0)).details.get("write_from") is None
    assert table_rows(appended, s3) == rows(0, 5)

    merged = f"s3://{BUCKET}/merged"
    sink = DeltaSink(name="s", path=merged, mode="merge", keys=["id"], storage_options=s3)
    sink.open(SinkContext(pipeline="p", spark=spark))
    sink.write(batch_of(orders(spark, 0, 4), 0))
    sink.write(batch_of(orders(spark, 2, 4).selectExpr("id", "'new' AS v", "half"), 1))
    assert table_rows(merged, s3) == [
        *rows(0, 2),
        *({"id": i, "v": "new", "half": i % 2} for i in range(2, 6)),
    ]


@pytest.mark.parametrize(
    ("master", "where"),
    [("spark://host:7077", "executors"), (None, "executors"), ("local[2]", "driver")],
)
def test_auto_writes_an_object_store_table_from_the_executors_on_a_cluster(
    spark, s3, master, where
):
    uri = f"s3://{BUCKET}/auto-{where}-{master is None}"
    sink = DeltaSink(name="s", path=uri, storage_options=s3)  # write_from="auto"
    sink.open(SinkContext(pipeline="p", spark=SessionOnMaster(spark, master)))
    assert sink.resolved_write_from == where
    result = sink.write(batch_of(orders(spark, 0, 4), 0))
    assert (result.rows, result.details.get("write_from", "driver")) == (4, where)
    assert table_rows(uri, s3) == rows(0, 4)


def test_an_unchecked_compaction_whose_removed_files_vacuum_deleted_on_s3_is_refused(
    s3: dict[str, str],
) -> None:
    """A fanout compaction killed before its check, then vacuum: adding back the file it
    removed would name a file gone from the bucket (every read failing), so the later
    scan refuses, looking the file up in the bucket (not on a local disk)."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from fanout.delta_tables import compaction
    from fanout.delta_tables.compaction import scan
    from fanout.delta_tables.compaction.marker import mark_compacted
    from fanout.errors import CompactionError

    uri = f"s3://{BUCKET}/vacuumed"
    for i in range(4):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append", storage_options=s3)
    first = DeltaTable(uri, storage_options=s3)
    mark_compacted(first, s3, first.version())  # as fanout's first compaction
    other = DeltaTable(uri, storage_options=s3)  # plans on ids 0-3
    write_deltalake(uri, pa.table({"id": [4]}), mode="append", storage_options=s3)
    mine = DeltaTable(uri, storage_options=s3)  # plans on ids 0-4: removes id 4's alone
    other.optimize.compact()
    tag = CommitProperties(custom_metadata={"fanoutCommit": "compaction killed"})
    mine.optimize.compact(commit_properties=tag)  # version 7, killed unchecked
    DeltaTable(uri, storage_options=s3).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    scan._checked_through.clear()

    with pytest.raises(CompactionError, match=r"the files it removed are gone from storage"):
        compaction.repair_unchecked(DeltaTable(uri, storage_options=s3), "test table", s3)
    ids = DeltaTable(uri, storage_options=s3).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == [0, 0, 1, 1, 2, 2, 3, 3, 4]  # left as the error says
