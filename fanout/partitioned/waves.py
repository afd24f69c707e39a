"""A partitioned sink's job run in waves of at most ``budget`` tasks
(:attr:`fanout.contract.batch.Batch.task_budget`): a sink whose write may hang (one with
``write_timeout_s``) must not hold every core with tasks waiting on its target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fanout.contract.sessions import is_classic


@dataclass(frozen=True)
class WavesStopped:
    """The waves stopped (``stopped`` said so) after partitions ``done`` ran (none: before
    the first wave); the others of ``0..count - 1`` did not start."""

    done: list[int]
    count: int

    @property
    def left(self) -> list[int]:
        """The partitions not started."""
        return list(range(len(self.done), self.count))


def collect_in_waves(
    job: Any, budget: int | None, stopped: Callable[[], bool] | None = None
) -> list[Any] | WavesStopped:
    """``job.collect()``, as Spark jobs over at most ``budget`` of its partitions each, one
    after the other (each over a range of partitions: the shuffle that builds them runs
    once, in the first, when ``job`` was planned without adaptive execution, as
    :meth:`~fanout.partitioned.sink.PartitionedSink.run_partitions` plans it; under
    adaptive execution taking ``job.rdd`` runs the shuffle itself, with every core and
    before ``stopped`` is asked). Spark gives a core back only when a task ends,
    and no scheduler setting caps one job's running tasks (FAIR pools share the cores as
    tasks end, they take none back), so the job's shape is the cap. One job when the
    budget is ``None`` or covers every partition, or under Spark Connect (no
    RDD to run a job over a range of). No wave starts once ``stopped()`` says so (the
    write was abandoned: cancelling its jobs reaches only those running, not the next
    wave's): :class:`WavesStopped` instead of the rows."""
    if budget is None or not is_classic(job):
        return list(job.collect())
    rdd = job.rdd
    count = rdd.getNumPartitions()
    if stopped is not None and stopped():  # abandoned before its first job (in the sink's
        return WavesStopped([], count)  # Python, which no cancel reaches): none starts
    if count <= budget:
        return list(job.collect())
    rows: list[Any] = []
    for start in range(0, count, budget):
        if start and stopped is not None and stopped():
            return WavesStopped(list(range(start)), count)
        rows.extend(_run_job(rdd, list(range(start, min(start + budget, count)))))
    return rows


def _run_job(rdd: Any, partitions: list[int]) -> list[Any]:
    """The rows of ``partitions`` of ``rdd`` (a DataFrame's), in one Spark job: what
    ``RDD.collect`` does, over those partitions only. Not ``SparkContext.runJob``, whose
    function runs in a second Python worker beside each task's (and prints an
    ``EOFError`` when a cancelled task's workers are killed)."""
    from pyspark.util import _load_from_socket

    context = rdd.context
    found = context._jvm.PythonRDD.runJob(context._jsc.sc(), rdd._jrdd, partitions)
    with _load_from_socket(found, rdd._jrdd_deserializer) as stream:
        return list(stream)
