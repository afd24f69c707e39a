"""The executor side of a partitioned sink: the function Spark runs for every partition
(``mapInArrow``), the writer it hands the partition to, and the per-partition commit hooks.

A :class:`PartitionWriter` is configuration only (it is pickled to the executors); it opens
its connection or producer inside :meth:`PartitionWriter.write_partition`, writes the
partition in one transaction, calls :meth:`CommitHooks.before` just before committing and
:meth:`CommitHooks.after` right after, and returns a :class:`PartitionOutcome`. What it
raises (a commit hook's veto included) becomes a failed outcome, transient for a
:class:`fanout.TransientSinkError`; a writer that can classify its target's errors better
returns the failed outcome itself, so the driver sees every partition's fate.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fanout.contract.partitions import PartitionCommit
from fanout.partitioned.input_end import whole_input
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.outcome import PartitionFailure, PartitionOutcome
from fanout.partitioned.worker_gc import freeze_long_lived_objects

if TYPE_CHECKING:
    import pyarrow as pa

HOOKS = ("fanout_partition_commit", "fanout_partition_committed")


class PartitionWriter(Protocol):
    """Writes one partition of one batch to the target (see the module docstring)."""

    def write_partition(
        self,
        partition: int,
        batches: Iterator[pa.RecordBatch],
        hooks: CommitHooks,
        digest: MemberDigest,
    ) -> PartitionOutcome:
        """Write ``batches`` (the partition's rows, Arrow) in one transaction.

        :param digest: the partition's membership digest, final once ``batches`` are
            consumed; a sink that skips committed partitions on a replay commits it with
            the partition (:mod:`fanout.partitioned.membership`).
        """
        ...


@dataclass(frozen=True)
class CommitHooks:
    """Calls the per-partition commit hooks, on the executor.

    :param plugins: the picklable plugin objects implementing them (from
        ``FanOut(plugins=...)``); installed entry-point plugins are loaded on the executor
        too when ``entry_points`` is set (the driver found one implementing them).
    """

    pipeline: str
    sink: str
    batch_id: int
    epoch: int = 0
    plugins: Sequence[object] = ()
    entry_points: bool = False
    _manager: list[Any] = field(default_factory=list, compare=False, repr=False)

    @property
    def wanted(self) -> bool:
        """Whether any plugin implements a partition hook."""
        return bool(self.plugins) or self.entry_points

    def before(self, partition: int, rows: int, written: int) -> None:
        """``fanout_partition_commit``: just before the partition commits; what a hook
        raises aborts the partition (a :class:`fanout.TransientSinkError` lets the batch
        replay)."""
        if self.wanted:
            self._hook().fanout_partition_commit(commit=self._commit(partition, rows, written))

    def after(self, partition: int, rows: int, written: int) -> None:
        """``fanout_partition_committed``: right after the partition committed; what a
        hook raises is printed and ignored (the partition is committed)."""
        if not self.wanted:
            return
        try:
            self._hook().fanout_partition_committed(commit=self._commit(partition, rows, written))
        except Exception as exc:
            print(f"fanout: fanout_partition_committed raised {exc!r}", file=sys.stderr)

    def _commit(self, partition: int, rows: int, written: int) -> PartitionCommit:
        return PartitionCommit(
            self.pipeline, self.sink, self.batch_id, partition, rows, written, self.epoch
        )

    def _hook(self) -> Any:
        if not self._manager:
            from fanout.hooks.registry import load_registry

            if self.entry_points:
                registry = load_registry(self.plugins)
            else:
                registry = load_registry(self.plugins, entry_points_=[])
            self._manager.append(registry.manager)
        return self._manager[0].hook


def failed_outcome(partition: int, exc: BaseException) -> PartitionOutcome:
    """The outcome of a partition whose writer raised: transient for a
    :class:`fanout.TransientSinkError` (the batch may replay), else an error."""
    from fanout.errors import TransientSinkError

    transient = isinstance(exc, TransientSinkError)
    failure = PartitionFailure(
        "transient" if transient else "error", f"{type(exc).__name__}: {exc}", transient
    )
    return PartitionOutcome(partition, "failed", failure=failure)


def implements_partition_hooks(plugin: object) -> bool:
    """Whether ``plugin`` implements a per-partition commit hook."""
    return any(callable(getattr(plugin, name, None)) for name in HOOKS)


@dataclass(frozen=True)
class HookPlugins:
    """Who implements the per-partition commit hooks, found on the driver at ``open``:
    what a sink ships with its partition tasks to build their :class:`CommitHooks`.

    :param plugins: the picklable ``FanOut(plugins=...)`` objects implementing one.
    :param entry_points: an installed entry-point plugin implements one (the executors
        load them too).
    """

    plugins: tuple[object, ...] = ()
    entry_points: bool = False

    @classmethod
    def of(cls, plugins: Sequence[object]) -> HookPlugins:
        """The hook implementers among ``plugins`` and the installed plugins."""
        from fanout.hooks.registry import load_registry

        installed = load_registry().manager.hook
        return cls(
            tuple(p for p in plugins if implements_partition_hooks(p)),
            any(getattr(installed, name).get_hookimpls() for name in HOOKS),
        )

    def hooks(self, pipeline: str, sink: str, batch_id: int, epoch: int = 0) -> CommitHooks:
        """The commit hooks of one sink's batch."""
        return CommitHooks(pipeline, sink, batch_id, epoch, self.plugins, self.entry_points)


@dataclass(frozen=True)
class PartitionTask:
    """What Spark runs for each partition (``mapInArrow``): hands the partition to the
    writer and yields its outcome as one result row."""

    writer: PartitionWriter
    hooks: CommitHooks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Write this task's partition (its index is the Spark partition id); an input
        the JVM cut short fails it (:func:`fanout.partitioned.input_end.whole_input`)."""
        import pyarrow as pa

        partition = task_partition()
        outcome = self.outcome(partition, whole_input(batches))
        freeze_long_lived_objects()  # once per worker: see fanout.partitioned.worker_gc
        yield pa.RecordBatch.from_pydict(
            {"partition": [partition], "outcome": [outcome.to_json()]},
            schema=pa.schema([("partition", pa.int32()), ("outcome", pa.string())]),
        )

    def outcome(self, partition: int, batches: Iterator[pa.RecordBatch]) -> PartitionOutcome:
        """Hand ``batches`` to the writer as ``partition``; what it raises (a commit
        hook's veto included) becomes a failed outcome."""
        digest = MemberDigest()
        try:
            return self.writer.write_partition(partition, digest.strip(batches), self.hooks, digest)
        except Exception as exc:  # a writer's own error, or a commit hook's veto
            return failed_outcome(partition, exc)

    def run(self, partition: int, batches: Iterator[pa.RecordBatch]) -> str:
        """:meth:`outcome` as text: this task's part of a shared task
        (:class:`fanout.contract.sharing.SharedTask`)."""
        return self.outcome(partition, batches).to_json()

    def failed(self, partition: int, error: BaseException) -> str:
        """The failed outcome of ``partition``, as text."""
        return failed_outcome(partition, error).to_json()


def task_partition() -> int:
    """The Spark partition id of the running task (0 outside a Spark task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0
