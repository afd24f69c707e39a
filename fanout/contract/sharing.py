"""Shared tasks in the sink contract: how a sink writes its first attempt at a batch in
Spark tasks shared with other sinks (docs/architecture.md §3.4).

Sinks written from the executors would each read the batch in a Spark job of their own.
A sink that can instead take its rows from a task that also feeds other sinks says so
(:meth:`shares_tasks`) and, per batch, hands fanout a :class:`SharedWrite`: what it
prepared on the driver (its checks and refusals come before any write), the picklable
:class:`SharedTask` a shared job runs for it on every partition, and how it finishes on the
driver once the job has reported. fanout runs one job for the sinks that fit together
(:mod:`fanout.steps.share`); a sink whose rows must land in particular partitions says how
(:class:`SharedShape`), a sink that takes any partitioning says ``"any"``.

The built-in sinks implement it: PostgreSQL and Kafka through the partitioned-sink kit, the
Delta sink for its append from the executors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from fanout.contract.partitions import BatchPartitioning
from fanout.contract.sink import SinkResult

if TYPE_CHECKING:
    import pyarrow as pa

ANY_PARTITIONING = BatchPartitioning(0, ())
"""What :meth:`fanout.Sink.batch_partitioning` of a sink sharing tasks returns when it
writes the rows in whatever partitions the shared job has (a Delta append: each task
writes its own files). It joins a group of sinks hashing alike, and is never used to
partition the batch."""


@dataclass(frozen=True)
class SharedShape:
    """How a sink's rows must be partitioned: Spark's ``repartition(partitions, *by)``,
    then ``sortWithinPartitions(*sort)``, in the batch's column names."""

    partitions: int
    by: tuple[str, ...]
    sort: tuple[str, ...] = ()


class SharedTask(Protocol):
    """What a shared job's task runs for one sink (pickled to the executors)."""

    def run(self, partition: int, batches: Iterator[pa.RecordBatch]) -> str:
        """Write ``partition``'s rows (the sink's own columns, under its names) and return
        the outcome as text for the driver (:attr:`SharedWrite.finish` reads it). Never
        raise: a failure is an outcome, so the other sinks of the task go on."""
        ...

    def failed(self, partition: int, error: BaseException) -> str:
        """The outcome text of ``partition`` when writing it raised ``error`` anyway."""
        ...


@dataclass(frozen=True)
class SharedWrite:
    """A sink's first attempt at a batch, prepared on the driver for a shared job.

    :param task: what each task of the shared job runs for this sink (``None`` only with
        ``shape=None``).
    :param columns: ``(batch column, sink's column)`` pairs: the sink's input, in order.
    :param shape: how the rows must be partitioned; ``"any"`` for any partitioning;
        ``None`` when this batch cannot be shared (:attr:`alone` writes it).
    :param finish: on the driver, the tasks' outcome texts (in partition order) to the
        sink's result; raises the sink's error.
    :param alone: writes the prepared batch in a job of the sink's own.
    :param membership: whether the task's input carries the member column
        (:mod:`fanout.partitioned.membership`).
    """

    task: SharedTask | None
    columns: tuple[tuple[str, str], ...]
    shape: SharedShape | Literal["any"] | None
    finish: Callable[[Sequence[str]], SinkResult]
    alone: Callable[[], SinkResult]
    membership: bool = False
