"""With real Spark: two sinks of the partitioned-sink kit hashing the batch by the same
column into the same number of partitions share one shuffle. fanout persists the batch
partitioned that way, each sink's own ``repartition`` then plans no Exchange above the
cache, and every row lands in the partition it would have landed in alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout import Batch, BatchInfo, FanOut
from fanout.ledger.memory import MemoryLedger
from fanout.partitioned.membership import quoted
from fanout.partitioned.sink import PartitionInput
from tests.integration.spark_jobs import sql_plans

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from partitioned_sink import PartitionedFilesSink  # noqa: E402

ROWS = 60


class PlanWatchingSink(PartitionedFilesSink):
    """Notes how many shuffles Spark plans for the kit's ``repartition`` of its input,
    above the cache (the cache's own plan is printed below ``InMemoryTableScan``)."""

    shuffles: list[int]

    def partition_input(self, batch: Batch) -> PartitionInput:
        given = super().partition_input(batch)
        parted = given.df.repartition(self.partitions, *[quoted(c) for c in given.by])
        plan = parted._jdf.queryExecution().executedPlan().toString()
        above_cache = plan.split("InMemoryTableScan")[0]
        self.shuffles = [*getattr(self, "shuffles", []), above_cache.count("Exchange")]
        return given


def partitions_of(directory: Path) -> dict[int, list[int]]:
    """Partition -> the ids its file holds."""
    found = {}
    for path in directory.glob("*.jsonl"):
        lines = path.read_text().splitlines()[1:]
        found[int(path.stem.rsplit("-p", 1)[1])] = sorted(json.loads(x)["id"] for x in lines)
    return found


def fan_out(
    spark: Any, tmp_path: Path, sinks: list[Any], *, share_tasks: bool = True
) -> dict[str, Any]:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules["partitioned_sink"])
    df = spark.createDataFrame([(i, f"v{i}") for i in range(ROWS)], "id INT, v STRING")
    fan = FanOut("shared", MemoryLedger(), sinks, retries=0, share_tasks=share_tasks)
    results = fan.process(df, BatchInfo("shared", 0, "q"))
    assert sorted(results) == sorted(s.name for s in sinks)
    return results


def expected_partitions(spark: Any, partitions: int) -> dict[int, list[int]]:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i, f"v{i}") for i in range(ROWS)], "id INT, v STRING")
    rows = df.repartition(partitions, "id").select("id", F.spark_partition_id().alias("p"))
    found: dict[int, list[int]] = {}
    for row in rows.collect():
        found.setdefault(row["p"], []).append(row["id"])
    return {p: sorted(ids) for p, ids in found.items()}


def test_two_sinks_hashing_alike_share_one_shuffle(spark: Any, tmp_path: Path) -> None:
    # their own jobs (share_tasks=False) read one cache, partitioned once; sharing their
    # tasks (the default) reads the batch once: tests/integration/test_shared_tasks.py
    a = PlanWatchingSink("a", directory=str(tmp_path / "a"), partitions=3)
    b = PlanWatchingSink("b", directory=str(tmp_path / "b"), partitions=3)
    results = fan_out(spark, tmp_path, [a, b], share_tasks=False)
    assert a.shuffles == [0] and b.shuffles == [0]
    expected = expected_partitions(spark, 3)
    assert sum(len(ids) for ids in expected.values()) == ROWS
    assert partitions_of(tmp_path / "a") == expected
    assert partitions_of(tmp_path / "b") == expected
    assert results["a"].rows == results["b"].rows == ROWS


def test_sinks_hashing_differently_each_shuffle(spark: Any, tmp_path: Path) -> None:
    a = PlanWatchingSink("a", directory=str(tmp_path / "a"), partitions=3)
    b = PlanWatchingSink("b", directory=str(tmp_path / "b"), partitions=2)
    fan_out(spark, tmp_path, [a, b])
    assert a.shuffles == [1] and b.shuffles == [1]
    assert partitions_of(tmp_path / "a") == expected_partitions(spark, 3)
    assert partitions_of(tmp_path / "b") == expected_partitions(spark, 2)


