"""Step 4, with the partitioning: which pending sinks write their partitions in one shared
Spark task (docs/architecture.md §3.4), and step 5's first attempt of those sinks.

Sinks of the partitioned-sink kit that hash the batch alike (the same columns, the same
count: a PostgreSQL table and a Kafka topic keyed by ``order_id``, 4 partitions each) would
each read the batch in a job of their own, converting every row to Arrow once per sink. A
:class:`SharedPass` prepares each of them on the driver as its own write would (preflight,
determinism and membership checks, which still refuse a sink before any of its partitions
is written), then runs one job whose tasks hand every partition to each sink's writer
(:mod:`fanout.partitioned.shared`), and gives each sink its own result or error.

Only the first attempt is shared: a sink that failed retries alone, as it would without
sharing. A sink joins only when it is written by the kit's own ``write`` (a subclass that
overrides it is not bypassed), says it may (:meth:`~fanout.partitioned.sink.
PartitionedSink.shares_tasks`: its input is the batch's own columns, renamed or not), and
reads the batch through a route that keeps it whole. Where a row lands is the same hash
of the same values either way, so a partition committed in a shared task and one replayed
alone hold the same rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fanout.contract.partitions import BatchPartitioning
from fanout.contract.sessions import plan_without_adaptive
from fanout.contract.sink import SinkResult
from fanout.partitioned.membership import quoted, with_member_column
from fanout.partitioned.shared import (
    SHARED_RESULT_DDL,
    SharedMember,
    SharedPartitionTask,
    member_outcomes,
)
from fanout.partitioned.sink import PartitionedSink, PreparedPartitions
from fanout.sink_spec import SinkSpec
from fanout.steps.partition import most_common, reported_partitioning, usable
from fanout.steps.state import BatchState

if TYPE_CHECKING:
    from fanout.contract.batch import Batch

log = logging.getLogger("fanout")


def shares_tasks(spec: SinkSpec) -> bool:
    """Whether a sink may write its partitions in a task shared with other sinks."""
    sink = spec.sink
    return (
        isinstance(sink, PartitionedSink)
        and type(sink).write is PartitionedSink.write
        and sink.shares_tasks()
        and sink.reads == "dataframe"
        and spec.route.is_identity
    )


def group_shared_tasks(
    state: BatchState, specs: Mapping[str, SinkSpec], parallelism: int | None = None
) -> None:
    """Fill ``state.share_groups`` (:func:`share_groups`); call it before persisting, which
    counts each group as one reader. A group larger than ``parallelism`` (how many sinks
    may write at once) is not formed: its shared job would write them all at once."""
    candidates = [name for name in state.pending if shares_tasks(specs[name])]
    if len(candidates) >= 2 and hasattr(state.df, "mapInArrow"):
        groups = share_groups(candidates, specs, state.df.schema)
        state.share_groups = [g for g in groups if parallelism is None or len(g) <= parallelism]


def share_groups(
    pending: Sequence[str], specs: Mapping[str, SinkSpec], schema: Any
) -> list[tuple[str, ...]]:
    """The pending sinks that may share tasks, grouped by the partitioning they report
    (:meth:`fanout.Sink.batch_partitioning`); groups of two or more, in configuration
    order. No I/O: a sink that cannot tell yet (PostgreSQL before its first batch) writes
    alone."""
    found: dict[BatchPartitioning, list[str]] = {}
    for name in pending:
        if not shares_tasks(specs[name]):
            continue
        partitioning = reported_partitioning(specs[name], schema)
        if partitioning is not None and usable(partitioning):
            found.setdefault(partitioning, []).append(name)
    return [tuple(names) for names in found.values() if len(names) >= 2]


@dataclass(frozen=True)
class _Alone:
    """A member prepared but not shared (its partitioning differs from the group's): it
    runs its own job in its own thread."""

    prepared: PreparedPartitions


@dataclass(frozen=True)
class _Shape:
    """What sharing requires to be equal: the partition count, the hashed columns and the
    sort, in the batch's column names."""

    partitions: int
    by: tuple[str, ...]
    sort: tuple[str, ...]


class SharedPass:
    """The first attempt of a group of sinks, written by one shared job.

    :param df: the batch DataFrame every member reads (an identity route).
    :param members: each member's sink and batch (attempt 1), in configuration order.
    """

    def __init__(self, df: Any, members: Mapping[str, tuple[PartitionedSink, Batch]]) -> None:
        self.df = df
        self.members = dict(members)
        self._lock = threading.Lock()
        self._results: dict[str, SinkResult | BaseException | _Alone] | None = None

    def write(self, name: str) -> SinkResult:
        """Member ``name``'s result: the first member to ask runs the shared job for all
        (the others wait for it); raises the member's own error."""
        with self._lock:
            if self._results is None:
                try:
                    self._results = self._run()
                except Exception as exc:  # planning the job failed: every member's attempt
                    self._results = dict.fromkeys(self.members, exc)
        result = self._results[name]
        if isinstance(result, BaseException):
            raise result
        if isinstance(result, _Alone):
            sink, batch = self.members[name]
            return sink.finish_partitions(
                batch, result.prepared, sink.run_partitions(result.prepared)
            )
        return result

    def _run(self) -> dict[str, SinkResult | BaseException | _Alone]:
        results: dict[str, SinkResult | BaseException | _Alone] = {}
        prepared: dict[str, PreparedPartitions] = {}
        for name, (sink, batch) in self.members.items():
            try:
                prepared[name] = sink.prepare_partitions(batch)
            except Exception as exc:  # refused or unreachable: this member's own failure
                results[name] = exc
        shapes = {name: _shape_of(self.members[name][0], p) for name, p in prepared.items()}
        shape = most_common([s for s in shapes.values() if s is not None])
        shared = [name for name in prepared if shape is not None and shapes[name] == shape]
        for name in prepared:
            if name not in shared:
                results[name] = _Alone(prepared[name])
        if shape is not None:  # two members at least
            results.update(self._shared_job(shape, {n: prepared[n] for n in shared}))
        return results

    def _shared_job(
        self, shape: _Shape, prepared: Mapping[str, PreparedPartitions]
    ) -> dict[str, SinkResult | BaseException]:
        names = list(prepared)
        members = tuple(_member(prepared[n]) for n in names)
        needed = list(dict.fromkeys(c for m in members for c, _ in m.columns))
        parted = self.df.select(*[quoted(c) for c in needed]).repartition(
            shape.partitions, *[quoted(c) for c in shape.by]
        )
        if any(m.membership for m in members):
            parted = with_member_column(parted, shape.by)
        if shape.sort:
            parted = parted.sortWithinPartitions(*shape.sort)
        job = parted.mapInArrow(SharedPartitionTask(members), SHARED_RESULT_DDL)
        plan_without_adaptive(job)  # one task per partition: nothing to adapt
        log.debug("one shared task per partition for %s", ", ".join(names))
        try:
            split = member_outcomes(job.collect(), len(members))
        except Exception as exc:  # the job failed: each member's attempt failed with it
            return {name: exc for name in names}
        results: dict[str, SinkResult | BaseException] = {}
        for name, outcomes in zip(names, split, strict=True):
            sink, batch = self.members[name]
            try:
                result = sink.finish_partitions(batch, prepared[name], outcomes)
            except Exception as exc:
                results[name] = exc
                continue
            others = [n for n in names if n != name]
            results[name] = replace(result, details={**result.details, "shared_with": others})
        return results


def shared_passes(
    groups: Sequence[Sequence[str]], df: Any, batches: Mapping[str, Batch],
    specs: Mapping[str, SinkSpec],
) -> dict[str, SharedPass]:  # fmt: skip
    """Each grouped sink's :class:`SharedPass` (one per group)."""
    passes: dict[str, SharedPass] = {}
    for group in groups:
        members = {name: (specs[name].sink, batches[name]) for name in group}
        shared = SharedPass(df, members)  # type: ignore[arg-type]
        passes.update({name: shared for name in group})
    return passes


def _shape_of(sink: PartitionedSink, prepared: PreparedPartitions) -> _Shape | None:
    given = prepared.given
    if given.renamed is None:
        return None
    source = {name: batch_column for batch_column, name in given.renamed}
    if any(c not in source for c in (*given.by, *given.sort)):
        return None
    return _Shape(
        sink.partitions, tuple(source[c] for c in given.by), tuple(source[c] for c in given.sort)
    )


def _member(prepared: PreparedPartitions) -> SharedMember:
    given = prepared.given
    assert given.renamed is not None  # checked by _shape_of
    return SharedMember(prepared.task, tuple(given.renamed), given.membership)
