"""A server that cannot be reached fails the batch on the driver, in one round trip,
before any Spark job: ``PartitionedSink.preflight``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fanout_postgres import PostgresSink
from pgcheck import query
from pyspark.sql import types as T

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import TransientSinkError

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("code", T.StringType())])


def _door(pg_url: str, where: Path) -> tuple[str, Path, Path]:
    """A URL reaching the server through a symlink to its unix socket (removing the link
    takes the server out of reach; the server itself keeps running), the link, and its
    target."""
    url = sa.engine.make_url(pg_url)
    real = Path(str(url.query["host"])) / f".s.PGSQL.{url.port or 5432}"
    where.mkdir()
    link = where / real.name
    link.symlink_to(real)
    door = url.update_query_dict({"host": str(where)})
    return door.render_as_string(hide_password=False), link, real


def _jobs(spark: Any, group: str) -> list[int]:
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_an_unreachable_server_fails_the_batch_before_any_spark_job(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    url, link, real = _door(pg_url, tmp_path / "door")
    sink = PostgresSink(
        "pg", url=url, table="orders", keys=["id"], create_table=True, mode=mode,
        batch_schema=SCHEMA, partitions=2,
    )  # fmt: skip
    sink.open(SinkContext("preflight"))
    df = spark.createDataFrame([(i, f"c{i}") for i in range(10)], SCHEMA)
    scope = f"fanout/preflight/pg-{mode}"
    group = f"preflight-{mode}"
    spark.sparkContext.setJobGroup(group, "the preflight test's writes")
    try:
        link.unlink()  # the server is out of reach
        with pytest.raises(TransientSinkError) as caught:
            sink.write(Batch(df, BatchInfo("preflight", 0, "q"), "pg", scope))
        assert _jobs(spark, group) == []  # failed on the driver: no Spark job ran
        text = str(caught.value)
        assert text.startswith("sink 'pg', batch 0: cannot reach the server: OperationalError")
        assert sink.is_transient(caught.value)

        link.symlink_to(real)  # back: the same batch is written, every row once
        result = sink.write(Batch(df, BatchInfo("preflight", 0, "q"), "pg", scope))
        assert len(_jobs(spark, group)) >= 1
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert result.rows == 10
    assert query(pg_url, "SELECT id, code FROM orders ORDER BY id") == [
        (i, f"c{i}") for i in range(10)
    ]


def test_each_preflight_connects_anew_on_one_engine(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    # the driver keeps one engine (its dialect set up once) but no connection: a server
    # going out of reach after good batches still fails the next batch before any job
    import pickle

    url, link, real = _door(pg_url, tmp_path / "door")
    sink = PostgresSink("pg", url=url, table="kept", keys=["id"], create_table=True,
                        batch_schema=SCHEMA, partitions=2)  # fmt: skip
    sink.open(SinkContext("kept"))
    engine = sink._engine()
    df = spark.createDataFrame([(i, f"c{i}") for i in range(6)], SCHEMA)
    group = "preflight-kept"
    spark.sparkContext.setJobGroup(group, "the preflight test's writes")
    try:
        for batch_id in (0, 1):
            sink.write(Batch(df, BatchInfo("kept", batch_id, "q"), "pg", "fanout/kept/pg"))
        assert sink._engine() is engine
        jobs = len(_jobs(spark, group))
        link.unlink()
        with pytest.raises(TransientSinkError, match="cannot reach the server"):
            sink.write(Batch(df, BatchInfo("kept", 2, "q"), "pg", "fanout/kept/pg"))
        assert len(_jobs(spark, group)) == jobs  # refused on the driver
        link.symlink_to(real)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    copy = pickle.loads(pickle.dumps(sink))  # configuration only: the engine stays here
    assert "_driver_engine" not in copy.__dict__
    sink.close()
    assert "_driver_engine" not in sink.__dict__
    assert query(pg_url, "SELECT count(*) FROM kept") == [(6,)]
