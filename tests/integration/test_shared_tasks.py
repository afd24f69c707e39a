"""With real Spark, PostgreSQL, a Kafka-protocol broker and Delta: a PostgreSQL table and a
Kafka topic keyed alike (``order_id``, 4 partitions), and a Delta append, write each batch
in one shared Spark job (one task per partition hands the rows to every writer), each
exactly once; a sink that fails in the shared task retries alone while the others keep
their writes."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafkatools import create_topic, read_topic
from pgcheck import query

from fanout import BatchInfo, CheckpointRollbackError, FanOut, SinkResult, hookimpl
from fanout.ledger.memory import MemoryLedger
from fanout.testing.faults import VetoOnce
from tests.chaos.services import embedded_services
from tests.integration.spark_jobs import (
    completed_tasks,
    ended_jobs,
    job_group,
    sql_plans,
    wait_for,
)

PARTITIONS, BATCHES, ROWS = 4, 3, 20


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(postgres_url, kafka_bootstrap)``."""
    with embedded_services(tmp_path_factory.mktemp("services")) as found:
        yield found


class Results:
    """An observer keeping each sink's results and errors, per batch."""

    def __init__(self) -> None:
        self.done: dict[tuple[str, int], dict[str, Any]] = {}
        self.errors: list[tuple[str, int, int]] = []

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        self.done[(sink, info.batch_id)] = dict(result.details)

    @hookimpl
    def fanout_sink_error(
        self, info: BatchInfo, sink: str, error: BaseException, attempt: int, will_retry: bool
    ) -> None:
        self.errors.append((sink, info.batch_id, attempt))


def _sinks(url: str, bootstrap: str, suffix: str) -> list[dict[str, Any]]:
    topic = f"shared-{suffix}"
    create_topic(bootstrap, topic, PARTITIONS)
    return [
        {"type": "postgres", "name": "pg", "url": url, "table": f"orders_{suffix}",
         "keys": ["order_id"], "partitions": PARTITIONS, "create_table": True},
        {"type": "kafka", "name": "kafka", "bootstrap_servers": bootstrap, "topic": topic,
         "key": "order_id", "partitions": PARTITIONS, "marker_topic": f"markers-{suffix}"},
    ]  # fmt: skip


def _batch(spark: Any, batch_id: int) -> Any:
    ids = range(batch_id * ROWS, (batch_id + 1) * ROWS)
    rows = [(i, f"c{i % 3}", i * 1.5) for i in ids]
    return spark.createDataFrame(rows, "order_id INT, customer STRING, amount DOUBLE")


def _stream(spark: Any, fan: FanOut) -> list[int]:
    """Fan out every batch; how many ``mapInArrow`` jobs Spark ran for each."""
    return [_arrow_jobs(spark, fan, batch_id) for batch_id in range(BATCHES)]


def _arrow_jobs(spark: Any, fan: FanOut, batch_id: int) -> int:
    df = _batch(spark, batch_id)
    with sql_plans(spark) as plans:
        fan.process(df, BatchInfo(fan.pipeline, batch_id, "q"))
    return sum("MapInArrow" in plan for plan in plans)


def _check_targets(url: str, bootstrap: str, suffix: str) -> None:
    expected = {i: (f"c{i % 3}", i * 1.5) for i in range(BATCHES * ROWS)}
    rows = query(url, f"SELECT order_id, customer, amount FROM orders_{suffix}")
    assert Counter(r[0] for r in rows) == Counter(list(expected))  # each id once
    assert {r[0]: (r[1], r[2]) for r in rows} == expected
    records = read_topic(bootstrap, f"shared-{suffix}", len(expected))
    assert Counter(int(r["key"]) for r in records) == Counter(list(expected))
    values = {int(r["key"]): json.loads(r["value"]) for r in records}
    assert values == {
        i: {"order_id": i, "customer": c, "amount": a} for i, (c, a) in expected.items()
    }


