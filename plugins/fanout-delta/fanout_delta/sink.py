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
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from fanout.contract.batch import Batch
from fanout.contract.sink import BackfillSource, Guarantee, Reads, Sink, SinkContext, SinkResult
from fanout.delta_tables import io as deltaio
from fanout.delta_tables.kept import KeptTable
from fanout.errors import CompactionError, ConfigurationError
from fanout.observe.secrets import location_secrets, secret_option_values
from fanout.partitioned.task import HookPlugins
from fanout_delta.declaration import OPTIONS
from fanout_delta.plans import batch_commits, restored_away
from fanout_delta.table_states import TableStates
from fanout_delta.target import DeltaTarget

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.dead_letters import DeadLetterTarget
    from fanout.contract.partitions import BatchPartitioning
    from fanout.contract.sharing import SharedWrite

logger = logging.getLogger(__name__)

Mode = Literal["append", "merge"]
Engine = Literal["rs", "spark", "auto"]
WriteFrom = Literal["auto", "executors", "driver"]
MODES: tuple[str, ...] = get_args(Mode)
ENGINES: tuple[str, ...] = get_args(Engine)
WRITE_FROM: tuple[str, ...] = get_args(WriteFrom)

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
        self.keys = _as_list(keys)
        self.order_by = _as_list(order_by)
        self.engine = engine
        self.partition_by = _as_list(partition_by)
        self.merge_schema = merge_schema
        self.compact_every = compact_every
        for option, value in (("storage_options", storage_options),
                              ("configuration", configuration)):  # fmt: skip
            if value is not None and not isinstance(value, Mapping):
                raise ConfigurationError(
                    f"Delta sink {name!r}: option {option!r} must be a mapping of names to "
                    f"values, got {type(value).__name__}"
                )
        self.storage_options = _as_text(storage_options) if storage_options else None
        self.configuration = _as_text(configuration) if configuration else None
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

        self._check_batch_schema(schema, schema.names, None)
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
        """Validate the options and, when the table exists, the columns they name."""
        self._check_options()
        self._dead_letters = context.dead_letters
        self.resolved_engine = self._resolve_engine(context.spark)
        self._refuse_unquotable_keys()
        self.resolved_write_from = self._resolve_write_from(context.spark)
        self._executors_reach_the_table = self.resolved_write_from == "executors" or (
            context.spark is not None and _single_machine(context.spark)
        )
        self._hook_plugins = HookPlugins.of(context.plugins)
        self._ledger = context.ledger
        self._sinks = tuple(context.sinks)
        try:
            table = deltaio.open_table(self.path, self.storage_options)  # type: ignore[arg-type]
        except Exception as exc:
            if self.resolved_engine == "spark":
                return  # delta-spark may reach storage delta-rs cannot; Delta checks it
            raise self._error(f"cannot open the Delta table at {self.path!r}: {exc}") from exc
        if table is not None:
            self._check_table(table)
            self._check_log_length(table)
            self._check_constraints(table, context.spark)
            if self.resolved_engine == "rs":
                self._refuse_binary_partitions(table)
                self._repair_compactions(table, context)
        elif context.checking:
            context.would(f"create the Delta table at {self.path} (its first batch does)")
        if self.resolved_engine == "rs":
            self._kept = KeptTable(self.path, self.storage_options)  # type: ignore[arg-type]
            self._kept.keep(table)
        self._check_txn_retention(
            table.metadata().configuration if table is not None else self.configuration
        )
        logger.info(
            "sink %r: Delta %s to %s with engine %s%s%s",
            self.name, self.mode, self.path, self.resolved_engine,
            f", written from the {self.resolved_write_from}"
            if self.resolved_engine == "rs" and self.mode == "append" else "",
            "" if table is not None else " (table created by the first batch)",
        )  # fmt: skip

    def close(self) -> None:
        """Drop the table's snapshot kept between batches."""
        if self._kept is not None:
            self._kept.forget()

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
        pipeline's restart), so ``None``."""
        return self._holds(self.name, pipeline, epoch, batch_id)

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
        from fanout.contract.batch import txn_app_id
        from fanout.delta_tables import io
        from fanout.delta_tables import retention as txn_retention

        if self.mode != "append" or self.path is None:
            return None
        table = io.open_table(self.path, self.storage_options)
        app_id = txn_app_id(pipeline, self.name, epoch)
        if table is None or io.transaction_version(table, app_id) is not None:
            return None
        configuration = table.metadata().configuration
        where = f"Delta sink {self.name!r} (table {self.path!r})"
        if txn_retention.retention_of(configuration, where) is None or not table.file_uris():
            return None
        return (
            f"the table's log keeps no app transaction {app_id!r} (its "
            f"{txn_retention.PROPERTY} = {configuration.get(txn_retention.PROPERTY)!r} "
            "expired it after the epoch's last batch) while the table holds data files"
        )

    def holds_batch_of(
        self, sink_name: str, pipeline: str, epoch: int, batch_id: int
    ) -> bool | None:
        """:meth:`holds_batch` by the app transaction of sink ``sink_name`` in this table
        (:meth:`fanout.Sink.holds_batch_of`: a sink renamed between a crash and its
        replay). A table recording no transaction of that name holds nothing of it
        (``False``, retention or not: the sink wrote elsewhere, or is of another type)."""
        return self._holds(sink_name, pipeline, epoch, batch_id)

    def _holds(self, name: str, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        """Whether the table holds batch ``batch_id`` of ``epoch`` by the app transaction
        of sink ``name`` (:meth:`holds_batch`, which is this with the sink's own name)."""
        from fanout.contract.batch import txn_app_id
        from fanout.delta_tables import io
        from fanout.delta_tables import retention as txn_retention

        if self.path is None:
            return None
        app_id = txn_app_id(pipeline, name, epoch)
        table = io.open_table(self.path, self.storage_options)
        done = io.transaction_version(table, app_id)
        if done is None and table is not None and name == self.name:
            where = f"Delta sink {self.name!r} (table {self.path!r})"
            if txn_retention.retention_of(table.metadata().configuration, where) is not None:
                return None
        if done is None or done < batch_id:
            return False
        assert table is not None
        last = table.version()
        first = self._batch_version(app_id, batch_id, last)
        if first is None:
            return True
        # only the commits after it: history() reads every commit it returns; those of the
        # batch written again after a restore (fanout_delta.plans.taken_out) hold it too.
        # Numbered from the newest listed commit: delta-rs numbers from the snapshot's
        history = io.numbered_history(table, max(last - first, 1))
        commits = {first, *batch_commits(history, app_id, batch_id)}
        return not restored_away(
            history, commits, last, TableStates.of(table, self.storage_options)
        )

    def _batch_version(self, app_id: str, batch_id: int, last: int) -> int | None:
        """The table version whose commit set ``app_id`` to ``batch_id`` or past it (among
        the 100 versions up to ``last``; ``None``: not found, or the version before it
        cannot be loaded: its log files expired after a later checkpoint,
        ``delta.logRetentionDuration``).

        An app transaction's version only grows (a RESTORE keeps it), and the versions that
        can be loaded are the latest ones, so the versions before ``last`` are searched by
        halves: about 7 snapshots loaded, not up to 100."""
        low = max(last - 100, 0)
        below = low - 1  # the highest version known not to hold the batch, or low - 1
        above = last  # the lowest version known to hold it (``last`` is taken as holding)
        loaded: dict[int, bool | None] = {}
        while above - below > 1:
            middle = (below + above) // 2
            loaded[middle] = held = self._holds_at(app_id, batch_id, middle)
            if held:
                above = middle
            else:  # not held, or cannot be loaded: the batch is in a later commit
                below = middle
        if below < low:  # every version searched holds it
            return 0 if last <= 100 else None
        return above if loaded.get(below) is False else None

    def _holds_at(self, app_id: str, batch_id: int, version: int) -> bool | None:
        """Whether version ``version`` of the table records ``app_id`` at ``batch_id`` or
        past it; ``None``: the version cannot be loaded."""
        from deltalake import DeltaTable

        from fanout.delta_tables import io

        path, options = str(self.path), dict(self.storage_options or {}) or None
        try:
            table = DeltaTable(path, version=version, storage_options=options)
        except Exception:  # delta-rs' errors for a cleaned-up version vary by release
            return None
        done = io.transaction_version(table, app_id)  # a later epoch's fence cleared
        return done is not None and done >= batch_id

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        """Close the app transactions of epochs ``0 .. epoch-1`` to a replaced driver still
        running (:meth:`fanout.Sink.fence_earlier_epochs`; :mod:`fanout_delta.fence`): one
        commit without rows marking each one not fenced yet. No table yet: nothing."""
        from fanout.contract.batch import txn_app_id
        from fanout.observe.secrets import redact
        from fanout_delta.fence import fence_epochs, unfenceable

        if self.path is None or epoch <= 0:
            return
        app_ids = {e: txn_app_id(pipeline, self.name, e) for e in range(epoch)}
        try:
            fenced = fence_epochs(self.path, self.storage_options, app_ids, epoch)
        except Exception as exc:
            if not unfenceable(exc):
                raise
            # engine spark on a table delta-rs cannot commit to: no fence, as before it
            # (once a process: the writes of the epoch do not try again)
            self._fenced_for = max(self._fenced_for, epoch)
            logger.warning(
                "sink %r: epochs before %d are not fenced in the Delta table %s: delta-rs "
                "cannot commit to it (%s). A driver of a replaced epoch still running may "
                "commit its batch in flight there after this start, beside the new epoch's "
                "(the ledger detects it: ZombieBatchError). Stop the replaced query before "
                "a checkpoint reset (docs/architecture.md §8.1).",
                self.name, epoch, self.path, redact(str(exc), self.secret_values()),
            )  # fmt: skip
            return
        self._fenced_for = max(self._fenced_for, epoch)
        if fenced:
            logger.info("sink %r: fenced %d app transaction(s) of epochs before %d in %s",
                        self.name, fenced, epoch, self.path)  # fmt: skip

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        """Commit the real version of epoch ``epoch - 1``'s app transaction back over its
        fence (:meth:`fanout.Sink.lift_epoch_fence`), so its checkpoint may run again.
        Whether there was a fence (``False``: no table, or none in its log)."""
        from fanout.contract.batch import txn_app_id
        from fanout_delta.fence import lift_fence, unfenceable

        if self.path is None or epoch <= 0:
            return False
        self._fenced_for = min(self._fenced_for, epoch - 1)
        app_id = txn_app_id(pipeline, self.name, epoch - 1)
        try:
            lifted = lift_fence(self.path, self.storage_options, app_id)
        except Exception as exc:
            if not unfenceable(exc):
                raise
            # delta-rs cannot load it: it could not commit a fence there either
            logger.info("sink %r: no fence to lift in %s (delta-rs cannot read it)",
                        self.name, self.path)  # fmt: skip
            return False
        if lifted:
            logger.info("sink %r: lifted the fence of %s in %s", self.name, app_id, self.path)
        return lifted

    def harmless_rewrite(self) -> str | None:
        """Merge without a dead-letter target: ``when_matched_update_all`` (unconditional)
        and ``when_not_matched_insert_all``, so a key holds the row merged last, whatever
        offsets the new epoch's batch covers. Append, or any dead-letter target (its
        letters would be kept twice): ``None``."""
        if self.mode != "merge" or self.dead_letter is not None:
            return None
        return "it merges by key, without a dead-letter target: each key keeps its last row"

    def remove_batch_hint(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """The table version that committed the batch, and the restore that removes it
        when it is the table's last commit but for epoch fences (commits without rows a
        new epoch's start makes, :mod:`fanout_delta.fence`: the next start makes them
        again); the log is walked back from the latest version, at most 100 versions: a
        refusal's path, never a batch's. The latest version is the newest in storage
        (:func:`fanout.delta_tables.io.latest_version`, one log listing), the snapshot
        brought up to it when another writer committed since it was opened: a restore
        offered from the snapshot's version would take that writer's commit with it."""
        from fanout.contract.batch import txn_app_id
        from fanout.delta_tables import io

        app_id, path = txn_app_id(pipeline, self.name, epoch), self.path
        latest = None if path is None else io.open_table(path, self.storage_options)
        if path is None or latest is None:
            return None
        if io.latest_version(latest) > latest.version():  # committed to since it was opened
            latest.update_incremental()
        last = latest.version()
        version = self._batch_version(app_id, batch_id, last)
        if not version:
            return None
        return _restore_hint(path, version, last, _fences_after(latest, version, last))

    def write(self, batch: Batch) -> SinkResult:
        """Append or merge one batch; a batch already in the table is skipped."""
        self._check_batch(batch)
        self._fence_before(batch)
        engine = self.resolved_engine or self.engine
        if engine == "spark":
            from fanout_delta.spark_engine import write_spark

            result = write_spark(self.target(), batch)
        else:
            from fanout_delta.rs_engine import write_rs

            done = None
            if self._from_executors():
                from fanout_delta.rs_executors import append_from_executors

                done = append_from_executors(self.target(), batch)
            result = done if done is not None else write_rs(self.target(), batch)
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

        self._check_batch(batch)
        self._fence_before(batch)
        shared = shared_append(self.target(), batch)
        if shared is None:
            return SharedWrite(None, (), None, finish=_never, alone=lambda: self.write(batch))
        return SharedWrite(
            shared.task, shared.columns, shared.shape,
            finish=lambda texts: self._compacted(shared.finish(texts), batch),
            alone=lambda: self._compacted(shared.alone(), batch),
        )  # fmt: skip

    def _fence_before(self, batch: Batch) -> None:
        """At this process's first write of an epoch > 0 not fenced here yet (the start's
        fence was made by another process, or the sink lagged through the start and
        caught up since): :meth:`fence_earlier_epochs` (a snapshot read; a commit only
        when an earlier epoch's app transaction is not fenced yet). Its own epoch is never
        closed: a lagging sink's catch-up writes the replaced epoch's batches first."""
        epoch = batch.info.epoch
        if epoch > self._fenced_for:
            self.fence_earlier_epochs(batch.pipeline, epoch)

    def _compacted(self, result: SinkResult, batch: Batch, engine: str = "rs") -> SinkResult:
        if not result.already_written:
            self._maybe_compact(batch.batch_id, engine, batch)
        return result

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
            write_from=self.resolved_write_from or self._resolve_write_from(None),
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

    # -- internals -------------------------------------------------------------------

    def _check_batch(self, batch: Batch) -> None:
        """The checks of :meth:`check_schema` that need no table, on the batch's schema
        (Spark's, read without a job; delta-spark's only needs the names)."""
        if (self.resolved_engine or self.engine) == "spark" and hasattr(batch.df, "mapInArrow"):
            self._check_batch_schema(None, list(batch.df.columns), batch.batch_id)
            return
        from fanout.delta_tables.distributed import arrow_schema_of
        from fanout_delta.schema import refuse_collated_keys

        df = batch.df
        schema = arrow_schema_of(df) if hasattr(df, "mapInArrow") else batch.arrow().schema
        self._check_batch_schema(schema, schema.names, batch.batch_id)
        if self.mode == "merge" and hasattr(df, "mapInArrow"):
            refuse_collated_keys(df.schema, self.keys or [], sink=self.name,
                                 batch_id=batch.batch_id)  # fmt: skip

    def _check_batch_schema(
        self, schema: pa.Schema | None, names: Sequence[str], batch_id: int | None
    ) -> None:
        """Refuse a batch holding two names that differ only in case, lacking a column an
        option names, or, for delta-rs, holding a ``VARIANT``, a ``GEOMETRY`` or a
        ``GEOGRAPHY`` (``schema``: the batch's Arrow schema, when known)."""
        from fanout_delta.schema import (
            check_option_columns,
            refuse_binary_partitions,
            refuse_case_duplicates,
            refuse_geospatial,
            refuse_variants,
        )

        options = {"keys": self.keys, "order_by": self.order_by, "partition_by": self.partition_by}
        refuse_case_duplicates(schema if schema is not None else names, sink=self.name,
                               batch_id=batch_id)  # fmt: skip
        check_option_columns(names, options, sink=self.name, batch_id=batch_id)
        if schema is not None and (self.resolved_engine or self.engine) == "rs":
            refuse_variants(schema, sink=self.name, batch_id=batch_id)
            refuse_geospatial(schema, sink=self.name, batch_id=batch_id)
            refuse_binary_partitions(schema, self.partition_by, sink=self.name,
                                     batch_id=batch_id)  # fmt: skip

    def _from_executors(self) -> bool:
        where = self.resolved_write_from or self._resolve_write_from(None)
        return self.mode == "append" and where == "executors"

    def _resolve_write_from(self, spark: Any) -> Literal["executors", "driver"]:
        """``write_from`` with ``"auto"`` decided (docs/architecture.md §8.1): the driver
        on a ``local[...]`` master or without a session to ask; the executors for a table
        on an object store, or on ``local-cluster`` (one host); the driver for a local
        path on any other cluster, whose executors may run where that path is not."""
        if self.write_from == "executors":
            return "executors"
        if self.write_from == "driver" or spark is None:
            return "driver"
        from fanout.contract.sessions import single_machine, spark_master

        if single_machine(spark):
            return "driver"
        if _on_object_store(self.path) or (spark_master(spark) or "").startswith("local-cluster"):
            return "executors"
        logger.info(
            "sink %r: writing from the driver: %s is a local path and the executors may run "
            "on other hosts; set write_from='executors' if every executor mounts it",
            self.name, self.path,
        )  # fmt: skip
        return "driver"

    def _error(self, message: str) -> ConfigurationError:
        return ConfigurationError(f"Delta sink {self.name!r}: {message}")

    def _check_options(self) -> None:
        if not self.path:
            raise self._error("option 'path' is required: set it to the table location")
        unusable = deltaio.unusable_location(self.path, self.storage_options)
        if unusable is not None:
            raise self._error(f"option 'path': {unusable}")
        if self.mode not in MODES:
            raise self._error(f"unknown mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        if self.engine not in ENGINES:
            raise self._error(
                f"unknown engine {self.engine!r}; valid engines: {', '.join(ENGINES)}"
            )
        for option in ("keys", "order_by", "partition_by"):
            value = getattr(self, option)
            if value is not None and (
                not isinstance(value, list)
                or not value
                or not all(isinstance(c, str) and c for c in value)
            ):
                raise self._error(
                    f"option {option!r} must be a non-empty list of column names, got {value!r}"
                )
        if self.mode == "merge" and not self.keys:
            raise self._error("mode 'merge' needs option 'keys': the columns to upsert on")
        if self.mode != "merge" and (self.keys or self.order_by):
            raise self._error(
                "options 'keys' and 'order_by' only apply to mode 'merge'; remove them or "
                "set mode='merge'"
            )
        every = self.compact_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every < 1):  # fmt: skip
            raise self._error(
                f"option 'compact_every' must be a positive integer (batches), got {every!r}"
            )
        floor = self.min_txn_retention_hours
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or floor < 0:
            raise self._error(
                f"option 'min_txn_retention_hours' must be a number of hours >= 0, got {floor!r}"
            )
        if self.write_from not in WRITE_FROM:
            raise self._error(
                f"option 'write_from' must be one of {', '.join(WRITE_FROM)}, got "
                f"{self.write_from!r}"
            )
        bound = self.max_merge_rows
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)
                                  or bound < 1):  # fmt: skip
            raise self._error(
                f"option 'max_merge_rows' must be a positive integer (rows) or null, got {bound!r}"
            )
        if not isinstance(self.merge_schema, bool):
            raise self._error(f"option 'merge_schema' must be true or false, got "
                              f"{self.merge_schema!r}")  # fmt: skip

    def _refuse_unquotable_keys(self) -> None:
        """Refuse a merge key holding a backtick with engine ``rs``: delta-rs' parser of the
        MERGE condition takes no quoting of one (neither doubled nor escaped), so the first
        batch would create the table and every later one fail on a parse error."""
        if self.resolved_engine != "rs" or self.mode != "merge":
            return
        unquotable = [k for k in self.keys or [] if "`" in k]
        if unquotable:
            raise self._error(
                f"merge key column(s) {', '.join(map(repr, unquotable))} hold a backtick, "
                "which delta-rs cannot quote in the MERGE condition; rename the column in "
                "the stream (withColumnRenamed) or use engine='spark'"
            )

    def _resolve_engine(self, spark: Any) -> Literal["rs", "spark"]:
        if self.engine == "rs":
            return "rs"
        from fanout_delta.spark_engine import delta_jvm_missing

        missing = delta_jvm_missing(spark)
        if missing is None:
            return "spark"
        if self.engine == "auto":
            logger.info("sink %r: engine auto uses delta-rs: %s", self.name, missing)
            return "rs"
        raise self._error(
            f"engine 'spark' cannot be used: {missing}. Use engine 'rs' (delta-rs, no jars) "
            "or 'auto'"
        )

    def _check_table(self, table: Any) -> None:
        columns = set(pa_schema(table).names)
        for option in ("keys", "order_by", "partition_by"):
            missing = [c for c in getattr(self, option) or [] if c not in columns]
            if missing:
                raise self._error(
                    f"option {option!r} names column(s) {', '.join(map(repr, missing))} not "
                    f"in the existing table at {self.path!r} "
                    f"(columns: {', '.join(sorted(columns))})"
                )
        existing = list(table.metadata().partition_columns)
        if self.partition_by is not None and self.partition_by != existing:
            raise self._error(
                f"option 'partition_by' is {self.partition_by!r} but the existing table at "
                f"{self.path!r} is partitioned by {existing!r}; use the table's partitioning "
                "(or omit the option)"
            )

    def _check_constraints(self, table: Any, spark: Any) -> None:
        """Refuse a CHECK constraint of the table Spark cannot evaluate: the sink could
        not tell which rows it refuses (:mod:`fanout_delta.constraints`)."""
        from fanout_delta.constraints import TableConstraints

        engine: Literal["rs", "spark"] = "spark" if self.resolved_engine == "spark" else "rs"
        constraints = TableConstraints.of(table, engine, spark=spark)
        constraints.check_expressions(spark, table, self.name)

    def _refuse_binary_partitions(self, table: Any) -> None:
        """Refuse (engine ``rs``) an existing table partitioned by a binary column."""
        from fanout_delta.schema import binary_columns, binary_partition_message

        binary = binary_columns(pa_schema(table), table.metadata().partition_columns)
        if binary:
            raise self._error(
                f"the existing table at {self.path!r}: {binary_partition_message(binary)}"
            )

    def _check_log_length(self, table: Any) -> None:
        """Warn when the table's log directory is long enough to slow every commit (a
        table on a local or mounted disk; an object store is not listed for it)."""
        from fanout.delta_tables import retention

        files = retention.log_files_on_disk(self.path)  # type: ignore[arg-type]
        if files is not None and files >= retention.LONG_LOG_FILES:
            where = f"Delta sink {self.name!r}: the table {self.path!r}"
            configuration = table.metadata().configuration
            logger.warning(retention.long_log_advice(where, files, configuration))

    def _check_txn_retention(self, configuration: Mapping[str, str | None] | None) -> None:
        """Refuse a ``delta.setTransactionRetentionDuration`` shorter than the option
        ``min_txn_retention_hours``; warn about any (see :mod:`fanout.delta_tables.retention`)."""
        from datetime import timedelta

        from fanout.delta_tables import retention as txn_retention

        where = f"Delta sink {self.name!r} (table {self.path!r})"
        retention = txn_retention.retention_of(configuration, where)
        if retention is None:
            return
        value = str((configuration or {})[txn_retention.PROPERTY])
        floor = timedelta(hours=self.min_txn_retention_hours)
        if retention < floor:
            raise ConfigurationError(
                txn_retention.short_retention_error(
                    where,
                    value,
                    floor,
                    "a batch written but not yet marked in the ledger when the pipeline stops "
                    "would be written again by a restart later than that",
                    "lower the sink's option 'min_txn_retention_hours' to the longest outage "
                    "after a crash you accept",
                )
            )
        logger.warning(
            "%s: table property %s = %r: a restart more than %s after a crash may write "
            "the batch that was in flight a second time", where, txn_retention.PROPERTY,
            value, retention,
        )  # fmt: skip

    def _repair_compactions(self, table: Any, context: SinkContext) -> None:
        """Take back a compaction of the table a run of this sink (or another's) committed
        and was killed before checking (:func:`fanout.delta_tables.compaction.repair_unchecked`);
        a repair that fails is logged, as a failed compaction is: the next one looks again.
        Without ``compact_every`` (removed since the crash) only when fanout compacted the
        table since its mark (``worth_a_scan``); the history of a table without fanout's mark
        is not read (``repair_unchecked`` returns at once): its next fanout compaction
        reads it back to the newest checked record.
        ``fanout validate`` (``context.checking``) changes nothing: it tells what the run
        would take back, and logs a refusal as the run does."""
        from fanout.delta_tables.compaction import (
            repair_unchecked,
            worth_a_scan,
            would_take_back,
        )

        what = f"sink {self.name!r} table {self.path}"
        try:
            if not (self.compact_every or worth_a_scan(table)):
                return
            if not context.checking:
                repair_unchecked(table, what, self.storage_options)
                return
            for version in would_take_back(table, what, self.storage_options):
                context.would(
                    f"take back the compaction committed at version {version} of {self.path} "
                    "(its process was killed before checking it: rows are in the table twice)"
                )
        except CompactionError as exc:  # rows stay duplicated: say so loudly
            logger.error("sink %r: %s", self.name, exc)
        except Exception:
            logger.warning(
                "sink %r: checking the earlier compactions of %s failed; the next compaction "
                "checks them again", self.name, self.path, exc_info=True,
            )  # fmt: skip

    def standing_problems(self) -> Sequence[str]:
        """A fanout compaction of the table that left rows twice and cannot be taken back
        (:func:`fanout.delta_tables.compaction.refused_compaction`), as its refusal says it."""
        from fanout.delta_tables.compaction import refused_compaction

        if self.path is None:
            return ()
        table = deltaio.open_table(self.path, self.storage_options)
        what = f"sink {self.name!r} table {self.path}"
        found = None if table is None else refused_compaction(table, what, self.storage_options)
        return () if found is None else (found,)

    def _maybe_compact(self, batch_id: int, engine: str, batch: Batch) -> None:
        every = self.compact_every
        if not every or (batch_id + 1) % every:
            return
        try:
            if engine == "spark":
                from fanout_delta.spark_engine import compact_spark

                compact_spark(batch.df.sparkSession, self.path)  # type: ignore[arg-type]
                logger.info("sink %r, batch %d: compacted %s", self.name, batch_id, self.path)
            else:
                from fanout_delta.rs_engine import compact_rs

                metrics = compact_rs(
                    self.path,  # type: ignore[arg-type]
                    self.storage_options,
                    f"sink {self.name!r} table {self.path}",
                )
                logger.info(
                    "sink %r, batch %d: compacted %s (%s files removed, %s added)",
                    self.name, batch_id, self.path,
                    metrics.get("numFilesRemoved"), metrics.get("numFilesAdded"),
                )  # fmt: skip
        except CompactionError as exc:  # rows stay duplicated: say so loudly
            logger.error("sink %r, batch %d: %s", self.name, batch_id, exc)
        except Exception:
            logger.warning(
                "sink %r, batch %d: compaction of %s failed; the batch is committed, the "
                "next compaction will retry", self.name, batch_id, self.path, exc_info=True,
            )  # fmt: skip


