"""The delta-rs engine's append from the executors (option ``write_from="executors"``, the
default for ``mode="append"``): the Spark tasks write the Parquet files, the driver
commits them once with the batch's app transaction
(:func:`fanout.delta_tables.distributed.append_distributed`). No row passes through the
driver, so its memory does not grow with the batch.

A batch whose table uses a feature the executor writer does not implement (column
mapping, CHECK constraints, generated or identity columns, ...) is written from the
driver instead, with a log line saying why.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.delta_tables import distributed
from fanout.delta_tables import io as deltaio
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
        )
    except Exception as exc:
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


def _count(source: Any) -> int:
    """The rows of a batch found already written (a replay: rare, so a count is fine)."""
    return int(source.count()) if hasattr(source, "mapInArrow") else int(source.num_rows)