def test_sinks_keyed_alike_write_each_batch_in_one_job(
    spark: Any, services: tuple[str, str]
) -> None:
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    results = Results()
    fan = FanOut(f"sh{suffix}", MemoryLedger(), _sinks(url, bootstrap, suffix), retries=0,
                 plugins=[results])  # fmt: skip
    jobs = _stream(spark, fan)
    # batch 0: PostgreSQL cannot tell its partitioning before its first write (it reads
    # the table), so each sink runs its own job; from batch 1 on, one job for both
    assert jobs == [2, 1, 1]
    assert "shared_with" not in results.done[("pg", 0)]
    for batch_id in (1, 2):
        assert results.done[("pg", batch_id)]["shared_with"] == ["kafka"]
        assert results.done[("kafka", batch_id)]["shared_with"] == ["pg"]
        for sink in ("pg", "kafka"):
            assert results.done[(sink, batch_id)]["committed_partitions"] == [0, 1, 2, 3]
    assert results.errors == []
    _check_targets(url, bootstrap, suffix)


def test_every_job_of_a_shared_batch_carries_the_callers_job_group(
    spark: Any, services: tuple[str, str]
) -> None:
    """The sinks' threads start Spark jobs with the local properties of the thread that
    called fanout (a job group, the streaming query's id), captured once per batch."""
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    fan = FanOut(f"sh{suffix}", MemoryLedger(), _sinks(url, bootstrap, suffix), retries=0)
    assert _arrow_jobs(spark, fan, 0) == 2  # batch 0: each sink its own job
    tracker, group = spark.sparkContext.statusTracker(), f"fanout-{suffix}"
    ungrouped = set(tracker.getJobIdsForGroup(None))
    with job_group(spark, group):
        assert _arrow_jobs(spark, fan, 1) == 1  # one shared job, in a sink's thread
        assert _arrow_jobs(spark, fan, 2) == 1
    assert len(tracker.getJobIdsForGroup(group)) >= 2
    assert set(tracker.getJobIdsForGroup(None)) == ungrouped  # none started without it
    _check_targets(url, bootstrap, suffix)


def test_a_shared_batch_starts_its_shuffle_before_its_job_and_scans_the_batch_once(
    spark: Any, services: tuple[str, str]
) -> None:
    """Once the group has shared a job, the shuffle its next job reads is started while the
    members prepare (from the group's last layout), as a stage of its own that the job then
    reads: the batch is scanned once, by that stage (fanout.steps.shuffle_ahead)."""
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    fan = FanOut(f"sh{suffix}", MemoryLedger(), _sinks(url, bootstrap, suffix), retries=0)
    tracker = spark.sparkContext.statusTracker()
    for batch_id in range(BATCHES):
        group = f"fanout-{suffix}-{batch_id}"
        with job_group(spark, group):
            assert _arrow_jobs(spark, fan, batch_id) == (2 if batch_id == 0 else 1)
        jobs = ended_jobs(tracker, group, 1 if batch_id == 1 else 2)
        if batch_id < 2:  # batch 0: each sink its own job; 1: the first shared, no layout yet
            assert len(jobs) == (2 if batch_id == 0 else 1)
            continue
        assert len(jobs) == 2  # the shuffle's stage, then the shared job
        (scan,) = tracker.getJobInfo(jobs[0]).stageIds
        scanned = tracker.getStageInfo(scan).numCompletedTasks
        ran = completed_tasks(tracker, jobs)
        assert ran == sorted([scanned, PARTITIONS])  # the scan once, one task a partition
    _check_targets(url, bootstrap, suffix)


def _planned(fan: FanOut, batch_id: int, planned_at: int) -> BatchInfo:
    """Batch ``batch_id`` as Spark planned it at ``planned_at`` (what the guard compares)."""
    return BatchInfo(fan.pipeline, batch_id, "q", source_offsets=[{"logOffset": batch_id}],
                     batch_timestamp_ms=planned_at)  # fmt: skip


