"""The cores a sink with ``write_timeout_s`` may hold (fanout.steps.cores): its task
budget from the session's cores, and the warning before the stream starts when the timed
sinks writing from the executors can still hold every core."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace
from typing import Any

import pytest
from fanout_kafka.sink import KafkaSink
from fanout_postgres.sink import PostgresSink

from fanout.sink_spec import LagPolicy, SinkSpec
from fanout.steps.cores import check_cores, spark_cores, task_budget


def _session(master: str, parallelism: int = 8, slots: int = 0) -> Any:
    """A classic session on ``master`` whose executors registered now run ``slots`` tasks
    at once (what Spark's scheduler answers ``maxNumConcurrentTasks``)."""
    profile = object()
    scheduler = SimpleNamespace(
        resourceProfileManager=lambda: SimpleNamespace(defaultResourceProfile=lambda: profile),
        maxNumConcurrentTasks=lambda asked: slots if asked is profile else -1,
    )
    context = SimpleNamespace(
        master=master, defaultParallelism=parallelism, _jsc=SimpleNamespace(sc=lambda: scheduler)
    )
    return SimpleNamespace(sparkContext=context)


class ConnectSession:
    """Stands for a Spark Connect session (told by its module)."""


ConnectSession.__module__ = "pyspark.sql.connect.session"


@pytest.mark.parametrize(
    ("master", "cores", "budget"),
    [
        ("local[2]", 2, 1),
        ("local[8]", 8, 7),
        ("local", 1, 1),
        ("local[3,2]", 3, 2),
        ("local[*]", os.cpu_count(), max(1, (os.cpu_count() or 1) - 1)),
        ("local-cluster[2,1,1024]", 2, 1),
        ("spark://host:7077", 8, 7),  # a cluster with no executor yet: default parallelism
    ],
)
def test_a_timed_sinks_budget_is_every_core_but_one(master: str, cores: int, budget: int) -> None:
    assert spark_cores(_session(master)) == cores
    assert task_budget(_session(master)) == budget


@pytest.mark.parametrize(
    ("parallelism", "slots", "cores"),
    [
        (200, 4, 4),  # spark.default.parallelism set above the cores
        (2, 12, 12),  # dynamic allocation: executors added since the default was fixed
        (8, 0, 8),  # no executor registered yet
    ],
)
def test_a_clusters_cores_are_its_executors_task_slots(
    parallelism: int, slots: int, cores: int
) -> None:
    for master in ("spark://host:7077", "yarn", "k8s://https://host:443"):
        assert spark_cores(_session(master, parallelism, slots)) == cores
        assert spark_cores(_session("local[2]", parallelism, slots)) == 2  # read from the master


def test_a_cluster_that_refuses_the_schedulers_count_still_gets_a_budget() -> None:
    """SparkContext.maxNumConcurrentTasks is private[spark]: a py4j security manager (a
    Databricks cluster with table access control: "Method public int org.apache.spark.
    SparkContext.maxNumConcurrentTasks() is not whitelisted") or a vendor's Spark without
    it refuses the call. The budget then comes from the default parallelism, as before
    the scheduler was asked, not from nowhere (no budget: a hung write holds every core)."""

    def refused(profile: object) -> int:
        raise RuntimeError("py4j.security.Py4JSecurityException: not whitelisted")

    session = _session("spark://host:7077", parallelism=8)
    session.sparkContext._jsc.sc().maxNumConcurrentTasks = refused
    assert spark_cores(session) == 8
    assert task_budget(session) == 7


def test_without_a_classic_session_there_is_no_budget() -> None:
    assert task_budget(None) is None
    assert task_budget(ConnectSession()) is None


def _pg(name: str, partitions: int, timeout: float | None = 20) -> SinkSpec:
    sink = PostgresSink(name, url="postgresql://u:secret@h/db", table="t", partitions=partitions)
    return SinkSpec(sink, lag=LagPolicy("lag", write_timeout_s=timeout))


def _kafka(name: str, partitions: int) -> SinkSpec:
    sink = KafkaSink(name, bootstrap_servers="h:9092", topic="t", partitions=partitions)
    return SinkSpec(sink, lag=LagPolicy("lag", write_timeout_s=20))


def _warnings(caplog: pytest.LogCaptureFixture, specs: list[SinkSpec], spark: Any) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fanout"):
        check_cores("p", {s.name: s for s in specs}, spark)
    return [r.getMessage() for r in caplog.records]


def test_one_timed_sink_leaves_a_core_and_is_not_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _warnings(caplog, [_pg("pg", 4)], _session("local[2]")) == []
    untimed = [_pg("pg", 4, None), _pg("pg2", 4, None)]
    assert _warnings(caplog, untimed, _session("local[2]")) == []
    assert _warnings(caplog, [_pg("pg", 4), _kafka("bus", 3)], _session("local[8]")) == []


def test_timed_sinks_that_can_hold_every_core_together_are_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said = _warnings(caplog, [_pg("pg", 2), _kafka("bus", 4)], _session("local[2]"))
    assert said == [
        "pipeline p: sinks 'pg' (2 partitions), 'bus' (4 partitions) have write_timeout_s "
        "and write from the executors, each at most 1 tasks at once: hung together (a "
        "locked table, a stalled broker) they can hold all 2 cores until their "
        "write_timeout_s, and the other sinks' jobs wait for them; give the query more "
        "cores, or fewer such sinks"
    ]


def test_under_spark_connect_a_timed_executor_sink_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said = _warnings(caplog, [_pg("pg", 4)], ConnectSession())
    assert said == [
        "pipeline p: under Spark Connect fanout cannot cap how many tasks of sinks 'pg' (4 "
        "partitions) run at once: while one hangs (a locked table, a stalled broker) its "
        "tasks hold up to that many executor cores until its write_timeout_s, and the other "
        "sinks' jobs wait for them; give those sinks fewer partitions than the cluster's "
        "cores"
    ]


def test_an_abandoned_write_runs_until_its_cancelled_tasks_have_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its cancelled job fails on the driver seconds before Spark kills its stuck Python
    tasks: until then they hold their cores, and the catch-up's next write of the sink
    must not take more beside them."""
    import threading
    from types import SimpleNamespace

    import fanout.steps.timeout as timeout_module
    from fanout.steps.timeout import AbandonedWrites, TimedWrite, WriteClaim

    still = [2, 1, 0]  # the tasks of the write's tag the status tracker reports, in turn
    asked: list[str] = []

    def running(session: Any, tag: str) -> int:
        asked.append(tag)
        return still.pop(0) if still else 0

    monkeypatch.setattr(timeout_module, "running_tasks", running)
    released = threading.Event()

    class Runner:
        sink = SimpleNamespace(name="pg")
        batch = SimpleNamespace(
            pipeline="p", batch_id=4, info=SimpleNamespace(epoch=0), df=None, _arrow=None
        )
        claim: WriteClaim | None = None
        attempt = 1

        def run(self) -> Any:
            released.wait(10)
            raise RuntimeError("job cancelled")

        def timed_out(self, error: Exception) -> None:
            pass

    abandoned = AbandonedWrites("p")
    timed = TimedWrite.start(Runner(), 30.0, abandoned, lambda fn: fn)  # type: ignore[arg-type]
    assert timed.give_up() is not None
    assert abandoned.running("pg") is not None
    released.set()  # the cancelled job failed on the driver
    assert timed.done.wait(5)
    assert asked == [timed.tag] * 3 and still == []  # done once the tracker said 0
    assert abandoned.running("pg") is None
