"""Step 1 of a batch: who and where we are (ARCHITECTURE §1).

Reads the streaming query id from the batch's Spark local properties and the batch's
source offsets and planning time from the checkpoint's ``offsets/<batch_id>`` (written by
Spark before the batch runs: a version line, a batch-metadata line with
``batchTimestampMs``, then one JSON line per source). A batch replayed after a crash is
read from the same file; a batch Spark plans again (after a checkpoint rollback) gets a
new planning time, and the guard compares both with what the ledger recorded.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from fanout.contract.batch import BatchInfo

log = logging.getLogger(__name__)


def query_id_of(batch_df: Any) -> str | None:
    """The streaming query id of a foreachBatch DataFrame, or ``None`` outside a stream."""
    try:
        return batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # not a classic Spark DataFrame
        return None


def checkpoint_root(query_id: str) -> str | None:
    """The resolved checkpoint location of the active query ``query_id``.

    The batch DataFrame's own session is a clone that does not know the query; the
    session that started it is the active one in the foreachBatch callback thread.
    """
    from pyspark.sql import SparkSession

    for session in (SparkSession.getActiveSession(), SparkSession.builder.getOrCreate()):
        if session is None:
            continue
        query = session.streams.get(query_id)
        if query is not None:
            return str(query._jsq.streamingQuery().resolvedCheckpointRoot())
    return None


@dataclass(frozen=True)
class PlannedBatch:
    """What an ``offsets/N`` file says about batch N: the end offsets per source (``None``
    for a source without one) and when Spark planned it (``None`` when not recorded)."""

    source_offsets: list[Any]
    batch_timestamp_ms: int | None


def parse_offset_log(text: str) -> PlannedBatch:
    """The source offsets and planning time of an ``offsets/N`` file."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ValueError("not a Spark offset log file (no version line)")
    offsets = [
        None if line.strip() == "-" else json.loads(line) for line in lines[2:] if line.strip()
    ]
    return PlannedBatch(offsets, _batch_timestamp(lines[1] if len(lines) > 1 else ""))


def _batch_timestamp(metadata_line: str) -> int | None:
    try:
        value = json.loads(metadata_line).get("batchTimestampMs")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_offset_file(text: str) -> list[Any]:
    """The per-source offsets of an ``offsets/N`` file (``None`` for a source without one)."""
    return parse_offset_log(text).source_offsets


def read_checkpoint_file(spark: Any, root: str, relative: str) -> str | None:
    """A small file of the checkpoint, read through Hadoop (any filesystem Spark reads)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{root.rstrip('/')}/{relative}")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        scanner = jvm.java.util.Scanner(stream, "UTF-8").useDelimiter("\\A")
        return str(scanner.next()) if scanner.hasNext() else ""
    finally:
        stream.close()


class ContextReader:
    """Builds the :class:`BatchInfo` of each batch; remembers the checkpoint location.

    :param pipeline: the pipeline name.
    :param checkpoint_location: the query's checkpoint, when known up front; otherwise it
        is looked up from the running query once.
    """

    def __init__(self, pipeline: str, checkpoint_location: str | None = None) -> None:
        self.pipeline = pipeline
        self.checkpoint_location = checkpoint_location
        self._found: dict[str, str | None] = {}  # query id -> its checkpoint, looked up once
        self._warned = False

    def read(self, batch_df: Any, batch_id: int) -> BatchInfo:
        """Pipeline, batch id, query id, source offsets and planning time of the batch."""
        query_id = query_id_of(batch_df)
        planned = self._planned(batch_df, query_id, batch_id)
        if planned is None:
            return BatchInfo(self.pipeline, int(batch_id), query_id)
        return BatchInfo(
            self.pipeline,
            int(batch_id),
            query_id,
            planned.source_offsets,
            batch_timestamp_ms=planned.batch_timestamp_ms,
        )

    def _planned(self, batch_df: Any, query_id: str | None, batch_id: int) -> PlannedBatch | None:
        try:
            location = self.checkpoint_location
            if location is None and query_id is not None:
                if query_id not in self._found:
                    self._found[query_id] = checkpoint_root(query_id)
                location = self._found[query_id]
            if location is None:
                raise LookupError("checkpoint location unknown")
            text = read_checkpoint_file(batch_df.sparkSession, location, f"offsets/{batch_id}")
            if text is None:
                raise LookupError(f"{location}/offsets/{batch_id} not found")
            return parse_offset_log(text)
        except Exception as exc:
            if not self._warned:
                log.warning(
                    "pipeline %s: cannot read source offsets from the checkpoint (%s); the "
                    "ledger will not record them, which makes recovery after a lost "
                    "checkpoint harder, and fanout cannot tell a crash replay from a "
                    "rolled-back checkpoint. Pass FanOut(checkpoint_location=...) to fix it.",
                    self.pipeline,
                    exc,
                )
                self._warned = True
            return None
