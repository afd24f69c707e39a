"""The delta-rs engine's append from the executors (option ``write_from="executors"``, the
default for ``mode="append"``): the Spark tasks write the Parquet files, the driver
commits them once with the batch's app transaction
(:func:`fanout.delta_tables.distributed.append_distributed`). No row passes through the
driver, so its memory does not grow with the batch.

Each task calls the per-partition commit hook ``fanout_partition_commit`` (when a plugin
implements it) once its files are written and closed, before it hands their descriptions
to the driver: what the hook raises fails the task, whose files stay unreferenced. There
is no ``fanout_partition_committed``: the partitions commit together, on the driver.

A batch whose table has a feature or ``delta.*`` property the executor writer is not
known to handle (:func:`fanout.delta_tables.distributed.blockers`, an allowlist) is
written from the driver instead, with a log line saying why, once per sink.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.delta_tables import distributed
from fanout.delta_tables import io as deltaio
from fanout.delta_tables.datafiles import DataFile, FileWriter, file_rows
from fanout.delta_tables.values import UnstorablePartitionValue, spark_unstorable
from fanout.errors import SinkError, SinkWriteError, TransientSinkError
from fanout.partitioned.task import CommitHooks, task_partition
from fanout_delta.constraints import (
    TableConstraints,
    refuse_spark,
    split_refused_spark,
    write_refused,
)
from fanout_delta.fence import batch_version, fenced_error, refuse_vanished_sink
from fanout_delta.partition_values import (
    partition_columns,
    split_unstorable,
    split_unstorable_spark,
)
from fanout_delta.plans import commit_metadata, refuse_replanned, taken_out
from fanout_delta.rs_engine import translate_error
from fanout_delta.schema import check_batch_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

    from fanout.contract.dead_letters import DeadLetter
    from fanout.contract.sharing import SharedWrite
    from fanout_delta.target import DeltaTarget

logger = logging.getLogger(__name__)


def append_from_executors(sink: DeltaTarget, batch: Batch) -> SinkResult | None:
    """Append ``batch`` with files written by the executors, exactly once per batch id;
    ``None`` when this table needs the driver-side writer (the caller then uses it)."""
    # A Spark DataFrame is written by its tasks; a batch without Spark (a test double,
    # an Arrow batch) by the same writer in this process.
    source: Any = batch.df if hasattr(batch.df, "mapInArrow") else batch.arrow()
    append = _ExecutorAppend.of(sink, batch, distributed.arrow_schema_of(source))
    if append is None:
        return None
    source, dead = append.set_aside(source)
    try:
        outcome = append.pending().run(source, append.task)
    except Exception as exc:
        _raise(append, exc)
    return append.result(outcome, lambda: _count(source), dead)


def shared_append(sink: DeltaTarget, batch: Batch) -> SharedWrite | None:
    """The executors' append of ``batch`` as a member of a job shared with other sinks
    (:mod:`fanout.contract.sharing`): the table is checked and the writer made here, each
    task writes the rows of its partition, whatever the partitioning, into files of its
    own, and :attr:`SharedWrite.finish` commits them all once with the batch's app
    transaction. ``None`` when the table needs the driver-side writer, or already records
    the batch (the sink's own write then says so), or when rows may go to the dead-letter
    target (a partition value no Delta table can keep: the sink's own write filters them
    out first)."""
    from fanout.contract.sharing import SharedWrite

    append = _ExecutorAppend.of(sink, batch, distributed.arrow_schema_of(batch.df))
    if append is None:
        return None
    if sink.dead_letters is not None and (
        spark_unstorable(batch.df.schema, partition_columns(sink, append.opened), engine="rs")
        or append.constraints.on(batch.df.schema)
    ):
        return None  # rows may go to the dead letters: a job of its own filters them out
    append.refuse_constrained(batch.df)
    pending = append.pending()
    try:
        writer = pending.writer()
    except Exception as exc:
        _raise(append, exc)
    if writer is None:
        return None

    def commit(files: Sequence[DataFile]) -> SinkResult:
        try:
            outcome = pending.commit(files)
        except Exception as exc:
            _raise(append, exc)
        return append.result(outcome, lambda: sum(f.rows for f in files))

    def finish(texts: Sequence[str]) -> SinkResult:
        written = [TaskFiles.from_json(text) for text in texts]
        failed = [w for w in written if w.error is not None]
        if failed:
            raise append.task_failure(failed)
        return commit([f for w in written for f in w.files])

    def alone() -> SinkResult:  # the group did not form: the same files, in a job of its own
        try:
            files = distributed.write_files(batch.df, writer, append.task)
        except Exception as exc:
            _raise(append, exc)
        return commit(files)

    columns = tuple((name, name) for name in append.schema.names)
    return SharedWrite(SharedFiles(writer, append.hooks), columns, "any", finish, alone)


def _raise(append: _ExecutorAppend, exc: Exception) -> NoReturn:
    """Raise the sink's error for ``exc`` (:meth:`_ExecutorAppend.error`): ``exc`` itself
    when it is already one (a refusal such as :class:`fanout_delta.fence.EpochFencedError`),
    never as its own cause (a loop for code walking ``__cause__``)."""
    error = append.error(exc)
    if error is exc:
        raise exc
    raise error from exc


@dataclass(frozen=True)
class _ExecutorAppend:
    """What both executor appends need on the driver: the checks and hooks before, the
    error and the result after."""

    sink: DeltaTarget
    batch_id: int
    app_id: str
    schema: pa.Schema
    hooks: CommitHooks | None
    batch: Batch = field(repr=False, compare=False)
    opened: DeltaTable | None = field(default=None, repr=False, compare=False)
    """The table as :meth:`of` found it: the append's first snapshot (opened once)."""

    @classmethod
    def of(cls, sink: DeltaTarget, batch: Batch, schema: pa.Schema) -> _ExecutorAppend | None:
        """``None`` when the table uses a feature the executor writer lacks (logged)."""
        table = sink.latest_table()
        reasons = distributed.blockers(table, sink.partition_by, schema, sink.configuration)
        if reasons:
            _log_step_back(sink, batch.batch_id, ", ".join(reasons))
            sink.keep_table(table)  # the driver's writer starts from it
            return None
        hooks = None
        if sink.hook_plugins is not None:
            info = batch.info
            hooks = sink.hook_plugins.hooks(info.pipeline, sink.name, batch.batch_id, info.epoch)
        hooks = hooks if hooks and hooks.wanted else None
        return cls(sink, batch.batch_id, batch.idempotency_key.app_id, schema, hooks, batch, table)

    def pending(self) -> distributed.PendingAppend:
        """The exactly-once append of this batch, checked by :meth:`check`."""
        sink = self.sink
        return distributed.PendingAppend(
            distributed.delta_schema(self.schema), sink.path, app_id=self.app_id,
            version=self.batch_id, partition_by=sink.partition_by,
            storage_options=sink.storage_options, configuration=sink.configuration,
            merge_schema=sink.merge_schema, check=self.check, opened=self.opened,
            kept=sink.kept, metadata=commit_metadata(self.batch), taken_out=self.taken_out,
            refuse=self.fenced, first_write=self.first_write,
        )  # fmt: skip

    def first_write(self, table: Any) -> None:
        """Refuse, before anything is written, a first write of the sink's app id to a
        table holding this batch of a sink the pipeline no longer configures (a renamed
        sink: :func:`fanout_delta.fence.refuse_vanished_sink`)."""
        sink = self.sink
        if sink.sinks:
            refuse_vanished_sink(table, self.batch, sink.name, str(sink.path), sink.sinks,
                                 sink.rewrite_harmless, sink.storage_options)  # fmt: skip

    def fenced(self, table: Any) -> Exception:
        """The refusal of the batch, whose app transaction carries a later epoch's fence
        in ``table`` (:mod:`fanout_delta.fence`)."""
        return fenced_error(table, self.app_id, sink=self.sink.name, path=str(self.sink.path),
                            pipeline=self.batch.pipeline, epoch=self.batch.info.epoch,
                            batch_id=self.batch_id)  # fmt: skip

    def taken_out(self, table: Any) -> bool:
        """Whether a RESTORE took the batch ``table`` records out again
        (:func:`fanout_delta.plans.taken_out`): then it is written again, not skipped."""
        if not taken_out(table, self.app_id, self.batch_id, self.sink.storage_options):
            return False
        logger.warning(
            "sink %r, batch %d: %s records the batch's transaction, but a RESTORE since its "
            "commit took its rows out; writing it again",
            self.sink.name, self.batch_id, self.sink.path,
        )  # fmt: skip
        return True

    def holds(self) -> bool:
        """Whether the table as :meth:`of` found it holds the batch: its app transaction
        at the batch or past it, and no RESTORE took it out since. A later epoch's fence
        refuses (:func:`fanout_delta.fence.batch_version`)."""
        sink = self.sink
        done = batch_version(self.opened, self.batch, sink.name, str(sink.path),
                             sinks=sink.sinks, harmless=sink.rewrite_harmless,
                             storage_options=sink.storage_options)  # fmt: skip
        if done is None or done < self.batch_id:
            return False
        return not taken_out(self.opened, self.app_id, self.batch_id, self.sink.storage_options)

    @property
    def task(self) -> distributed.TaskWrapper | None:
        """What each task of the sink's own job runs: the writer, with the hooks."""
        return functools.partial(HookedWriter, hooks=self.hooks) if self.hooks else None

    def check(self, table_schema: pa.Schema, schema: pa.Schema) -> None:
        """The batch's schema against the table's (raises naming the columns)."""
        check_batch_schema(
            table_schema, schema, merge_schema=self.sink.merge_schema, sink=self.sink.name,
            batch_id=self.batch_id,
        )  # fmt: skip

    @functools.cached_property
    def constraints(self) -> TableConstraints:
        """The table's constraints, as the snapshot :meth:`of` opened holds them (read
        once: a batch asks up to four times, and each read rewrites every CHECK)."""
        return TableConstraints.of(self.opened, spark=getattr(self.batch.df, "sparkSession", None))

    def refuse_constrained(self, source: Any) -> None:
        """Without a dead-letter target, fail the batch before any task writes when one of
        its rows breaks the table's constraints (a NOT NULL column: a table with CHECK
        constraints is written from the driver), naming the constraint and the row, as
        the driver's writer does (a Spark DataFrame only; the tasks refuse a null in a
        NOT NULL column anyway, less clearly)."""
        if self.sink.dead_letters is None and hasattr(source, "mapInArrow"):
            refuse_spark(source, self.constraints, sink=self.sink.name,
                         batch_id=self.batch_id, table=self.sink.path)  # fmt: skip

    def set_aside(self, source: Any) -> tuple[Any, int]:
        """``source`` without the rows whose partition value no Delta table can keep or
        that break the table's constraints, and how many went to the sink's dead-letter
        target (written first, idempotently, as the driver's writer does); without a
        target, ``source`` as it is once no row breaks a constraint (the tasks refuse a
        partition value, failing the batch)."""
        dead_letters = self.sink.dead_letters
        if dead_letters is None:
            self.refuse_constrained(source)
            return source, 0
        columns = partition_columns(self.sink, self.opened)
        broken: list[DeadLetter] = []
        if hasattr(source, "mapInArrow"):
            source, broken = split_refused_spark(source, self.constraints, sink=self.sink.name,
                                                 batch_id=self.batch_id)  # fmt: skip
            source, letters = split_unstorable_spark(source, columns, engine="rs")
        else:
            source, letters = split_unstorable(source, columns)
        letters = [*broken, *letters]
        if not letters:
            return source, 0
        if self.holds():  # its letters were written before its commit: see the rs engine
            return source, len(letters)
        return source, write_refused(dead_letters, self.batch, letters, self.constraints,
                                     self.sink.path)  # fmt: skip

    def error(self, exc: Exception) -> Exception:
        """The sink's error for what the append raised."""
        refused = unstorable_in_task(exc, self.sink.name, self.batch_id)
        if refused is not None:
            return refused
        if isinstance(exc, distributed.UnfitTableError):
            return TransientSinkError(str(exc), sink=self.sink.name, batch_id=self.batch_id)
        transient = transient_in_task(exc, self.sink.name, self.batch_id)
        if transient is not None:
            return transient
        table = deltaio.open_table(self.sink.path, self.sink.storage_options)
        return translate_error(exc, self.sink, self.batch_id, self.schema, table)

    def task_failure(self, failed: Sequence[TaskFiles]) -> SinkError:
        """The error of a shared job whose tasks failed to write this sink's files (none
        is committed): transient when every failure is; the refusal of a partition value
        no Delta table can keep, as the sink's own job says it, when a task refused one."""
        for w in failed:
            refused = unstorable_in_task(Exception(w.error), self.sink.name, self.batch_id)
            if refused is not None:
                return refused
        lines = [f"{len(failed)} task(s) of the shared job failed to write the files; "
                 "nothing was committed"]  # fmt: skip
        lines += [f"  - p{w.partition}: {w.error}" for w in failed]
        error = TransientSinkError if all(w.transient for w in failed) else SinkWriteError
        return error("\n".join(lines), sink=self.sink.name, batch_id=self.batch_id)

    def result(
        self, outcome: distributed.AppendOutcome, rows: Callable[[], int], dead: int = 0
    ) -> SinkResult:
        """The sink's result of ``outcome`` (``rows``: the batch's, when found written;
        ``dead``: its rows set aside as dead letters); raises
        :class:`fanout.CheckpointRollbackError` rather than skip a batch the table holds
        under another plan."""
        sink, batch_id = self.sink, self.batch_id
        if outcome.already_written:
            if self.batch.info.batch_timestamp_ms is not None:  # else no plan to compare
                table = deltaio.open_table(sink.path, sink.storage_options)  # a replay: rare
                refuse_replanned(self.batch, sink.name, sink.path, table, ledger=sink.ledger)
            logger.info("sink %r, batch %d: already in %s, skipped", sink.name, batch_id, sink.path)
            return SinkResult(rows(), dead_lettered=dead, already_written=True)
        if outcome.empty:
            # Nothing to commit: the ledger records the batch, and a replay is empty again.
            return SinkResult(0, {"empty": True, "mode": sink.mode}, dead_lettered=dead)
        details = {"mode": sink.mode, "version": outcome.version, "files": outcome.files,
                   "write_from": "executors"}  # fmt: skip
        return SinkResult(rows=outcome.rows, details=details, dead_lettered=dead)


def _log_step_back(sink: DeltaTarget, batch_id: int, reasons: str) -> None:
    """Say at INFO why the executors' append steps back to the driver's writer: once per
    sink and reason, not every batch."""
    if sink.stepped_back is not None:
        if reasons in sink.stepped_back:
            return
        sink.stepped_back.add(reasons)
    logger.info(
        "sink %r, batch %d: writing from the driver (delta-rs' writer; logged once for "
        "the sink): the executors' writer is not known to handle %s",
        sink.name, batch_id, reasons,
    )  # fmt: skip


_RAISED_IN_TASK = "fanout.errors.TransientSinkError: "


def transient_in_task(exc: Exception, sink: str, batch_id: int) -> TransientSinkError | None:
    """A :class:`fanout.TransientSinkError` a Spark task raised (a commit hook's veto, as
    Spark reports it: inside the text of the job's error), raised again on the driver
    so the batch may replay; ``None`` for any other error."""
    text = str(exc)
    if _RAISED_IN_TASK not in text:
        return None
    message = text.rsplit(_RAISED_IN_TASK, 1)[1].splitlines()[0]
    message = re.sub(r"^sink '.*?', batch \d+: ", "", message)
    return TransientSinkError(f"a Spark task failed transiently: {message}", sink=sink,
                              batch_id=batch_id)  # fmt: skip


_REFUSED_IN_TASK = "UnstorablePartitionValue: "


def unstorable_in_task(exc: Exception, sink: str, batch_id: int) -> SinkWriteError | None:
    """The sink's error for a partition value no Delta table can keep, which a task of
    the executors' append refused (raised as it is when the writer ran in this process;
    inside the text of the job's error from Spark); ``None`` for any other error."""
    if isinstance(exc, UnstorablePartitionValue):
        message = str(exc)
    elif _REFUSED_IN_TASK in str(exc):
        message = str(exc).rsplit(_REFUSED_IN_TASK, 1)[1].splitlines()[0]
    else:
        return None
    return SinkWriteError(message, sink=sink, batch_id=batch_id)


def _count(source: Any) -> int:
    """The rows of a batch found already written (a replay: rare, so a count is fine)."""
    return int(source.count()) if hasattr(source, "mapInArrow") else int(source.num_rows)


@dataclass(frozen=True)
class HookedWriter:
    """A Spark task of the executors' append that calls ``fanout_partition_commit`` once
    its files are written, before it hands them to the driver (pickled to the executors)."""

    writer: FileWriter
    hooks: CommitHooks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Write this task's rows, call the hook, yield one row per file."""
        yield from file_rows(_written(self.writer, self.hooks, task_partition(), batches))


def _written(
    writer: FileWriter, hooks: CommitHooks | None, partition: int,
    batches: Iterator[pa.RecordBatch],
) -> list[DataFile]:  # fmt: skip
    """``partition``'s files, written and closed, then ``fanout_partition_commit``: what
    the hook raises leaves them unreferenced."""
    files = writer.write(batches)
    if hooks is not None:
        rows = sum(f.rows for f in files)
        hooks.before(partition, rows, rows)
    return files


@dataclass(frozen=True)
class TaskFiles:
    """What one task of a shared job wrote for the Delta sink: its files, or its error.

    :param partition: the task's partition.
    :param files: the data files written and closed (none committed yet).
    :param error: what went wrong (``None`` when the files are complete).
    :param transient: whether a replay of the batch may succeed.
    """

    partition: int
    files: tuple[DataFile, ...] = ()
    error: str | None = None
    transient: bool = False

    def to_json(self) -> str:
        """The task's outcome text."""
        return json.dumps({"partition": self.partition, "files": [f.to_json() for f in self.files],
                           "error": self.error, "transient": self.transient})  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> TaskFiles:
        """Parse what :meth:`to_json` wrote."""
        data = json.loads(text)
        files = tuple(DataFile.from_json(f) for f in data["files"])
        return cls(data["partition"], files, data["error"], data["transient"])


@dataclass(frozen=True)
class SharedFiles:
    """The Delta sink's task in a shared job (:class:`fanout.contract.sharing.SharedTask`):
    writes the partition's rows into files and calls ``fanout_partition_commit`` once they
    are closed, as :class:`HookedWriter` does."""

    writer: FileWriter
    hooks: CommitHooks | None = None

    def run(self, partition: int, batches: Iterator[pa.RecordBatch]) -> str:
        """Write ``partition``'s rows; the files, or the error, as text."""
        try:
            files = _written(self.writer, self.hooks, partition, batches)
        except Exception as exc:  # its files stay unreferenced, as a failed task's
            return self.failed(partition, exc)
        return TaskFiles(partition, tuple(files)).to_json()

    def failed(self, partition: int, error: BaseException) -> str:
        """``partition``'s outcome when writing it raised ``error``."""
        transient = isinstance(error, TransientSinkError)
        return TaskFiles(partition, error=f"{type(error).__name__}: {error}",
                         transient=transient).to_json()  # fmt: skip
