"""The Delta Lake sink: append or upsert each micro-batch into a Delta table, once.

Two engines, one behaviour: ``rs`` (delta-rs, the default, needs no JVM jars) and
``spark`` (delta-spark, needs the Delta jars); ``auto`` picks ``spark`` when the Delta JVM
classes load and ``rs`` otherwise. With ``rs``, an append with ``write_from="executors"``
is written from the executors (the tasks write the Parquet files, the driver commits them
once, :mod:`fanout_delta.rs_executors`); ``write_from="driver"`` and every merge convert
the batch to Arrow on the driver and write with delta-rs there. ``write_from="auto"`` (the
default) writes from the executors on a cluster when they reach the table (an object
store, or ``local-cluster``), and from the driver when the Spark master is ``local[...]``:
there the tasks run in the driver's JVM on the driver's cores, so the executors' writer
gains no parallelism and pays Spark's Python-task overhead, while one Arrow conversion
serves every Delta sink of the batch (docs/architecture.md §8.1). A merge
refuses a batch of more than ``max_merge_rows`` rows rather than running the driver out
of memory.

Design decisions:

- An empty batch commits nothing (no Delta version per idle trigger); the ledger marks it,
  and a replay of an empty batch is empty again.
- Compaction (``compact_every=N``) runs after batches ``N-1, 2N-1, ...`` once their write
  committed. A failed compaction is logged as a warning and does not fail the batch: the
  data and its transaction are already committed, and a raised error would only replay a
  write that is then skipped. A compaction that another compaction of the same files
  committed before is taken back at once (:mod:`fanout.delta_tables.compaction`); one
  whose run was killed before that check is checked, and taken back, by the next
  compaction and at the sink's open (engine ``rs``; without ``compact_every``, when one
  of the newest commits is a fanout compaction).
- Each commit records the batch's plan (:mod:`fanout_delta.plans`): a batch found already
  written is skipped only when its commit was planned alike, and refused with
  :class:`fanout.CheckpointRollbackError` when Spark planned it again (a rolled-back
  checkpoint), whose new rows a skip would lose.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from fanout.contract.batch import Batch
from fanout.contract.sink import BackfillSource, Guarantee, Reads, Sink, SinkContext, SinkResult
from fanout.delta_tables import io as deltaio
from fanout.delta_tables.kept import KeptTable
from fanout.observe.secrets import location_secrets, secret_option_values
from fanout.partitioned.task import HookPlugins
from fanout_delta import epoch_fencing, table_checks, writers
from fanout_delta.batch_checks import BatchChecks
from fanout_delta.compactions import Compactions
from fanout_delta.declaration import OPTIONS
from fanout_delta.held import HeldBatches
from fanout_delta.option_values import ENGINES as ENGINES
from fanout_delta.option_values import MODES as MODES
from fanout_delta.option_values import WRITE_FROM as WRITE_FROM
from fanout_delta.option_values import (
    Engine,
    Mode,
    WriteFrom,
    as_list,
    as_text,
    check_options,
    config_error,
    refuse_non_mappings,
    refuse_unquotable_keys,
)
from fanout_delta.table_checks import pa_schema as pa_schema
from fanout_delta.target import DeltaTarget

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.dead_letters import DeadLetterTarget
    from fanout.contract.partitions import BatchPartitioning
    from fanout.contract.sharing import SharedWrite

logger = logging.getLogger(__name__)

MAX_MERGE_ROWS = 2_000_000
"""The default of option ``max_merge_rows`` (docs/architecture.md, the Delta sink: what a
merge costs the driver per row)."""


class DeltaSink(Sink):
    """Writes every micro-batch to the Delta table at ``path`` exactly once.

    :param name: the sink name (its transaction app id is ``fanout/<pipeline>/<name>``).
    :param path: the table location (local path or object-store URI); required.
    :param mode: ``"append"`` or ``"merge"`` (upsert on ``keys``).
    :param keys: merge key columns (required for, and only used by, ``mode="merge"``).
    :param order_by: merge only: when a key occurs several times in one batch, the row with
        the greatest values of these columns wins (ties: the greatest values of the other
        columns in column order); without it, duplicates fail the batch.
    :param engine: ``"rs"`` (delta-rs), ``"spark"`` (delta-spark) or ``"auto"``.
    :param partition_by: partition columns for a new table; must match an existing table's.
    :param merge_schema: add new batch columns to the table instead of failing.
    :param compact_every: compact the table's small files every N batches.
    :param storage_options: object-store options passed to delta-rs (a number or a
        boolean is passed as text, ``true``/``false``: delta-rs takes only text).
    :param configuration: Delta table properties set when the sink creates the table
        (numbers and booleans as text, as ``storage_options``).
    :param dead_letter: where merge rows with a null key, rows whose partition value
        no Delta table can keep (:mod:`fanout_delta.partition_values`), and rows the
        table's CHECK constraints or NOT NULL columns refuse
        (:mod:`fanout_delta.constraints`) go instead of failing the batch: a Delta table
        path, or any kind fanout knows (``"<kind>:<location>"``,
        :mod:`fanout.deadletters.target`).
    :param min_txn_retention_hours: the shortest ``delta.setTransactionRetentionDuration``
        the table may set (default a week): it bounds how long the pipeline may stay down
        after a crash without a replay writing the batch in flight twice. ``open()``
        refuses a shorter one and warns about any.
    :param write_from: engine ``rs``, mode ``append``: ``"executors"`` (the Spark tasks
        write the Parquet files, the driver commits them: the driver's memory stays flat
        in the batch size), ``"driver"`` (the batch is converted to Arrow on the driver
        and written there) or ``"auto"`` (default, resolved by :meth:`open`: the driver on
        a ``local[...]`` master, the executors on a cluster for a table on an object store
        or on ``local-cluster``; the driver for a local path on other clusters).
    :param max_merge_rows: engine ``rs``, mode ``merge``: the most rows a batch may hold
        (the merge runs on the driver); a bigger batch fails naming the option. ``None``:
        no bound.
    """

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("transactional",)
    hook_conditions: ClassVar[Mapping[str, str]] = {
        "batch_partitioning": "engine=rs, mode=append, executors write",
        "shares_tasks": "engine=rs, mode=append, executors write",
        "backfill_source": "mode=append",
        "records_gone": "mode=append",
        "harmless_rewrite": "mode=merge, no dead_letter",
    }
    read_only_check: ClassVar[bool] = True  # open() reads the table only; creates nothing
    options = OPTIONS

    def __init__(
        self,
        name: str,
        *,
        path: str | os.PathLike[str] | None = None,
        mode: Mode = "append",
        keys: Sequence[str] | None = None,
        order_by: Sequence[str] | None = None,
        engine: Engine = "rs",
        partition_by: Sequence[str] | None = None,
        merge_schema: bool = False,
        compact_every: int | None = None,
        storage_options: Mapping[str, str | int | float | bool] | None = None,
        configuration: Mapping[str, str | int | float | bool | None] | None = None,
        dead_letter: str | None = None,
        min_txn_retention_hours: float = 168,
        write_from: WriteFrom = "auto",
        max_merge_rows: int | None = MAX_MERGE_ROWS,
    ) -> None:
        super().__init__(name)
        self.path = str(path) if path is not None else None
        self.mode = mode
        self.keys = as_list(keys)
        self.order_by = as_list(order_by)
        self.engine = engine
        self.partition_by = as_list(partition_by)
        self.merge_schema = merge_schema
        self.compact_every = compact_every
        refuse_non_mappings(name, {"storage_options": storage_options,
                                   "configuration": configuration})  # fmt: skip
        self.storage_options = as_text(storage_options) if storage_options else None
        self.configuration = as_text(configuration) if configuration else None
        self.dead_letter = dead_letter
        self.min_txn_retention_hours = min_txn_retention_hours
        self.write_from = write_from
        self.max_merge_rows = max_merge_rows
        # The engine actually used, resolved by open() ("auto" becomes "rs" or "spark").
        self.resolved_engine: Literal["rs", "spark"] | None = None
        # Where an rs append is written from, resolved by open() ("auto" becomes one).
        self.resolved_write_from: Literal["executors", "driver"] | None = None
        self._dead_letters: DeadLetterTarget | None = None  # resolved by fanout, at open()
        self._hook_plugins: HookPlugins | None = None  # found at open()
        self._ledger: str | None = None  # the pipeline's ledger, named at open()
        self._sinks: tuple[str, ...] = ()  # the pipeline's sinks, named at open()
        # Whether Spark's executors can write the table's path (found at open()).
        self._executors_reach_the_table = False
        # The table's snapshot, kept from batch to batch (made at open()).
        self._kept: KeptTable | None = None
        # Why the executors' append stepped back to the driver, as logged (once each).
        self._stepped_back: set[str] = set()
        # The epoch whose earlier epochs this process fenced (fence_earlier_epochs).
        self._fenced_for = 0

    # -- opening -----------------------------------------------------------------------

    @property
    def reads(self) -> Reads:
        """``"arrow"`` when the delta-rs engine writes from the driver (a merge, or
        ``write_from="driver"``), ``"dataframe"`` otherwise (delta-spark, or the executors'
        append, which reads the DataFrame in Spark tasks)."""
        if (self.resolved_engine or self.engine) != "rs":
            return "dataframe"
        return "dataframe" if self._from_executors() else "arrow"

    def check_schema(self, schema: pa.Schema) -> None:
        """Batches of ``schema`` must carry the columns ``keys``, ``order_by`` and
        ``partition_by`` name, and no ``VARIANT``, ``GEOMETRY`` or ``GEOGRAPHY`` for delta-rs
        to write, whether or not the table exists; an existing table must take them (new
        columns only with ``merge_schema``), a missing one is created from the first batch."""
        import pyarrow as pa

        from fanout_delta.schema import check_batch_schema

        self._batch_checks().check_schema(schema, schema.names, None)
        table = None if self.path is None else deltaio.open_table(self.path, self.storage_options)
        if table is not None:
            check_batch_schema(
                pa.schema(table.schema().to_arrow()),
                schema,
                merge_schema=self.merge_schema,
                sink=self.name,
                batch_id=None,
            )

    def secret_values(self) -> Sequence[str]:
        """The object-store credentials among ``storage_options`` (keys, secrets, tokens),
        scrubbed from every error fanout logs, records or raises, and the password of a
        ``user:password@`` in the table's or the dead-letter table's location."""
        found = secret_option_values(self.storage_options)
        found += location_secrets([self.path, self.dead_letter])
        return list(dict.fromkeys(found))

    def open(self, context: SinkContext) -> None:
        """Validate the options and, when the table exists, the columns they name
        (:mod:`fanout_delta.option_values`, :mod:`fanout_delta.table_checks`); resolve the
        engine and where an append is written from (:mod:`fanout_delta.writers`); take
        back a compaction a killed run left unchecked (:mod:`fanout_delta.compactions`)."""
        name, path = self.name, self.path
        columns = {"keys": self.keys, "order_by": self.order_by, "partition_by": self.partition_by}
        check_options(
            name, path=path, storage_options=self.storage_options, mode=self.mode,
            engine=self.engine, columns=columns, compact_every=self.compact_every,
            min_txn_retention_hours=self.min_txn_retention_hours, write_from=self.write_from,
            max_merge_rows=self.max_merge_rows, merge_schema=self.merge_schema,
        )  # fmt: skip
        assert path is not None  # check_options refuses none
        self._dead_letters = context.dead_letters
        self.resolved_engine = writers.resolve_engine(name, self.engine, context.spark)
        refuse_unquotable_keys(name, self.resolved_engine, self.mode, self.keys)
        self.resolved_write_from = writers.resolve_write_from(
            name, self.write_from, path, context.spark
        )
        self._executors_reach_the_table = writers.executors_reach_the_table(
            self.resolved_write_from, context.spark
        )
        self._hook_plugins = HookPlugins.of(context.plugins)
        self._ledger = context.ledger
        self._sinks = tuple(context.sinks)
        try:
            table = deltaio.open_table(path, self.storage_options)
        except Exception as exc:
            if self.resolved_engine == "spark":
                return  # delta-spark may reach storage delta-rs cannot; Delta checks it
            raise config_error(name, f"cannot open the Delta table at {path!r}: {exc}") from exc
        if table is not None:
            table_checks.check_table(name, path, table, columns)
            table_checks.check_log_length(name, path, table)
            table_checks.check_constraints(name, table, self.resolved_engine, context.spark)
            if self.resolved_engine == "rs":
                table_checks.refuse_binary_partitions(name, path, table)
                self._compactions().repair(table, context)
        elif context.checking:
            context.would(f"create the Delta table at {path} (its first batch does)")
        if self.resolved_engine == "rs":
            self._kept = KeptTable(path, self.storage_options)
            self._kept.keep(table)
        table_checks.check_txn_retention(
            name,
            path,
            table.metadata().configuration if table is not None else self.configuration,
            self.min_txn_retention_hours,
        )
        logger.info(
            "sink %r: Delta %s to %s with engine %s%s%s",
            name, self.mode, path, self.resolved_engine,
            f", written from the {self.resolved_write_from}"
            if self.resolved_engine == "rs" and self.mode == "append" else "",
            "" if table is not None else " (table created by the first batch)",
        )  # fmt: skip

    def close(self) -> None:
        """Drop the table's snapshot kept between batches."""
        if self._kept is not None:
            self._kept.forget()

    def standing_problems(self) -> Sequence[str]:
        """A fanout compaction of the table that left rows twice and cannot be taken back
        (:func:`fanout.delta_tables.compaction.refused_compaction`), as its refusal says it."""
        if self.path is None:
            return ()
        return self._compactions().refused()

    # -- what the table holds ------------------------------------------------------------

    def backfill_source(self, pipeline: str) -> BackfillSource | None:
        """In append mode, each batch's commit (found by its app transaction) and the rows
        it added: what a sink with ``backfill_from`` naming this one receives first. A
        merge table keeps only the latest row per key, so it cannot serve."""
        if self.mode != "append" or self.path is None:
            return None
        from fanout.contract.batch import txn_app_id
        from fanout.delta_tables.history import DeltaBatchHistory

        name = self.name
        return DeltaBatchHistory(
            self.path, lambda epoch: txn_app_id(pipeline, name, epoch), self.storage_options
        )

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        """Whether the table's log records the batch's app transaction (``txn_app_id``
        of the epoch at ``batch_id`` or later): one log lookup. A batch that wrote no row
        committed nothing, so it is not held. Nor is one a later RESTORE took out (a
        restore keeps the app transaction, not the rows:
        :func:`fanout_delta.plans.restored_away`, read only when the transaction says held).

        A table with ``delta.setTransactionRetentionDuration`` forgets the app transaction
        that long after its last batch: with no transaction of the epoch at all there, it
        cannot tell a batch never written from one whose transaction expired (an idle
        pipeline's restart), so ``None``. (:class:`fanout_delta.held.HeldBatches`.)"""
        if self.path is None:
            return None
        return self._held().holds(self.name, pipeline, epoch, batch_id)

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """Append mode: why the table's log keeps no app transaction of ``epoch`` while the
        table holds data files: its ``delta.setTransactionRetentionDuration`` expired it
        (:meth:`holds_batch`'s ``None``), so the sink cannot tell which of the epoch's
        batches it holds (``batch_id`` is not read: one transaction per epoch). ``None``:
        merge mode (a replay merges by key), no table, a transaction of the epoch there, no
        retention set (the transaction never expires: a table without it was written anew),
        or no data file. Asked at a replayed batch's check (:mod:`fanout.steps.replay`) once
        ``holds_batch`` said ``None``; after a ``False`` (the run's lost-target check, a new
        epoch's start) one of those holds: ``None``, as before. One log lookup."""
        if self.mode != "append" or self.path is None:
            return None
        return self._held().records_gone(pipeline, epoch)

    def holds_batch_of(
        self, sink_name: str, pipeline: str, epoch: int, batch_id: int
    ) -> bool | None:
        """:meth:`holds_batch` by the app transaction of sink ``sink_name`` in this table
        (:meth:`fanout.Sink.holds_batch_of`: a sink renamed between a crash and its
        replay). A table recording no transaction of that name holds nothing of it
        (``False``, retention or not: the sink wrote elsewhere, or is of another type)."""
        if self.path is None:
            return None
        return self._held().holds(sink_name, pipeline, epoch, batch_id)

    def remove_batch_hint(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """The table version that committed the batch, and the restore that removes it
        when it is the table's last commit but for epoch fences (commits without rows a
        new epoch's start makes, :mod:`fanout_delta.fence`: the next start makes them
        again); the log is walked back from the latest version, at most 100 versions: a
        refusal's path, never a batch's. The latest version is the newest in storage
        (:func:`fanout.delta_tables.io.latest_version`, one log listing), the snapshot
        brought up to it when another writer committed since it was opened: a restore
        offered from the snapshot's version would take that writer's commit with it."""
        if self.path is None:
            return None
        return self._held().remove_hint(pipeline, epoch, batch_id)

    def harmless_rewrite(self) -> str | None:
        """Merge without a dead-letter target: ``when_matched_update_all`` (unconditional)
        and ``when_not_matched_insert_all``, so a key holds the row merged last, whatever
        offsets the new epoch's batch covers. Append, or any dead-letter target (its
        letters would be kept twice): ``None``."""
        if self.mode != "merge" or self.dead_letter is not None:
            return None
        return "it merges by key, without a dead-letter target: each key keeps its last row"

    # -- the epoch fence -----------------------------------------------------------------

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        """Close the app transactions of epochs ``0 .. epoch-1`` to a replaced driver still
        running (:meth:`fanout.Sink.fence_earlier_epochs`; :mod:`fanout_delta.fence`): one
        commit without rows marking each one not fenced yet. No table yet: nothing. A
        table delta-rs cannot commit to is left unfenced, once a process
        (:func:`fanout_delta.epoch_fencing.fence_earlier_epochs`)."""
        if self.path is None or epoch <= 0:
            return
        epoch_fencing.fence_earlier_epochs(
            self.name, self.path, self.storage_options, pipeline, epoch, self.secret_values
        )
        self._fenced_for = max(self._fenced_for, epoch)

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        """Commit the real version of epoch ``epoch - 1``'s app transaction back over its
        fence (:meth:`fanout.Sink.lift_epoch_fence`), so its checkpoint may run again.
        Whether there was a fence (``False``: no table, or none in its log)."""
        if self.path is None or epoch <= 0:
            return False
        self._fenced_for = min(self._fenced_for, epoch - 1)
        return epoch_fencing.lift_epoch_fence(
            self.name, self.path, self.storage_options, pipeline, epoch
        )

    def _fence_before(self, batch: Batch) -> None:
        """At this process's first write of an epoch > 0 not fenced here yet (the start's
        fence was made by another process, or the sink lagged through the start and
        caught up since): :meth:`fence_earlier_epochs` (a snapshot read; a commit only
        when an earlier epoch's app transaction is not fenced yet). Its own epoch is never
        closed: a lagging sink's catch-up writes the replaced epoch's batches first."""
        epoch = batch.info.epoch
        if epoch > self._fenced_for:
            self.fence_earlier_epochs(batch.pipeline, epoch)

    # -- writing -------------------------------------------------------------------------

    def write(self, batch: Batch) -> SinkResult:
        """Append or merge one batch; a batch already in the table is skipped
        (:func:`fanout_delta.writers.write_batch`)."""
        self._batch_checks().check_batch(batch)
        self._fence_before(batch)
        engine = self.resolved_engine or self.engine
        result = writers.write_batch(self.target(), batch, engine, self._from_executors())
        return self._compacted(result, batch, engine)

    def shares_tasks(self) -> bool:
        """An append with delta-rs writes its first attempt in a Spark job shared with
        other sinks writing from the executors (docs/architecture.md §3.4), whatever their
        partitioning: each task writes its rows into files of its own, and the driver
        commits them once. Whenever the executors may write the table: with
        ``write_from="executors"``, or ``"auto"`` on one machine (where ``auto`` writes
        alone from the driver, since a job of its own would only add a Spark job), on
        ``local-cluster`` or for a table on an object store."""
        if (self.resolved_engine or self.engine) != "rs" or self.mode != "append":
            return False
        return self.write_from == "executors" or (
            self.write_from == "auto" and self._executors_reach_the_table
        )

    def batch_partitioning(self, schema: Any) -> BatchPartitioning | None:
        """Any (:data:`~fanout.contract.sharing.ANY_PARTITIONING`) when it shares tasks:
        an append keeps rows in whatever partitions the batch has."""
        from fanout.contract.sharing import ANY_PARTITIONING

        return ANY_PARTITIONING if self.shares_tasks() else None

    def shared_write(self, batch: Batch) -> SharedWrite:
        """The executors' append as a shared job's member
        (:func:`fanout_delta.rs_executors.shared_append`); a table the executor writer
        cannot write, or a batch already in it, is written alone by :meth:`write`."""
        from fanout.contract.sharing import SharedWrite
        from fanout_delta.rs_executors import shared_append

        self._batch_checks().check_batch(batch)
        self._fence_before(batch)
        shared = shared_append(self.target(), batch)
        if shared is None:
            return SharedWrite(None, (), None, finish=_never, alone=lambda: self.write(batch))
        return SharedWrite(
            shared.task, shared.columns, shared.shape,
            finish=lambda texts: self._compacted(shared.finish(texts), batch),
            alone=lambda: self._compacted(shared.alone(), batch),
        )  # fmt: skip

    def target(self) -> DeltaTarget:
        """What the engines need to write a batch: this sink's settings, and the
        dead-letter target fanout resolved from ``dead_letter`` (given at ``open``)."""
        assert self.path is not None  # checked by open()
        return DeltaTarget(
            name=self.name,
            path=self.path,
            mode=self.mode,
            keys=self.keys,
            order_by=self.order_by,
            partition_by=self.partition_by,
            merge_schema=self.merge_schema,
            storage_options=self.storage_options,
            configuration=self.configuration,
            dead_letters=self._dead_letters,
            write_from=self._write_from(),
            max_merge_rows=self.max_merge_rows,
            hook_plugins=self._hook_plugins,
            ledger=self._ledger,
            kept=self._kept,
            stepped_back=self._stepped_back,
            sinks=self._sinks,
        )

    def is_transient(self, error: BaseException) -> bool:
        """Retry :class:`fanout.TransientSinkError` (delta-rs commit conflicts are
        translated to it) and Delta's concurrent-modification errors on Spark, among them
        a commit that lost to a ``txn`` of its app id (``ConcurrentTransactionException``: a
        later epoch's fence, which the retry reads and refuses, or a replayed batch another
        driver committed, which the retry skips), and a replay's history that other writers'
        commits kept from being numbered while a RESTORE is listed
        (:class:`fanout.errors.HistoryUnsettledError`, :func:`fanout_delta.plans.taken_out`)."""
        from fanout.errors import HistoryUnsettledError

        if super().is_transient(error) or isinstance(error, HistoryUnsettledError):
            return True
        text = str(error)
        return any(
            name in text
            for name in (
                "ConcurrentAppendException",
                "ConcurrentModification",
                "ConcurrentTransactionException",
                "HistoryUnsettledError",  # raised on an executor: its text
            )
        )

    # -- collaborators -------------------------------------------------------------------
    # Made from the sink's settings when asked, none kept: what pickling ships to the
    # executors stays the settings and the state __init__ sets.

    def _compacted(self, result: SinkResult, batch: Batch, engine: str = "rs") -> SinkResult:
        if not result.already_written:
            self._compactions().after(batch.batch_id, engine, batch)
        return result

    def _write_from(self) -> Literal["executors", "driver"]:
        """Where an append is written from: as open() resolved it, or as configured."""
        return self.resolved_write_from or writers.resolve_write_from(
            self.name, self.write_from, self.path, None
        )

    def _from_executors(self) -> bool:
        return self.mode == "append" and self._write_from() == "executors"

    def _batch_checks(self) -> BatchChecks:
        return BatchChecks(
            self.name, self.resolved_engine or self.engine, self.mode,
            self.keys, self.order_by, self.partition_by,
        )  # fmt: skip

    def _held(self) -> HeldBatches:
        assert self.path is not None  # each caller answers without a path first
        return HeldBatches(self.name, self.path, self.storage_options)

    def _compactions(self) -> Compactions:
        assert self.path is not None  # checked by open()
        return Compactions(self.name, self.path, self.storage_options, self.compact_every)


def _never(texts: Sequence[str]) -> SinkResult:
    raise AssertionError("a sink writing alone has no shared outcomes to finish")
