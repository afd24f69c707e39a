"""A timed partitioned write runs its partitions in several Spark jobs
(:mod:`fanout.partitioned.waves`), each over a range of the partitioned DataFrame's RDD:
the input those partitions are built from (the shuffle of the kit's repartition) is
computed once, by the first job, not once a job."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.functions import udf

import fanout.partitioned.waves as waves

ROWS, PARTITIONS = 40, 4


def test_waves_compute_the_shuffled_input_once(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = spark.sparkContext.accumulator(0)
    run_job, ran = waves._run_job, []

    def noted(rdd: Any, partitions: list[int]) -> list[Any]:
        ran.append(partitions)
        return run_job(rdd, partitions)

    monkeypatch.setattr(waves, "_run_job", noted)

    @udf("long")
    def counting(value: int) -> int:
        counted.add(1)
        return value

    df = spark.range(ROWS).select(counting("id").alias("id")).repartition(PARTITIONS, "id")
    rows = waves.collect_in_waves(df, budget=1)
    assert isinstance(rows, list)
    assert sorted(row.id for row in rows) == list(range(ROWS))
    assert ran == [[0], [1], [2], [3]]
    assert counted.value == ROWS  # not once a job
