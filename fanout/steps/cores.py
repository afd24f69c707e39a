"""The executor cores a sink with ``write_timeout_s`` may hold (docs/architecture.md §14.9):
its tasks, hung on its target, keep their cores until its timeout and a few seconds more,
and Spark takes no core back from a running task.

So a timed sink's write is given a task budget (:attr:`fanout.contract.batch.Batch.
task_budget`: every core but one), which the partitioned-sink kit honours by running its
partitions in jobs of that many tasks at most; an abandoned write counts as running until
its tasks have ended (:func:`running_tasks`); and :func:`check_cores` warns before the
stream starts when the timed sinks can still hold every core.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from fanout.contract.sessions import LOCAL_CLUSTER, is_connect
from fanout.observe.logs import batch_fields
from fanout.partitioned.sink import PartitionedSink
from fanout.sink_spec import SinkSpec, write_timeout

log = logging.getLogger("fanout")

TASKS_END_S = 30.0
"""How long an abandoned write waits for its cancelled tasks to end before it counts as
ended (Spark kills a stuck Python task's worker ``spark.python.task.killTimeout``, 2 s,
after the cancel)."""


def task_budget(session: Any) -> int | None:
    """How many Spark tasks a timed sink's write may run at once: every core but one, at
    least one; ``None`` when the cores cannot be told (Spark Connect, no session)."""
    cores = spark_cores(session)
    return None if cores is None else _budget(cores)


def _budget(cores: int) -> int:
    """Every core but one, at least one."""
    return max(1, cores - 1)


def spark_cores(session: Any) -> int | None:
    """The task slots of a classic session: ``N`` of ``local[N]`` (``local[*]``: this
    machine's CPUs), ``N * C`` of ``local-cluster[N,C,M]``, else those of the executors
    registered now (:func:`_cluster_slots`), or, before any has (or when the scheduler
    refuses the question), Spark's default parallelism; ``None`` without a SparkContext."""
    if session is None or is_connect(session):
        return None
    try:
        context = session.sparkContext
        master = str(context.master)
        found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
        if found:
            given = found.group(1) or "1"
            return (os.cpu_count() or 1) if given == "*" else int(given)
        found = LOCAL_CLUSTER.fullmatch(master.strip())
        if found:
            return int(found.group(1)) * int(found.group(2))
        return _cluster_slots(context) or int(context.defaultParallelism)
    except Exception:  # a stopped session: no budget, the write fails on its own
        return None


def _cluster_slots(context: Any) -> int:
    """How many tasks the executors registered now can run at once (their cores over
    ``spark.task.cpus``; the scheduler's own count, four py4j round trips, ~1 ms): under
    dynamic allocation they change, and ``spark.default.parallelism`` may be set to
    anything. 0 when none is registered yet, or when the scheduler cannot be asked."""
    try:
        scheduler = context._jsc.sc()
        profile = scheduler.resourceProfileManager().defaultResourceProfile()
        return int(scheduler.maxNumConcurrentTasks(profile))
    except Exception:
        # private[spark]: a py4j security manager (Databricks' table access control) or
        # a vendor's Spark may refuse it; the default parallelism still bounds the write
        return 0


def running_tasks(session: Any, tag: str) -> int:
    """How many tasks of the jobs run under job tag ``tag`` are still running, cancelled or
    not (Spark's status tracker; 0 when it cannot be asked: Spark Connect, no session)."""
    if session is None or is_connect(session):
        return 0
    try:
        tracker = session.sparkContext._jsc.sc().statusTracker()
        running = 0
        for job in tracker.getJobIdsForTag(tag):
            info = tracker.getJobInfo(job)
            for stage in [] if info.isEmpty() else info.get().stageIds():
                found = tracker.getStageInfo(stage)
                running += 0 if found.isEmpty() else found.get().numActiveTasks()
        return running
    except Exception:  # a stopped session: its tasks are gone
        return 0


def check_cores(pipeline: str, specs: Mapping[str, SinkSpec], spark: Any) -> None:
    """Warn, before the stream starts, when the sinks with ``write_timeout_s`` that write
    from the executors can hold every core while they hang: under Spark Connect (their
    tasks cannot be capped), or when their task budgets together reach the cores."""
    timed = {
        name: spec.sink.partitions
        for name, spec in specs.items()
        if write_timeout(spec) is not None and isinstance(spec.sink, PartitionedSink)
    }  # fmt: skip
    if not timed or spark is None:
        return
    named = ", ".join(f"{name!r} ({n} partitions)" for name, n in timed.items())
    cores = spark_cores(spark)
    if cores is None:
        said = (
            f"under Spark Connect fanout cannot cap how many tasks of sinks {named} run at "
            "once: while one hangs (a locked table, a stalled broker) its tasks hold up to "
            "that many executor cores until its write_timeout_s, and the other sinks' jobs "
            "wait for them; give those sinks fewer partitions than the cluster's cores"
        )
    else:
        budget = _budget(cores)
        held = sum(min(n, budget) for n in timed.values())
        if held < cores:
            return
        said = (
            f"sinks {named} have write_timeout_s and write from the executors, each at most "
            f"{budget} tasks at once: hung together (a locked table, a stalled broker) they "
            f"can hold all {cores} cores until their write_timeout_s, and the other sinks' "
            "jobs wait for them; give the query more cores, or fewer such sinks"
        )
    log.warning("pipeline %s: %s", pipeline, said, extra=batch_fields(pipeline))
