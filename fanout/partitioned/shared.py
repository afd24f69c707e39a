"""One Spark task writing the same partition for several sinks.

Sinks writing from the executors would each read the batch in their own job: each read
converts every row to Arrow in the JVM and ships it to a Python worker, once per sink. A
shared task reads the partition once and hands each batch of rows to every sink's task
(:class:`fanout.contract.sharing.SharedTask`), each in its own thread with its own
transaction, so the conversion and the shipping happen once for all of them
(:mod:`fanout.steps.share` decides who shares).

Every writer sees exactly the rows it would see alone, under its own column names, in the
same partition (the same hash of the same values, for sinks that hash), and commits on its
own: what one writer raises becomes its own failed outcome, and the others go on. A writer
that stops reading early (a partition it skips as committed) is no longer fed. A failure to
read the input reaches every writer still reading, as it would reach each alone, so none
commits a part of its partition; so does an input the JVM cut short, which would otherwise
end like a whole one (:mod:`fanout.partitioned.input_end`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.partitioned.input_end import whole_input
from fanout.partitioned.membership import MEMBER_COLUMN
from fanout.partitioned.task import task_partition
from fanout.partitioned.worker_gc import freeze_long_lived_objects

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.sharing import SharedTask

SHARED_RESULT_DDL = "member INT, partition INT, outcome STRING"
"""The shared job's result schema (Spark DDL): one row per sink and partition."""

FEED_DEPTH = 2
"""Batches waiting for a writer that is slower than the others (bounds the task's memory
to a few Arrow batches per sink)."""


@dataclass(frozen=True)
class SharedMember:
    """One sink's part of a shared task.

    :param task: what the task runs for this sink (a kit sink's partition task, the
        Delta append's file writer).
    :param columns: ``(shared column, sink's column)`` pairs, in the order of the sink's
        own input.
    :param membership: whether the sink's writer receives the member column.
    """

    task: SharedTask
    columns: tuple[tuple[str, str], ...]
    membership: bool

    def view(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` as the sink's own input: its columns, under its names, with their
        Arrow fields (types, nullability, metadata) kept."""
        import pyarrow as pa

        pairs = list(self.columns)
        if self.membership:
            pairs.append((MEMBER_COLUMN, MEMBER_COLUMN))
        fields = [batch.schema.field(source).with_name(name) for source, name in pairs]
        arrays = [batch.column(source) for source, _ in pairs]
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class _End:
    """The input ended; ``error`` when reading it failed."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class Feed:
    """One writer's input: a short queue the task fills and the writer's thread drains.
    Once the writer is done (it returned, or raised), puts are dropped."""

    def __init__(self, depth: int = FEED_DEPTH) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.done = threading.Event()

    def put(self, item: Any) -> None:
        """Queue ``item``, waiting while the queue is full and the writer still reads."""
        while not self.done.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def end(self, error: BaseException | None = None) -> None:
        """No more batches: the writer's iterator ends (raises ``error`` when given)."""
        self.put(_End(error))

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item


@dataclass(frozen=True)
class SharedPartitionTask:
    """What Spark runs for each partition of a shared job (``mapInArrow``): every member's
    task on this partition, each in a thread; yields one result row per member."""

    members: tuple[SharedMember, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Write this task's partition for every member; an input the JVM cut short
        fails it for all (:func:`fanout.partitioned.input_end.whole_input`)."""
        import pyarrow as pa

        partition = task_partition()
        outcomes = self.outcomes(partition, whole_input(batches))
        freeze_long_lived_objects()  # once per worker: see fanout.partitioned.worker_gc
        yield pa.RecordBatch.from_pydict(
            {
                "member": list(range(len(outcomes))),
                "partition": [partition] * len(outcomes),
                "outcome": outcomes,
            },
            schema=pa.schema(
                [("member", pa.int32()), ("partition", pa.int32()), ("outcome", pa.string())]
            ),
        )

    def outcomes(self, partition: int, batches: Iterator[pa.RecordBatch]) -> list[str]:
        """Each member's outcome text for ``partition``, in member order."""
        feeds = [Feed() for _ in self.members]
        found: list[str | None] = [None] * len(self.members)

        def write(index: int) -> None:
            member, feed = self.members[index], feeds[index]
            try:
                found[index] = member.task.run(partition, (member.view(b) for b in feed))
            except BaseException as exc:  # the thread's end is the member's outcome
                found[index] = member.task.failed(partition, exc)
            finally:
                feed.done.set()

        threads = [
            threading.Thread(target=write, args=(i,), name=f"fanout-shared-p{partition}-{i}")
            for i in range(len(self.members))
        ]
        for thread in threads:
            thread.start()
        error: BaseException | None = None
        try:
            for batch in batches:
                for feed in feeds:
                    feed.put(batch)
        except BaseException as exc:  # the input failed: no writer may commit a part
            error = exc
        for feed in feeds:
            feed.end(error)
        for thread in threads:
            thread.join()
        if error is not None:
            raise error
        lost = RuntimeError("the writer's thread ended without an outcome")
        return [
            text if text is not None else member.task.failed(partition, lost)
            for member, text in zip(self.members, found, strict=True)
        ]


def member_outcomes(rows: Sequence[Any], members: int) -> list[list[str]]:
    """The shared job's result rows, split by member: each member's outcome texts in
    partition order."""
    split: list[list[tuple[int, str]]] = [[] for _ in range(members)]
    for row in rows:
        split[int(row["member"])].append((int(row["partition"]), row["outcome"]))
    return [[text for _, text in sorted(outcomes)] for outcomes in split]
