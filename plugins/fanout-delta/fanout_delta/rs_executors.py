"""The delta-rs engine's append from the executors (option ``write_from="executors"``, the
default for ``mode="append"``): the Spark tasks write the Parquet files, the driver
commits them once with the batch's app transaction
(:func:`fanout.delta_tables.distributed.append_distributed`). No row passes through the
driver, so its memory does not grow with the batch.

Each task calls the per-partition commit hook ``fanout_partition_commit`` (when a plugin
implements it) once its files are written and closed, before it hands their descriptions
to the driver: what the hook raises fails the task, whose files stay unreferenced. There
is no ``fanout_partition_committed``: the partitions commit together, on the driver.

A batch whose table uses a feature the executor writer does not implement (column
mapping, CHECK constraints, generated or identity columns, ...) is written from the
driver instead, with a log line saying why.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.delta_tables import distributed
from fanout.delta_tables import io as deltaio
from fanout.delta_tables.datafiles import FileWriter, file_rows
from fanout.errors import TransientSinkError
from fanout.partitioned.task import CommitHooks
from fanout_delta.rs_engine import translate_error
from fanout_delta.schema import check_batch_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout_delta.target import DeltaTarget

logger = logging.getLogger(__name__)


def append_from_executors(sink: DeltaTarget, batch: Batch) -> SinkResult | None:
    """Append ``batch`` with files written by the executors, exactly once per batch id;
    ``None`` when this table needs the driver-side writer (the caller then uses it)."""
    key = batch.idempotency_key
    batch_id = key.version
    # A Spark DataFrame is written by its tasks; a batch without Spark (a test double,
    # an Arrow batch) by the same writer in this process.
    source: Any = batch.df if hasattr(batch.df, "mapInArrow") else batch.arrow()
    batch_schema = distributed.arrow_schema_of(source)
    table = deltaio.open_table(sink.path, sink.storage_options)
    reasons = distributed.blockers(table, sink.partition_by, batch_schema)
    if reasons:
        logger.info(
            "sink %r, batch %d: writing from the driver, the executor writer does not "
            "support %s", sink.name, batch_id, ", ".join(reasons),
        )  # fmt: skip
        return None

    def check(table_schema: pa.Schema, schema: pa.Schema) -> None:
        check_batch_schema(
            table_schema, schema, merge_schema=sink.merge_schema, sink=sink.name,
            batch_id=batch_id,
        )  # fmt: skip

    hooks = None
    if sink.hook_plugins is not None:
        info = batch.info
        hooks = sink.hook_plugins.hooks(info.pipeline, sink.name, batch_id, info.epoch)
    try:
        outcome = distributed.append_distributed(
            source,
            sink.path,
            app_id=key.app_id,
            version=batch_id,
            partition_by=sink.partition_by,
            storage_options=sink.storage_options,
            configuration=sink.configuration,
            merge_schema=sink.merge_schema,
            check=check,
            task=functools.partial(HookedWriter, hooks=hooks) if hooks and hooks.wanted else None,
        )
    except Exception as exc:
        transient = transient_in_task(exc, sink.name, batch_id)
        if transient is not None:
            raise transient from exc
        table = deltaio.open_table(sink.path, sink.storage_options)
        raise translate_error(exc, sink, batch_id, batch_schema, table) from exc
    if outcome.already_written:
        logger.info("sink %r, batch %d: already in %s, skipped", sink.name, batch_id, sink.path)
        return SinkResult(_count(source), already_written=True)
    if outcome.empty:
        # Nothing to commit: the ledger records the batch, and a replay is empty again.
        return SinkResult(0, {"empty": True, "mode": sink.mode})
    details = {"mode": sink.mode, "version": outcome.version, "files": outcome.files,
               "write_from": "executors"}  # fmt: skip
    return SinkResult(rows=outcome.rows, details=details)


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
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        files = self.writer.write(batches)
        rows = sum(f.rows for f in files)
        self.hooks.before(partition, rows, rows)
        yield from file_rows(files)
