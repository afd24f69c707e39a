"""A shuffle started before its job (:mod:`fanout.steps.shuffle_ahead`), with real Spark: the
frame over it holds the same rows in the same partitions as the job planning the shuffle
itself, the shuffle is written once, and a stage started for nothing can be stopped."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pyspark.sql import DataFrame

from fanout.contract.sessions import ADAPTIVE, session_settings
from fanout.steps.shuffle_ahead import start_shuffle
from tests.integration.spark_jobs import completed_tasks, ended_jobs, job_group, wait_for

PARTITIONS = 4


def _hashed(spark: Any, rows: int = 200) -> Any:
    df = spark.range(0, rows, numPartitions=3).selectExpr("id", "concat('c', id % 7) AS customer")
    return df.repartition(PARTITIONS, "customer").sortWithinPartitions("id")


def _by_partition(df: Any) -> list[list[tuple[int, str]]]:
    rows = df.selectExpr("spark_partition_id() AS p", "id", "customer").collect()
    parts: list[list[tuple[int, str]]] = [[] for _ in range(PARTITIONS)]
    for row in rows:
        parts[row.p].append((row.id, row.customer))
    return parts


def test_the_frame_over_a_started_shuffle_holds_the_same_rows_in_the_same_partitions(
    spark: Any,
) -> None:
    expected = _by_partition(_hashed(spark))
    assert sum(len(p) for p in expected) == 200
    started = start_shuffle(_hashed(spark))
    assert started is not None
    assert _by_partition(started.frame) == expected  # sorted within each partition too


def test_the_shuffle_is_written_once_by_its_own_stage_and_read_by_the_job(spark: Any) -> None:
    group = f"ahead-{uuid.uuid4().hex[:8]}"
    with job_group(spark, group):
        started = start_shuffle(_hashed(spark))
        assert started is not None
        rows = started.frame.selectExpr("id").collect()
    assert sorted(r.id for r in rows) == list(range(200))
    tracker = spark.sparkContext.statusTracker()
    jobs = ended_jobs(tracker, group, 2)
    assert len(jobs) == 2  # the map stage's, then the job reading it
    assert len(list(tracker.getJobInfo(jobs[0]).stageIds)) == 1
    # the job reading it shares that stage while it runs, or skips it once it is done
    # 3 scan tasks, once; then one task per partition
    assert completed_tasks(tracker, jobs) == [3, PARTITIONS]


def test_a_frame_without_a_shuffle_starts_nothing(spark: Any) -> None:
    assert start_shuffle(spark.range(0, 10).selectExpr("id * 2 AS v")) is None


def test_a_shuffle_in_the_batchs_own_lineage_is_not_started(spark: Any) -> None:
    # the batch as foreachBatch hands it over: a DataFrame over a planned query's RDD, here
    # one with a shuffle of its own, which another sink's job may be running
    source = _hashed(spark)
    with session_settings(spark.conf, {ADAPTIVE: "false"}):
        rdd = source._jdf.queryExecution().toRdd()
    jdf = spark._jsparkSession.internalCreateDataFrame(rdd, source._jdf.schema(), False)
    batch = DataFrame(jdf, spark)
    assert start_shuffle(batch.selectExpr("id")) is None  # not the frame's own
    started = start_shuffle(batch.repartition(2, "id"))  # its own, above the batch
    assert started is not None
    assert sorted(r.id for r in started.frame.collect()) == list(range(200))


def test_over_a_cached_batch_only_the_frames_own_shuffle_is_started(spark: Any) -> None:
    # the batch cached for several readers (the persist rule), its cache built by another
    # sink's job from a shuffle of its own: that shuffle is never the one started
    batch = spark.range(0, 200, numPartitions=3).repartition(3, "id").persist()
    try:
        assert start_shuffle(batch.selectExpr("id")) is None
        started = start_shuffle(batch.selectExpr("id").repartition(PARTITIONS, "id"))
        assert started is not None
        assert sorted(r.id for r in started.frame.collect()) == list(range(200))
    finally:
        batch.unpersist()


def test_a_started_stage_no_job_reads_is_cancelled(spark: Any) -> None:
    slow = (
        spark.range(0, 4, numPartitions=2)
        .selectExpr("id", "reflect('java.lang.Thread', 'sleep', CAST(20000 AS BIGINT)) AS s")
        .repartition(PARTITIONS, "id")
    )
    group = f"ahead-{uuid.uuid4().hex[:8]}"
    with job_group(spark, group, interrupt=True):  # the cancelled sleep frees its slot
        started = start_shuffle(slow)
    assert started is not None
    tracker = spark.sparkContext.statusTracker()
    # the tracker hears of jobs through Spark's listener bus, a moment after they start
    wait_for(lambda: len(tracker.getJobIdsForGroup(group)) == 1)
    (job,) = tracker.getJobIdsForGroup(group)
    assert tracker.getJobInfo(job).status == "RUNNING"
    started.cancel()
    deadline = time.monotonic() + 10
    while tracker.getJobInfo(job).status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tracker.getJobInfo(job).status == "FAILED"  # cancelled, long before its 20 s


def test_a_stage_submitted_before_its_frame_failed_is_cancelled(
    spark: Any, monkeypatch: Any
) -> None:
    # the map stage is submitted before the rest of the plan is made: when that fails, no
    # frame will read the stage, so it is stopped, not left running for nothing
    from fanout.steps import shuffle_ahead

    def refused(*_: Any) -> Any:
        raise RuntimeError("no frame")

    monkeypatch.setattr(shuffle_ahead, "_frame_over", refused)
    slow = (
        spark.range(0, 4, numPartitions=2)
        .selectExpr("id", "reflect('java.lang.Thread', 'sleep', CAST(20000 AS BIGINT)) AS s")
        .repartition(PARTITIONS, "id")
    )
    group = f"ahead-{uuid.uuid4().hex[:8]}"
    with job_group(spark, group, interrupt=True):
        assert start_shuffle(slow) is None
    tracker = spark.sparkContext.statusTracker()
    wait_for(lambda: len(tracker.getJobIdsForGroup(group)) == 1)
    (job,) = tracker.getJobIdsForGroup(group)
    wait_for(lambda: tracker.getJobInfo(job).status != "RUNNING")
    assert tracker.getJobInfo(job).status == "FAILED"  # cancelled, long before its 20 s