def _single_machine(spark: Any) -> bool:
    from fanout.contract.sessions import single_machine

    return bool(single_machine(spark))


def _never(texts: Sequence[str]) -> SinkResult:
    raise AssertionError("a sink writing alone has no shared outcomes to finish")


def _on_object_store(path: str | None) -> bool:
    """Whether ``path`` is an object-store URI (``s3://``, ``abfss://``...), which every
    executor reaches, rather than a path on a filesystem (``/data``, ``file:///data``)."""
    return path is not None and "://" in path and not path.startswith("file:")


def pa_schema(table: Any) -> Any:
    """A delta-rs table's schema as a ``pyarrow.Schema``."""
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def _as_text(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each number or boolean as the text delta-rs takes (it takes only
    text): ``true``/``false`` (as object_store and Delta properties spell them), a number
    as ``str`` gives it. Other values as given (``None``: a property left unset)."""
    return {k: _text(v) for k, v in values.items()}


def _text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def _as_list(value: Any) -> Any:
    """Accept a single column name where a list is expected (``keys: id`` in YAML).

    Anything that is not a string, list or tuple is kept as given, for :meth:`open` to
    reject with a message naming the option.
    """
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    return value


def _fences_after(table: Any, version: int, last: int) -> int:
    """How many of the commits after ``version`` up to ``last`` are, all of them, epoch
    fences or their lifts (:data:`fanout_delta.fence.FENCE_KEY`; 0 when any is not)."""
    from fanout.delta_tables.io import numbered_history
    from fanout_delta.fence import FENCE_KEY

    if last <= version:
        return 0
    try:
        after = numbered_history(table, last - version)
    except Exception:  # evidence only
        return 0
    if len(after) != last - version or any(FENCE_KEY not in info for info in after):
        return 0
    return last - version


def _restore_hint(path: str, version: int, last: int, fences: int = 0) -> str:
    """How to remove the commit ``version`` of the table at ``path`` (latest: ``last``,
    of which the ``fences`` last commits are epoch fences, holding no rows)."""
    if version == last - fences:
        commits = "the epoch fence commit" if fences == 1 else f"the {fences} epoch fence commits"
        fenced = (
            ""
            if not fences
            else f" but for {commits} after it (without rows; a new epoch's start fences again)"
        )
        return (
            f"Its rows are version {version} of the Delta table at {path}, the table's last "
            f"commit{fenced}: to remove them, restore the table to version {version - 1} "
            f"(delta-rs: DeltaTable(path).restore({version - 1}); Spark SQL: RESTORE TABLE "
            f"delta.`{path}` TO VERSION AS OF {version - 1})."
        )
    return (
        f"Its rows are version {version} of the Delta table at {path}; versions "
        f"{version + 1}-{last} came after it, so a restore to version {version - 1} would "
        f"remove those too: delete the rows version {version} added instead."
    )