@pytest.mark.parametrize("again", ["replayed", "planned again"])
def test_a_batch_with_nothing_to_write_cancels_the_shuffle_started_as_it_arrived(
    spark: Any, services: tuple[str, str], again: str
) -> None:
    """The shuffle of the group that read the last batch starts as the next batch arrives,
    before the guard and the plan; when nothing is to be written (a replay: every sink
    holds the batch; or a rolled-back checkpoint, which the guard refuses), its stage is
    cancelled and nothing is written again."""
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    fan = FanOut(f"sh{suffix}", MemoryLedger(), _sinks(url, bootstrap, suffix), retries=0)
    for batch_id in range(BATCHES):
        fan.process(_batch(spark, batch_id), _planned(fan, batch_id, 1000 + batch_id))
    # batch 2 again, one row of it 8 s slow to read: only a cancel ends its scan sooner
    slow = "if(order_id = 40, reflect('java.lang.Thread', 'sleep', CAST(8000 AS BIGINT)), '')"
    batch = _batch(spark, 2).selectExpr("order_id", f"concat(customer, {slow}) AS customer",
                                        "amount")  # fmt: skip
    planned_at = 1002 if again == "replayed" else 99_000  # planned again: another time
    tracker, group = spark.sparkContext.statusTracker(), f"fanout-{suffix}-again"
    with job_group(spark, group, interrupt=True):
        started = time.monotonic()
        if again == "replayed":
            assert fan.process(batch, _planned(fan, 2, planned_at)) == {}  # nothing to write
        else:
            with pytest.raises(CheckpointRollbackError):
                fan.process(batch, _planned(fan, 2, planned_at))
    wait_for(lambda: len(tracker.getJobIdsForGroup(group)) == 1, 5)
    (job,) = tracker.getJobIdsForGroup(group)  # the scan started ahead, and no job after it
    wait_for(lambda: tracker.getJobInfo(job).status == "FAILED", 5)
    assert tracker.getJobInfo(job).status == "FAILED"  # cancelled
    assert time.monotonic() - started < 6  # long before the slow row's 8 s
    _check_targets(url, bootstrap, suffix)


def test_without_sharing_each_sink_runs_its_own_job(spark: Any, services: tuple[str, str]) -> None:
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    results = Results()
    fan = FanOut(f"sh{suffix}", MemoryLedger(), _sinks(url, bootstrap, suffix), retries=0,
                 plugins=[results], share_tasks=False)  # fmt: skip
    jobs = _stream(spark, fan)
    assert jobs == [2, 2, 2]
    assert not any("shared_with" in details for details in results.done.values())
    _check_targets(url, bootstrap, suffix)


def test_a_sink_failing_in_the_shared_task_retries_alone_and_the_other_keeps_its_write(
    spark: Any, services: tuple[str, str], tmp_path: Path
) -> None:
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    results = Results()
    state = tmp_path / "veto.json"
    veto = VetoOnce(batch=1, partition=2, state=str(state), sink="pg")
    fan = FanOut(f"sh{suffix}", MemoryLedger(), _sinks(url, bootstrap, suffix), retries=1,
                 backoff_s=0.01, plugins=[results, veto])  # fmt: skip
    _stream(spark, fan)
    vetoed = json.loads(state.read_text())
    assert (vetoed["batch"], vetoed["partition"]) == (1, 2)
    # PostgreSQL's shared attempt failed (partition 2 vetoed, rolled back) and its retry
    # ran alone; Kafka's shared attempt committed every partition, once
    assert results.errors == [("pg", 1, 1)]
    assert "shared_with" not in results.done[("pg", 1)]
    assert results.done[("kafka", 1)]["shared_with"] == ["pg"]
    assert results.done[("kafka", 1)]["committed_partitions"] == [0, 1, 2, 3]
    assert results.done[("pg", 2)]["shared_with"] == ["kafka"]
    assert fan.ledger.last_committed(fan.pipeline, ["pg", "kafka"]) == {"pg": 2, "kafka": 2}
    _check_targets(url, bootstrap, suffix)


