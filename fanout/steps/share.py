"""Step 4, with the partitioning: which pending sinks write their partitions in one shared
Spark job (docs/architecture.md §3.4), and step 5's first attempt of those sinks.

Sinks writing from the executors (a PostgreSQL table and a Kafka topic keyed by
``order_id``, 4 partitions each, and a Delta append) would each read the batch in a job of
their own, converting every row to Arrow once per sink, and the batch would be persisted
for them. A :class:`SharedPass` prepares each of them on the driver as its own write would
(:meth:`fanout.Sink.shared_write`: preflight, determinism and membership checks, which
still refuse a sink before any of its partitions is written), then runs one job whose
tasks hand every partition to each sink's task (:mod:`fanout.partitioned.shared`), and
gives each sink its own result or error.

Only the first attempt is shared: a sink that failed retries alone, as it would without
sharing. A sink joins only when it says it may (:meth:`fanout.Sink.shares_tasks`; a kit
sink also needs the kit's own ``write``, never bypassed when a subclass overrides it) and
reads the batch through a route that keeps it whole. Sinks hashing the batch alike
(:meth:`fanout.Sink.batch_partitioning`) form a group; a sink taking any partitioning
(:data:`~fanout.contract.sharing.ANY_PARTITIONING`) joins the largest. Where a row lands
is the same hash of the same values either way, so a partition committed in a shared task
and one replayed alone hold the same rows.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from fanout.contract.partitions import BatchPartitioning
from fanout.contract.sessions import (
    ThreadWrapper,
    is_classic,
    plan_without_adaptive,
    result_schema,
    spark_threads,
)
from fanout.contract.sharing import ANY_PARTITIONING, SharedShape, SharedWrite
from fanout.contract.sink import Sink, SinkResult
from fanout.partitioned.shared import (
    SHARED_RESULT_DDL,
    SharedMember,
    SharedPartitionTask,
    member_outcomes,
)
from fanout.partitioned.shared_udf import SHARED_UDFS, carrying
from fanout.partitioned.sink import PartitionedSink
from fanout.sink_spec import SinkSpec, write_timeout
from fanout.steps.partition import reported_partitioning, usable
from fanout.steps.shared_frame import EarlyInput, JobLayout, RecentLayouts
from fanout.steps.state import BatchState

if TYPE_CHECKING:
    from fanout.contract.batch import Batch

log = logging.getLogger("fanout")


def shares_tasks(spec: SinkSpec) -> bool:
    """Whether a sink may write its first attempt in tasks shared with other sinks."""
    sink = spec.sink
    if isinstance(sink, PartitionedSink) and type(sink).write is not PartitionedSink.write:
        return False
    if write_timeout(spec) is not None:
        return False  # written in a thread of its own, its jobs cancelled at its timeout
    return spec.route.is_identity and sink.shares_tasks()


def group_shared_tasks(
    state: BatchState, specs: Mapping[str, SinkSpec], parallelism: int | None = None
) -> None:
    """Fill ``state.share_groups`` (:func:`share_groups`); call it before persisting, which
    counts each group as one reader."""
    candidates = [name for name in state.pending if shares_tasks(specs[name])]
    if len(candidates) >= 2 and hasattr(state.df, "mapInArrow"):
        state.share_groups = share_groups(candidates, specs, state.df.schema, parallelism)


def share_groups(
    pending: Sequence[str], specs: Mapping[str, SinkSpec], schema: Any,
    parallelism: int | None = None,
) -> list[tuple[str, ...]]:  # fmt: skip
    """The pending sinks that may share tasks, grouped by the partitioning they report
    (:meth:`fanout.Sink.batch_partitioning`); the sinks taking any partitioning join the
    largest group (the first of the largest), or, when no sink hashes, those reading the
    DataFrame form one of their own. Groups of two or more, in configuration order; none
    larger than ``parallelism`` (how many sinks may write at once: a shared job writes
    them all at once), so sinks taking any partitioning join only where there is room. No
    I/O: a sink that cannot tell yet (PostgreSQL before its first batch) writes alone."""
    hashed: dict[BatchPartitioning, list[str]] = {}
    flexible: list[str] = []
    for name in pending:
        if not shares_tasks(specs[name]):
            continue
        partitioning = reported_partitioning(specs[name], schema)
        if partitioning == ANY_PARTITIONING:
            flexible.append(name)
        elif partitioning is not None and usable(partitioning):
            hashed.setdefault(partitioning, []).append(name)
    limit = parallelism if parallelism is not None else len(pending)
    groups = [names for names in hashed.values() if len(names) <= limit]
    if not groups:
        # Sinks reading Arrow share one conversion already (§3.2): a job for them alone
        # would only add one; those reading the DataFrame each run a job of their own.
        flexible = [name for name in flexible if specs[name].sink.reads == "dataframe"]
    if flexible:
        if not groups:
            groups.append([])
        largest = max(groups, key=len)
        largest.extend(flexible[: max(limit - len(largest), 0)])
    order = {name: index for index, name in enumerate(pending)}
    found = [tuple(sorted(names, key=order.__getitem__)) for names in groups if len(names) >= 2]
    return sorted(found, key=lambda names: order[names[0]])


@dataclass(frozen=True)
class _Alone:
    """A member prepared but not shared (its partitioning differs from the group's): it
    runs its own job in its own thread."""

    write: SharedWrite


@dataclass(frozen=True)
class _Ran:
    """A member the shared job wrote: its thread finishes it (its own commit, errors and
    roll-up), while the other members' threads finish theirs."""

    write: SharedWrite
    texts: Sequence[str]
    others: Sequence[str]

    def finish(self) -> SinkResult:
        """The member's result, saying who it shared the job with."""
        result = self.write.finish(self.texts)
        return replace(result, details={**result.details, "shared_with": list(self.others)})


_Result = SinkResult | BaseException | _Alone | _Ran


class SharedPass:
    """The first attempt of a group of sinks, written by one shared job.

    :param df: the batch DataFrame every member reads (an identity route).
    :param members: each member's sink and batch (attempt 1), in configuration order.
    :param layouts: the group's last job layout, to build this batch's job input while the
        members prepare, or the input started as the batch arrived
        (:mod:`fanout.steps.shared_frame`); ``None``: built after.
    :param threads: wraps each member's preparation for a thread of its own
        (:func:`fanout.contract.sessions.spark_threads`, captured by the batch's thread);
        ``None``: captured when the job runs.
    """

    def __init__(
        self, df: Any, members: Mapping[str, tuple[Sink, Batch]],
        layouts: RecentLayouts | None = None, threads: ThreadWrapper | None = None,
    ) -> None:  # fmt: skip
        self.df = df
        self.members = dict(members)
        self.group = tuple(self.members)  # the key of its layouts in ``layouts``
        self.layouts = layouts
        self.threads = threads
        self._lock = threading.Lock()
        self._results: dict[str, _Result] | None = None

    def write(self, name: str) -> SinkResult:
        """Member ``name``'s result: the first member to ask runs the shared job for all
        (the others wait for it); raises the member's own error."""
        with self._lock:
            if self._results is None:
                try:
                    self._results = self._run()
                except BaseException as exc:  # planning the job failed: every member's attempt
                    self._results = dict.fromkeys(self.members, exc)  # and only once
                    if not isinstance(exc, Exception):  # an interrupt goes on up at once
                        raise
        result = self._results[name]
        if isinstance(result, BaseException):
            raise result
        if isinstance(result, _Alone):
            return result.write.alone()
        if isinstance(result, _Ran):
            return result.finish()
        return result

    def _run(self) -> dict[str, _Result]:
        results: dict[str, _Result] = {}
        writes: dict[str, SharedWrite] = {}
        # Each member prepares in a thread of its own, as its own write would have: the
        # round trips (a preflight, a table's snapshot, the markers) overlap.
        threads = self.threads or spark_threads(self.df)
        with ThreadPoolExecutor(len(self.members), thread_name_prefix="fanout-share") as pool:
            prepared = {
                name: pool.submit(threads(partial(sink.shared_write, batch)))
                for name, (sink, batch) in self.members.items()
            }
            early = self._early_input()  # meanwhile, in this thread
        for name, future in prepared.items():
            try:
                writes[name] = future.result()
            except Exception as exc:  # refused or unreachable: this member's own failure
                results[name] = exc
        shape, shared = shared_members(writes)
        for name in writes:
            if name not in shared:
                results[name] = _Alone(writes[name])
        if shared:
            results.update(self._shared_job(shape, {n: writes[n] for n in shared}, early))
        elif early is not None:
            early.discard()
        return results

    def _early_input(self) -> EarlyInput | None:
        """The job input started as the batch arrived, else built now from the group's last
        layout, its shuffle started; ``None``: no layout yet, or it cannot be built (the
        members' checks will say why)."""
        if self.layouts is None:
            return None
        ahead = self.layouts.take_ahead(self.group, self.df)
        if ahead is not None:
            return ahead
        layout = self.layouts.last(self.group)
        return EarlyInput.build(layout, self.df) if layout is not None else None

    def _shared_job(
        self, shape: SharedShape | None, writes: Mapping[str, SharedWrite],
        early: EarlyInput | None = None,
    ) -> dict[str, _Ran | BaseException]:  # fmt: skip
        names = list(writes)
        members = tuple(
            SharedMember(w.task, w.columns, w.membership)  # type: ignore[arg-type]
            for w in writes.values()
        )
        layout = JobLayout.of(shape, [(m.columns, m.membership) for m in members])
        if self.layouts is not None:
            self.layouts.remember(self.group, layout)
        # the early input only when built for this very layout: then it is the same frame
        if early is not None and early.layout == layout:
            parted = early.reader()
        else:
            if early is not None:
                early.discard()
            parted = layout.frame(self.df)
        try:
            task = SharedPartitionTask(members)
            schema = result_schema(SHARED_RESULT_DDL)
            delivered: contextlib.AbstractContextManager[None]
            if is_classic(parted):  # the UDF made once per layout, the task beside it
                job = SHARED_UDFS.map(parted, layout.frame_columns(), schema)
                delivered = carrying(parted.sparkSession.sparkContext, task)
            else:  # Spark Connect: no local properties, the task inside the UDF
                job = parted.mapInArrow(task, schema)
                delivered = contextlib.nullcontext()
            plan_without_adaptive(job)  # one task per partition: nothing to adapt
            with delivered:
                rows = job.collect()
            log.debug("one shared task per partition for %s", ", ".join(names))
            split = member_outcomes(rows, len(members))
        except Exception as exc:  # the job failed: each member's attempt failed with it
            if early is not None:
                early.discard()
            return {name: exc for name in names}
        return {
            name: _Ran(writes[name], texts, [n for n in names if n != name])
            for name, texts in zip(names, split, strict=True)
        }


def shared_members(writes: Mapping[str, SharedWrite]) -> tuple[SharedShape | None, list[str]]:
    """Who runs in the shared job: the partitioning most members need (the first found
    wins a tie; ``None`` when none needs one), and the members needing it or taking any;
    nobody when that is fewer than two."""
    best = Counter(w.shape for w in writes.values() if isinstance(w.shape, SharedShape))
    shape = best.most_common(1)[0][0] if best else None
    shared = [
        name for name, w in writes.items()
        if w.task is not None and (w.shape == "any" or (shape is not None and w.shape == shape))
    ]  # fmt: skip
    return shape, shared if len(shared) >= 2 else []


def shared_passes(
    groups: Sequence[Sequence[str]], df: Any, batches: Mapping[str, Batch],
    specs: Mapping[str, SinkSpec], layouts: RecentLayouts | None = None,
    threads: ThreadWrapper | None = None,
) -> dict[str, SharedPass]:  # fmt: skip
    """Each grouped sink's :class:`SharedPass` (one per group), guessing each job's input
    from ``layouts``; ``threads``: see :class:`SharedPass`."""
    passes: dict[str, SharedPass] = {}
    for group in groups:
        members = {name: (specs[name].sink, batches[name]) for name in group}
        shared = SharedPass(df, members, layouts, threads)
        passes.update({name: shared for name in group})
    return passes
