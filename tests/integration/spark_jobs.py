"""What Spark's status tracker says of a job group's jobs, for tests counting them. The
tracker hears of jobs through Spark's listener bus, a moment after they start or end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def job_group(spark: Any, group: str, *, interrupt: bool = False) -> Iterator[None]:
    """This thread's jobs in ``group`` for the block. ``interrupt``: cancelling them
    interrupts their tasks, so a task cancelled while it sleeps frees its slot at once for
    the tests after it, instead of when the sleep ends."""
    context = spark.sparkContext
    context.setJobGroup(group, "a test's jobs", interruptOnCancel=interrupt)
    try:
        yield
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.interruptOnCancel", None)


@contextmanager
def sql_plans(spark: Any) -> Iterator[list[str]]:
    """The physical plans of the SQL executions the block started, in the list yielded
    (filled when the block ends). Spark's status store keeps only the newest
    ``spark.sql.ui.retainedExecutions`` (1000) executions, so a test process past that many
    cannot count by the list's size: the executions are told apart by their ids."""
    store = spark._jsparkSession.sharedState().statusStore()
    before = _newest_execution_id(store)
    plans: list[str] = []
    yield plans
    executions = store.executionsList()
    for i in range(executions.size()):
        execution = executions.apply(i)
        if execution.executionId() > before:
            plans.append(execution.physicalPlanDescription())


def _newest_execution_id(store: Any) -> int:
    executions = store.executionsList()
    return max((executions.apply(i).executionId() for i in range(executions.size())), default=-1)


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> None:
    """Poll ``condition`` until it holds or ``seconds`` pass (the caller then asserts)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def ended_jobs(tracker: Any, group: str, jobs: int) -> list[int]:
    """The ids of ``group``'s jobs, once the tracker has heard of ``jobs`` of them, each
    ended (or after 10 s, whatever it has then), in the order they started."""

    def ended() -> bool:
        found = tracker.getJobIdsForGroup(group)
        return len(found) == jobs and all(
            tracker.getJobInfo(j).status in ("SUCCEEDED", "FAILED") for j in found
        )

    wait_for(ended)
    return sorted(tracker.getJobIdsForGroup(group))


def completed_tasks(tracker: Any, jobs: list[int]) -> list[int]:
    """Each stage's completed tasks over ``jobs`` (a stage two jobs share counted once; a
    stage skipped, its shuffle already written, left out), sorted."""
    stages = {s for j in jobs for s in tracker.getJobInfo(j).stageIds}
    infos = [tracker.getStageInfo(s) for s in stages]
    return sorted(info.numCompletedTasks for info in infos if info and info.numCompletedTasks)
