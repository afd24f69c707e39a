"""The partitioned-sink kit: a sink that writes each batch from the executors, one
transaction per Spark partition, and skips on a replay the partitions that committed.

The sink is configuration (the bytewax split): :class:`PartitionedSink` does, on the
driver, everything such a sink needs to be exactly once -- the determinism check and the
deterministic hash repartition into :attr:`PartitionedSink.partitions`, the refusal of a
replay whose partitions would hold other rows than the committed ones
(:mod:`fanout.partitioned.membership`), the ``mapInArrow`` task, the outcomes' transport,
the check that every partition reported, the roll-up into one
:class:`fanout.SinkResult`, and one error naming every failed partition. It also refuses
a replay whose committed partitions recorded another route than the batch's
(:mod:`fanout.partitioned.replay_route`), before the route's dead letters are written
(:meth:`PartitionedSink.check_replay`) and before any partition writes. The sink
provides a picklable :class:`fanout.partitioned.task.PartitionWriter` that owns the
connection on the executor, when it skips committed partitions on a replay, how to read
their marks (with the route each recorded), and optionally a driver-side
:meth:`PartitionedSink.preflight` (so a target that is down fails the batch without a
Spark job).

Per-partition commit hooks (``fanout_partition_commit`` just before a partition commits,
``fanout_partition_committed`` right after) run on the executors, for the plugins given to
``FanOut(plugins=...)`` (pickled with the task) and installed ones.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from fanout.contract.partitions import BatchPartitioning
from fanout.contract.sessions import plan_without_adaptive, result_schema
from fanout.contract.sink import Sink, SinkContext, SinkResult
from fanout.errors import SinkError, SinkTimeoutError, SinkWriteError, TransientSinkError
from fanout.observe.secrets import SinkSecrets
from fanout.partitioned.determinism import check_batch
from fanout.partitioned.membership import (
    WHOLE_ROW,
    CommittedPartition,
    PartitionPlan,
    check_committed,
    check_hashable,
    partitioned_frame,
    plan_of,
    summarize,
)
from fanout.partitioned.outcome import RESULT_DDL, PartitionOutcome
from fanout.partitioned.replay_route import check_routes, recorded_routes
from fanout.partitioned.task import CommitHooks, HookPlugins, PartitionTask
from fanout.partitioned.waves import WavesStopped, collect_in_waves

log = logging.getLogger("fanout")

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.sharing import SharedWrite
    from fanout.partitioned.task import PartitionWriter


@dataclass(frozen=True)
class PartitionInput:
    """What a batch's partitions are made of.

    :param df: the DataFrame to partition (the batch, or the sink's projection of it).
    :param by: the columns hashed into partitions (all of ``df``'s for a keyless sink).
    :param membership: whether committed partitions are skipped on a replay (so their
        membership must be stable, and is checked before anything is written).
    :param keyed: whether ``by`` are keys (else the whole row decides the partition).
    :param sort: columns ordering the rows within each partition, if any.
    """

    df: Any
    by: Sequence[str]
    membership: bool = True
    keyed: bool = True
    sort: Sequence[str] = ()
    renamed: Sequence[tuple[str, str]] | None = None
    """When ``df`` is the batch's own columns under (possibly) other names, the pairs
    ``(batch column, input column)`` in ``df``'s order; ``None`` for any other input. Only
    an input that says so can share a task with other sinks."""


@dataclass(frozen=True)
class PreparedPartitions:
    """A batch checked and ready for its partition tasks (:meth:`PartitionedSink.
    prepare_partitions`).

    :param given: the sink's partition input.
    :param task: the picklable partition task.
    :param partitioning: builds :attr:`parted`.
    :param snapshot: the local checkpoint ``given`` reads on a replay that skips committed
        partitions (:func:`snapshot`), released by :meth:`release`; ``None`` otherwise.
    """

    given: PartitionInput
    task: PartitionTask
    partitioning: Callable[[], Any] = field(repr=False)
    snapshot: Any = field(default=None, repr=False)

    def release(self) -> None:
        """Drop the executors' blocks of :attr:`snapshot` once the write is done (written
        or failed: a new attempt takes a new copy); see :func:`release_snapshot`."""
        if self.snapshot is not None:
            release_snapshot(self.snapshot)

    @cached_property
    def parted(self) -> Any:
        """``given.df`` partitioned (with the member column when membership is kept,
        sorted when asked): what the sink's own job reads. Built on first use: a shared
        job partitions the batch itself, and each DataFrame step here is a py4j round
        trip and an analysis of the batch's plan (~4 ms) before any task can start."""
        return self.partitioning()


def snapshot(given: PartitionInput) -> PartitionInput:
    """``given`` over a local checkpoint of its rows, for a replay that skips committed
    partitions: the check that the batch still builds those partitions and the write of
    the others then read the same rows. Recomputed between them, an input that changed
    meanwhile (a static table a join reads, updated) passed the check and moved rows
    between skipped and written partitions: rows lost and written twice. A lost block
    fails the job instead of recomputing it. Written alone, not in a shared job, which
    would read the batch anew (``renamed`` dropped)."""
    return replace(given, df=given.df.localCheckpoint(eager=True), renamed=None)


def release_snapshot(df: Any) -> None:
    """Drop the blocks of the local checkpoint ``df`` (:func:`snapshot`) from the executors.
    ``df.unpersist()`` does not (it drops only what ``cache()`` registered); the
    checkpointed RDD's own ``unpersist`` does. Left alone, they stayed until Spark's
    cleaner ran after the driver's JVM collected the RDD: the batch's rows held on the
    executors beside the next batches. Under Spark Connect (no JVM object at hand) the
    server releases its copy when the DataFrame is collected, as before."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return
    try:
        jdf.queryExecution().analyzed().rdd().unpersist(False)
    except Exception as exc:  # releasing is best effort: the cleaner still drops them
        log.warning("the replay's local checkpoint was not released: %s", exc)


LOST_COPY = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"
"""Spark's error class for a local checkpoint's block lost with its executor."""


@contextmanager
def copy_kept(batch: Batch, sink: str, snapshot: Any) -> Iterator[None]:
    """Turn the failure of a job that read a lost block of the replay's copy
    (:func:`snapshot`) into a :class:`TransientSinkError` saying so: Spark does not
    recompute a local checkpoint, so the attempt cannot complete, and the next attempt
    (fanout's retry, or the restarted query's replay) takes a new copy and checks it
    again. Any other failure passes unchanged."""
    try:
        yield
    except TransientSinkError:
        raise
    except Exception as exc:
        if snapshot is None or LOST_COPY not in str(exc):
            raise
        raise TransientSinkError(
            "an executor holding part of this replay's copy of the batch (the local "
            "checkpoint its committed partitions were checked against) was lost "
            f"({LOST_COPY}): Spark does not recompute such a copy, so this attempt "
            "fails before any further partition commits what it cannot check; the next "
            "attempt takes a new copy of the batch and checks it again",
            sink=sink, batch_id=batch.batch_id,
        ) from exc  # fmt: skip


@dataclass(frozen=True)
class _ReplayRead:
    """What :meth:`PartitionedSink.check_replay` computed and read of one attempt, for the
    :meth:`PartitionedSink.write` of that attempt that follows it, which then computes
    none of it again: each attempt is a new :class:`~fanout.contract.batch.Batch` object
    (fanout replaces it to count the attempt), so the object, held weakly, names the
    attempt. Taken by the next write only."""

    batch: weakref.ref[Batch]
    given: PartitionInput
    plan: PartitionPlan
    committed: tuple[CommittedPartition, ...]

    def holds(self, batch: Batch) -> bool:
        """Whether this was read for ``batch`` (the same object)."""
        return self.batch() is batch


class PartitionedSink(Sink):
    """Base class of a sink writing from the executors, one transaction per partition.

    Subclasses set ``self.partitions`` (a fixed count: the partitions are the unit of
    exactly-once), call ``super().open(context)`` in :meth:`open`, and implement
    :meth:`partition_writer`; those that skip committed partitions on a replay implement
    :meth:`committed_partitions`, each partition recording with its rows the route they
    went through (:func:`fanout.partitioned.replay_route.route_mark`) and returning it in
    :attr:`CommittedPartition.route`. :meth:`write` and :meth:`check_replay` are the kit's.
    """

    partitions: int = 1
    _kit_read: _ReplayRead | None = None  # check_replay() to this attempt's write

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without what :meth:`check_replay` read (the driver's, for one attempt,
        holding a weak reference)."""
        state = dict(self.__dict__)
        state.pop("_kit_read", None)
        return state

    def open(self, context: SinkContext) -> None:
        """Keep the plugins implementing the per-partition commit hooks (shipped with
        every partition task), and the pipeline's secrets (:meth:`letter_secrets`)."""
        self._hook_plugins = HookPlugins.of(context.plugins)
        self._pipeline_secrets = tuple(context.secrets)

    def letter_secrets(self) -> SinkSecrets:
        """The secrets a partition writer masks in a refused row's reason (a dead letter's,
        the mark keeping it): this sink's and its pipeline's (given at :meth:`open`)."""
        own = tuple(self.secret_values())
        return SinkSecrets(own, getattr(self, "_pipeline_secrets", ()))

    # -- what a sink provides -------------------------------------------------------------

    def partition_input(self, batch: Batch) -> PartitionInput:
        """The batch's partitions: by default the batch itself, hashed by
        :meth:`partitioned_by` (the whole row for ``"*"`` or ``None``). Made once per
        attempt: by :meth:`check_replay` when it runs, whose input the write then takes,
        else by the write."""
        by = self.partitioned_by()
        columns = list(batch.df.columns)
        same = [(c, c) for c in columns]
        if by is None or by == WHOLE_ROW:
            return PartitionInput(batch.df, columns, keyed=False, renamed=same)
        return PartitionInput(batch.df, list(by), renamed=same)

    def batch_partitioning(self, schema: Any) -> BatchPartitioning | None:
        """:meth:`partitioned_by`'s columns (every column of ``schema`` for ``"*"``) into
        :attr:`partitions`: what the default :meth:`partition_input` hashes. A sink whose
        :meth:`partition_input` hashes other columns overrides this too, or returns
        ``None``."""
        by = self.partitioned_by()
        if by is None:
            return None
        columns = tuple(schema.fieldNames()) if by == WHOLE_ROW else tuple(by)
        return BatchPartitioning(self.partitions, columns)

    def shares_tasks(self) -> bool:
        """Whether this sink's first attempt at a batch may be written in tasks shared with
        other sinks hashing the batch alike (docs/architecture.md §3.4). It needs the
        kit's own :meth:`write` (one of a subclass's own is never bypassed) and
        :meth:`partition_input` to be the batch's own columns, renamed or not, saying so
        (:attr:`PartitionInput.renamed`). Default: when both are the kit's own; a sink
        overriding :meth:`partition_input` returns ``True`` once its input says
        ``renamed``."""
        return type(self).partition_input is PartitionedSink.partition_input

    def shared_write(self, batch: Batch) -> SharedWrite:
        """:meth:`prepare_partitions` as a shared job's member: the tasks run
        :attr:`PreparedPartitions.task`, the driver finishes with
        :meth:`finish_partitions`. An input that is not the batch's own columns (or hashes
        or sorts others) is written alone, from what was prepared."""
        from fanout.contract.sharing import SharedShape, SharedWrite

        prepared = self.prepare_partitions(batch)
        given = prepared.given
        source = {name: column for column, name in (given.renamed or ())}
        fits = given.renamed is not None and all(c in source for c in (*given.by, *given.sort))
        shape = SharedShape(
            self.partitions, tuple(source[c] for c in given.by),
            tuple(source[c] for c in given.sort),
        ) if fits else None  # fmt: skip

        def finish(texts: Sequence[str]) -> SinkResult:
            outcomes = [PartitionOutcome.from_json(text) for text in texts]
            return self.finish_partitions(batch, prepared, outcomes)

        def alone() -> SinkResult:
            return self.write_prepared(batch, prepared)

        return SharedWrite(prepared.task, tuple(given.renamed or ()), shape, finish, alone,
                           membership=given.membership)  # fmt: skip

    def partition_writer(self, batch: Batch, plan: PartitionPlan | None) -> PartitionWriter:
        """The picklable writer of this batch's partitions (``plan``: the partitioning
        each partition commits with its rows, when membership is kept)."""
        raise NotImplementedError(f"{type(self).__name__}.partition_writer")

    def preflight(self, batch: Batch) -> None:
        """On the driver, before the batch's executor job: a cheap check that the target
        answers (one connection, one round trip), raising
        :class:`fanout.TransientSinkError` when it does not. A down target then costs a
        round trip instead of a Spark job whose every task fails to connect (retried by
        Spark on a cluster) -- and the other sinks' jobs keep the cores, which matters
        most to a sink with ``on_failure="lag"``. Default: nothing."""

    def committed_partitions(
        self, batch: Batch, plan: PartitionPlan
    ) -> Sequence[CommittedPartition]:
        """The partitions of ``batch`` the target holds already, with the plan, digest and
        route (:func:`~fanout.partitioned.replay_route.route_mark`) each committed with;
        read on the driver before anything is written, once per attempt (also when
        :meth:`check_replay` read them first)."""
        return ()

    def check_replay(self, batch: Batch) -> None:
        """Before fanout writes the batch's route letters (:meth:`fanout.Sink.check_replay`):
        read the committed partitions (:meth:`committed_partitions`, on the plan
        :meth:`write` computes) and refuse a replay whose partitions recorded another route
        (:func:`~fanout.partitioned.replay_route.check_routes`), while nothing of the
        attempt is written. What it computed and read (the :meth:`partition_input`, the
        plan, the committed partitions) is kept for this attempt's :meth:`write`, which
        then computes and reads none of it again (unless the sink's :meth:`preflight`
        calls :meth:`forget_replay_read`). A sink that skips no committed partition (it
        does not implement :meth:`committed_partitions`, or its :class:`PartitionInput`
        keeps no membership) is not checked here: it records its route itself and compares it with
        :func:`~fanout.partitioned.replay_route.check_routes` (PostgreSQL upsert)."""
        self._kit_read = None
        if type(self).committed_partitions is PartitionedSink.committed_partitions:
            return
        given = self.partition_input(batch)
        if not given.membership:
            return
        plan = plan_of(given.df, given.by, self.partitions)
        committed = tuple(self.committed_partitions(batch, plan))
        check_routes(recorded_routes(committed), batch, sink=self.name)
        self._kit_read = _ReplayRead(weakref.ref(batch), given, plan, committed)

    def forget_replay_read(self) -> None:
        """Drop what :meth:`check_replay` computed and read for this attempt: the write
        computes its :meth:`partition_input`, plan and committed partitions anew. For a
        :meth:`preflight` that finds what the input was made from changed since (the
        PostgreSQL sink: its table's columns)."""
        self._kit_read = None

    def partition_failure(
        self, batch: Batch, failed: Sequence[PartitionOutcome], outcomes: Sequence[PartitionOutcome]
    ) -> SinkError:
        """The error of a batch with failed partitions (default: one naming each, transient
        when all are). Override to choose your error classes."""
        done = [o.partition for o in outcomes if o.status in ("committed", "skipped")]
        lines = [
            f"{len(failed)} of {len(outcomes)} partition(s) failed; partitions holding the "
            f"batch (skipped on replay): {done or 'none'}"
        ]
        lines += [f"  - p{o.partition}: {o.failure.message}" for o in failed if o.failure]
        transient = all(o.failure is not None and o.failure.transient for o in failed)
        error = TransientSinkError if transient else SinkWriteError
        return error("\n".join(lines), sink=self.name, batch_id=batch.batch_id)

    def after_partitions(self, batch: Batch, outcomes: Sequence[PartitionOutcome]) -> None:
        """On the driver, once every partition committed or was skipped: e.g. hand the
        outcomes' refused rows (:attr:`PartitionOutcome.letters`) to the sink's dead-letter
        target. Default: nothing."""

    def result_details(self, outcomes: Sequence[PartitionOutcome]) -> Mapping[str, Any]:
        """Facts of the sink's own for the result's details (default: none)."""
        return {}

    # -- the kit's write ------------------------------------------------------------------

    def write(self, batch: Batch) -> SinkResult:
        """Check the target answers, partition, check, write every partition from the
        executors, roll up."""
        prepared = self.prepare_partitions(batch)
        return self.write_prepared(batch, prepared)

    def write_prepared(self, batch: Batch, prepared: PreparedPartitions) -> SinkResult:
        """The sink's own job over what :meth:`prepare_partitions` made, then the roll up;
        a replay's copy of the batch is released after it (:meth:`PreparedPartitions.
        release`), and a block of it lost with an executor fails the attempt as transient
        (:func:`copy_kept`)."""
        try:
            with copy_kept(batch, self.name, prepared.snapshot):
                outcomes = self.run_partitions(prepared, batch)
                return self.finish_partitions(batch, prepared, outcomes)
        finally:
            prepared.release()

    def run_partitions(
        self, prepared: PreparedPartitions, batch: Batch | None = None
    ) -> list[PartitionOutcome]:
        """The sink's own Spark job: one task per partition, each reporting its outcome; at
        most ``batch``'s :attr:`~fanout.contract.batch.Batch.task_budget` at once (in jobs
        of that many), none started once the batch went on without the write
        (:attr:`~fanout.contract.batch.Batch.stopped`: a :class:`SinkTimeoutError`)."""
        job = prepared.parted.mapInArrow(prepared.task, result_schema(RESULT_DDL))
        plan_without_adaptive(job)  # one task per partition: nothing to adapt
        budget = None if batch is None else batch.task_budget
        stopped = None if batch is None else batch.stopped
        rows = collect_in_waves(job, budget, stopped)
        if isinstance(rows, WavesStopped):
            assert batch is not None
            span = f"0..{rows.count - 1}"
            when = (
                f"after partitions {rows.done} of {span} were written"
                if rows.done
                else f"before any of partitions {span} was written"
            )
            raise SinkTimeoutError(
                f"abandoned at its write_timeout_s {when}: partitions {rows.left} were not "
                "started (the catch-up writes the batch from the spool, skipping those written)",
                sink=self.name, batch_id=batch.batch_id,
            )  # fmt: skip
        return [PartitionOutcome.from_json(r["outcome"]) for r in rows]

    def prepare_partitions(self, batch: Batch) -> PreparedPartitions:
        """Everything :meth:`write` does on the driver before the executors write: the
        preflight, the determinism checks (of the partitioning when membership is kept,
        else of :meth:`deterministic_columns`), the route and membership checks of the
        committed partitions (which refuse the batch before any partition is written;
        read by :meth:`check_replay` when it ran for this attempt, which made the input and
        its plan too), the partitioned input and the picklable task. A shared task
        (:mod:`fanout.partitioned.shared`) runs :attr:`PreparedPartitions.task` with other
        sinks' in one Spark job."""
        self.preflight(batch)
        read = self._take_read(batch)
        given = read.given if read is not None else self.partition_input(batch)
        plan, copy = None, None
        committed: Sequence[CommittedPartition] = ()
        if given.membership:
            check_hashable(given.df.schema, given.by, keyed=given.keyed, sink=self.name,
                           batch_id=batch.batch_id)  # fmt: skip
            check_batch(given.df, given.by if given.keyed else WHOLE_ROW, sink=self.name,
                        batch_id=batch.batch_id, query_id=batch.query_id)  # fmt: skip
            if read is not None:
                plan, committed = read.plan, read.committed
            else:
                plan = plan_of(given.df, given.by, self.partitions)
                committed = self.committed_partitions(batch, plan)
            check_routes(recorded_routes(committed), batch, sink=self.name)
            if committed:
                given = snapshot(given)
                copy = given.df
        else:  # no partition skipped on a replay: only what the sink says must be stable
            stable = self.deterministic_columns()
            if stable is not None:
                check_batch(batch.df, stable, sink=self.name, batch_id=batch.batch_id,
                            query_id=batch.query_id)  # fmt: skip
        try:
            if given.membership:
                assert plan is not None
                self._check_committed(batch, given, plan, committed, copy)
            task = PartitionTask(self.partition_writer(batch, plan), self._hooks(batch))
        except BaseException:
            if copy is not None:  # no write follows: release the copy now
                release_snapshot(copy)
            raise
        return PreparedPartitions(given, task, partial(self._parted, given), copy)

    def _check_committed(
        self, batch: Batch, given: PartitionInput, plan: PartitionPlan,
        committed: Sequence[CommittedPartition], copy: Any,
    ) -> None:  # fmt: skip
        """The committed partitions hold what ``given`` would build (read from the
        replay's copy, ``copy``, when some are committed)."""
        with copy_kept(batch, self.name, copy):
            check_committed(
                committed, plan,
                lambda: summarize(partitioned_frame(given.df, self.partitions, given.by),
                                  given.by),
                sink=self.name, batch_id=batch.batch_id,
            )  # fmt: skip

    def _take_read(self, batch: Batch) -> _ReplayRead | None:
        """What :meth:`check_replay` computed and read for this attempt (``batch``), if
        anything; taken: a later write computes and reads anew."""
        read, self._kit_read = self._kit_read, None
        return read if read is not None and read.holds(batch) else None

    def _parted(self, given: PartitionInput) -> Any:
        return partitioned_frame(
            given.df, self.partitions, given.by, member=given.membership, sort=given.sort
        )

    def finish_partitions(
        self, batch: Batch, prepared: PreparedPartitions, outcomes: Sequence[PartitionOutcome]
    ) -> SinkResult:
        """On the driver, once the partition tasks reported: check every partition did,
        raise the error naming the failed ones, else :meth:`after_partitions` and the roll
        up into one result."""
        outcomes = sorted(outcomes, key=lambda o: o.partition)
        if not outcomes and prepared.given.df.isEmpty():
            # Spark plans an empty batch without the repartition (no task at all)
            outcomes = [PartitionOutcome(p, "empty") for p in range(self.partitions)]
        self._check_coverage(batch, outcomes)
        failed = [o for o in outcomes if o.status == "failed"]
        if failed:
            raise self.partition_failure(batch, failed, outcomes)
        self.after_partitions(batch, outcomes)
        return self._roll_up(outcomes)

    def _hooks(self, batch: Batch) -> CommitHooks:
        info = batch.info
        found = getattr(self, "_hook_plugins", HookPlugins())
        return found.hooks(info.pipeline, self.name, info.batch_id, info.epoch)

    def _check_coverage(self, batch: Batch, outcomes: Sequence[PartitionOutcome]) -> None:
        found = [o.partition for o in outcomes]
        if found != list(range(self.partitions)):
            raise SinkWriteError(
                f"expected one outcome per partition 0..{self.partitions - 1}, got {found} "
                "(is adaptive execution coalescing the repartition?)",
                sink=self.name, batch_id=batch.batch_id,
            )  # fmt: skip

    def _roll_up(self, outcomes: Sequence[PartitionOutcome]) -> SinkResult:
        skipped = [o.partition for o in outcomes if o.status == "skipped"]
        committed = [o.partition for o in outcomes if o.status == "committed"]
        # a partition a rival attempt committed during this write was not held before it
        written_now = committed or [o.partition for o in outcomes if o.rival]
        details = {
            "written": sum(o.written for o in outcomes),
            "committed_partitions": committed,
            "skipped_partitions": skipped,
            **self.result_details(outcomes),
        }
        return SinkResult(
            rows=sum(o.rows for o in outcomes),
            details=details,
            dead_lettered=sum(o.dead_lettered for o in outcomes),
            already_written=bool(skipped) and not written_now,
        )