def _with_delta(sinks: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    return [*sinks, {"type": "delta", "name": "lake", "path": str(path)}]


def _check_delta(path: Path) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert Counter(r["order_id"] for r in table) == Counter(range(BATCHES * ROWS))
    assert {r["order_id"]: (r["customer"], r["amount"]) for r in table} == {
        i: (f"c{i % 3}", i * 1.5) for i in range(BATCHES * ROWS)
    }


def _version(path: Path) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(path)).version())


def test_a_delta_append_joins_the_shared_job_and_the_batch_is_not_cached(
    spark: Any, services: tuple[str, str], tmp_path: Path
) -> None:
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    results = Results()
    sinks = _with_delta(_sinks(url, bootstrap, suffix), tmp_path / "lake")
    fan = FanOut(f"sh{suffix}", MemoryLedger(), sinks, retries=0, plugins=[results])
    cached = []
    jobs = []
    for batch_id in range(BATCHES):
        with sql_plans(spark) as plans:
            jobs.append(_arrow_jobs(spark, fan, batch_id))
        cached.append(sum("InMemoryRelation" in plan for plan in plans))
    # batch 0: PostgreSQL cannot tell its partitioning yet and writes alone; Delta, taking
    # any partitioning, shares Kafka's job. From batch 1 on, one job writes all three.
    assert jobs == [2, 1, 1]
    assert cached[0] > 0 and cached[1:] == [0, 0]  # batch 0 has two readers, then one
    assert results.done[("lake", 0)]["shared_with"] == ["kafka"]
    for batch_id in (1, 2):
        assert results.done[("lake", batch_id)]["shared_with"] == ["pg", "kafka"]
        assert results.done[("pg", batch_id)]["shared_with"] == ["kafka", "lake"]
        assert results.done[("lake", batch_id)]["write_from"] == "executors"
    assert results.errors == []
    assert _version(tmp_path / "lake") == BATCHES - 1  # one commit per batch
    _check_targets(url, bootstrap, suffix)
    _check_delta(tmp_path / "lake")


def test_a_delta_append_failing_in_the_shared_task_commits_nothing_and_retries_alone(
    spark: Any, services: tuple[str, str], tmp_path: Path
) -> None:
    url, bootstrap = services
    suffix = uuid.uuid4().hex[:8]
    results = Results()
    state = tmp_path / "veto.json"
    veto = VetoOnce(batch=1, partition=2, state=str(state), sink="lake")
    sinks = _with_delta(_sinks(url, bootstrap, suffix), tmp_path / "lake")
    fan = FanOut(f"sh{suffix}", MemoryLedger(), sinks, retries=1, backoff_s=0.01,
                 plugins=[results, veto])  # fmt: skip
    _stream(spark, fan)
    assert json.loads(state.read_text())["partition"] == 2
    # Delta's files of the shared attempt were written but never committed: its retry
    # ran alone and committed batch 1 once; PostgreSQL and Kafka kept their shared write
    assert results.errors == [("lake", 1, 1)]
    assert "shared_with" not in results.done[("lake", 1)]
    assert results.done[("pg", 1)]["shared_with"] == ["kafka", "lake"]
    assert results.done[("kafka", 1)]["committed_partitions"] == [0, 1, 2, 3]
    assert fan.ledger.last_committed(fan.pipeline, ["pg", "kafka", "lake"]) == {
        "pg": 2, "kafka": 2, "lake": 2,
    }  # fmt: skip
    assert _version(tmp_path / "lake") == BATCHES - 1  # the failed attempt committed nothing
    _check_targets(url, bootstrap, suffix)
    _check_delta(tmp_path / "lake")
