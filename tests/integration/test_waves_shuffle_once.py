"""A timed partitioned write runs its partitions in several Spark jobs
(:mod:`fanout.partitioned.waves`), each over a range of the partitioned DataFrame's RDD:
the input those partitions are built from (the shuffle of the kit's repartition) is
computed once, by the first job, not once a job.

The DataFrame is planned as the kit plans its job (``plan_without_adaptive``): under
adaptive execution (Spark's default) taking ``df.rdd`` runs the shuffle itself, before
any wave, and the waves would only read it."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.functions import udf

import fanout.partitioned.waves as waves
from fanout.contract.sessions import plan_without_adaptive

ROWS, PARTITIONS = 40, 4


def test_waves_compute_the_shuffled_input_once(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = spark.sparkContext.accumulator(0)
    run_job, ran = waves._run_job, []

    def noted(rdd: Any, partitions: list[int]) -> list[Any]:
        before = counted.value
        rows = run_job(rdd, partitions)
        ran.append((partitions, before, counted.value))
        return rows

    monkeypatch.setattr(waves, "_run_job", noted)

    @udf("long")
    def counting(value: int) -> int:
        counted.add(1)
        return value

    df = spark.range(ROWS).select(counting("id").alias("id")).repartition(PARTITIONS, "id")
    plan_without_adaptive(df)  # as PartitionedSink.run_partitions plans its job
    rows = waves.collect_in_waves(df, budget=1)
    assert isinstance(rows, list)
    assert sorted(row.id for row in rows) == list(range(ROWS))
    # the first wave computes every row once; the others read its shuffle
    assert ran == [([0], 0, ROWS), ([1], ROWS, ROWS), ([2], ROWS, ROWS), ([3], ROWS, ROWS)]