def test_a_volatile_shared_key_is_still_refused_by_every_sink(spark: Any, tmp_path: Path) -> None:
    # fanout's repartition comes before the sinks' determinism checks, which still follow
    # the key through it (and through the cache) to uuid(): nothing is written
    from pyspark import cloudpickle

    from fanout import BatchFailedError, PartitioningError

    cloudpickle.register_pickle_by_value(sys.modules["partitioned_sink"])
    df = spark.range(20).selectExpr("CAST(id AS INT) AS n", "uuid() AS id")
    a = PartitionedFilesSink("a", directory=str(tmp_path / "a"), partitions=3)
    b = PartitionedFilesSink("b", directory=str(tmp_path / "b"), partitions=3)
    fan = FanOut("volatile", MemoryLedger(), [a, b], retries=0)
    with pytest.raises(BatchFailedError) as failed:
        fan.process(df, BatchInfo("volatile", 0, "q-volatile"))  # checks pass once per query
    assert sorted(failed.value.failures) == ["a", "b"]
    for name, error in failed.value.failures.items():
        assert isinstance(error, PartitioningError)
        assert str(error).startswith(f"sink {name!r}, batch 0: ")
        assert "uuid() AS id" in str(error)
    assert list((tmp_path / "a").glob("*.jsonl")) == [] == list((tmp_path / "b").glob("*.jsonl"))


def test_a_refused_partitioning_leaves_the_other_sinks_written_and_marked(
    spark: Any, tmp_path: Path
) -> None:
    # invariant 6: the refusal comes before any partition of the refused sink writes; a
    # sink that does not partition writes and marks the batch, so a replay skips it
    from pyspark import cloudpickle

    from fanout import BatchFailedError, PartitioningError
    from fanout.testing import RecordingSink

    cloudpickle.register_pickle_by_value(sys.modules["partitioned_sink"])
    df = spark.range(5).selectExpr("CAST(id AS INT) AS n", "uuid() AS id")
    keyed = PartitionedFilesSink("keyed", directory=str(tmp_path / "keyed"), partitions=2)
    plain = RecordingSink("plain")
    ledger = MemoryLedger()
    fan = FanOut("refused", ledger, [keyed, plain], retries=0)
    for _replay in range(2):
        with pytest.raises(BatchFailedError) as failed:
            fan.process(df, BatchInfo("refused", 0, "q-refused"))  # a refusal is not remembered
        assert list(failed.value.failures) == ["keyed"]
        assert isinstance(failed.value.failures["keyed"], PartitioningError)
        assert list((tmp_path / "keyed").glob("*.jsonl")) == []
        assert ledger.last_committed("refused", ["keyed", "plain"]) == {"keyed": None, "plain": 0}
        assert plain.calls == [(0, 1)]  # written once, skipped on the replay
    assert sorted(r["n"] for r in plain.rows()) == [0, 1, 2, 3, 4]


def test_the_partition_job_runs_without_adaptive_execution(spark: Any, tmp_path: Path) -> None:
    # one task per partition: adaptive execution has nothing to adapt, and its query
    # stages cost ~30 ms a job; the session's own setting is left as it was
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules["partitioned_sink"])
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    sink = PartitionedFilesSink("plain", directory=str(tmp_path / "plain"), partitions=3)
    with sql_plans(spark) as plans:
        fan_out(spark, tmp_path, [sink])
    jobs = [plan for plan in plans if "MapInArrow" in plan]
    assert len(jobs) == 1
    assert "AdaptiveSparkPlan" not in jobs[0]
    assert "hashpartitioning(id#" in jobs[0]  # the sink's own repartition, planned plainly
    assert spark.conf.get("spark.sql.adaptive.enabled") == adaptive
    assert partitions_of(tmp_path / "plain") == expected_partitions(spark, 3)
