"""Step 1 of a batch: who and where we are (ARCHITECTURE §1).

Reads the streaming query id from the batch's Spark local properties and the batch's
source offsets from the checkpoint's ``offsets/<batch_id>`` (written by Spark before the
batch runs: a version line, a batch-metadata line, then one JSON line per source).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fanout.sink import BatchInfo

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


def parse_offset_file(text: str) -> list[Any]:
    """The per-source offsets of an ``offsets/N`` file (``None`` for a source without one)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ValueError("not a Spark offset log file (no version line)")
    return [None if line.strip() == "-" else json.loads(line) for line in lines[2:] if line.strip()]


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
        """Pipeline, batch id, query id and source offsets of the batch."""
        query_id = query_id_of(batch_df)
        offsets = self._offsets(batch_df, query_id, batch_id)
        return BatchInfo(self.pipeline, int(batch_id), query_id, offsets)

    def _offsets(self, batch_df: Any, query_id: str | None, batch_id: int) -> list[Any] | None:
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
            return parse_offset_file(text)
        except Exception as exc:
            if not self._warned:
                log.warning(
                    "pipeline %s: cannot read source offsets from the checkpoint (%s); the "
                    "ledger will not record them, which makes recovery after a lost "
                    "checkpoint harder. Pass FanOut(checkpoint_location=...) to fix it.",
                    self.pipeline,
                    exc,
                )
                self._warned = True
            return None
