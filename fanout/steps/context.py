"""Step 1 of a batch: who and where we are (ARCHITECTURE §1).

Reads the streaming query id from the batch's Spark local properties and the batch's
source offsets and planning time from the checkpoint's ``offsets/<batch_id>`` (written by
Spark before the batch runs: a version line, a batch-metadata line with
``batchTimestampMs``, then one JSON line per source). Under Spark Connect, where neither the
local properties nor Hadoop's filesystems are reachable from Python, the query id is the
one the checkpoint's ``metadata`` file records (checked against the session's running
queries: with several, it must be the only one that can be running the batch) and the
checkpoint's files are read with pyarrow's filesystems. A batch replayed
after a crash is read from the same file; a batch Spark plans again (after a checkpoint
rollback) gets a new planning time, and the guard compares both with what the ledger
recorded.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.contract.sessions import is_connect
from fanout.errors import ConfigurationError

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
    """A small file of the checkpoint, read through Hadoop (any filesystem Spark reads);
    under Spark Connect, and for a ``file:`` root, through pyarrow's filesystems
    (:func:`read_file_directly`).

    Hadoop costs eight py4j round trips, ~5 ms on the batch's serial path; a ``file:`` root
    (what Spark resolves a local checkpoint to) is read in Python. A root without a scheme
    goes through Hadoop, whose default filesystem decides what it means.
    """
    if spark is None or is_connect(spark) or root.startswith("file:"):
        return read_file_directly(root, relative)
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


def read_file_directly(root: str, relative: str) -> str | None:
    """A small file under ``root`` read with pyarrow's filesystems: local paths
    (``/x``, ``file:/x``, ``file:///x``, unescaped as Hadoop writes them) and the URIs
    pyarrow knows (``s3://``, ``gs://``, ``hdfs://``, ``abfs://``...; Hadoop's ``s3a://``
    and ``s3n://`` are read as ``s3://``); ``None`` when it does not exist."""
    from pyarrow import fs as pafs

    filesystem, path = _filesystem(f"{root.rstrip('/')}/{relative}")
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(path) as stream:
        return bytes(stream.read()).decode()


def latest_batch_id(root: str, directory: str) -> int | None:
    """The highest batch id with a file in ``root``'s ``directory`` (``offsets`` or
    ``commits``), read with pyarrow's filesystems as :func:`read_file_directly` reads;
    ``None`` when it holds none (Spark's temporary and checksum files are not batches)."""
    from pyarrow import fs as pafs

    filesystem, path = _filesystem(f"{root.rstrip('/')}/{directory}")
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    found = filesystem.get_file_info(pafs.FileSelector(path))
    ids = [int(f.base_name) for f in found if f.base_name.isdigit()]
    return max(ids, default=None)


def _filesystem(location: str) -> tuple[Any, str]:
    """pyarrow's filesystem of ``location`` and the path in it: local paths (``/x``,
    ``file:/x``, ``file:///x``) and the URIs pyarrow knows."""
    from pyarrow import fs as pafs

    if location.startswith("file:") or "://" not in location:
        path = location.removeprefix("file://").removeprefix("file:")
        return pafs.LocalFileSystem(), os.path.abspath(path)
    filesystem, path = pafs.FileSystem.from_uri(pyarrow_uri(location))
    return filesystem, path


def pyarrow_uri(location: str) -> str:
    """``location`` as pyarrow names its filesystem: Hadoop's S3 connectors' schemes
    (``s3a://``, what Spark on S3 is usually given, and the older ``s3n://``) become
    ``s3://``; any other location is returned as it is."""
    scheme, separator, rest = location.partition("://")
    return f"s3://{rest}" if separator and scheme.lower() in ("s3a", "s3n") else location


def checkpoint_query_id(root: str) -> str | None:
    """The query id a checkpoint belongs to (its ``metadata`` file: ``{"id": ...}``), or
    ``None`` before the query first started."""
    text = read_file_directly(root, "metadata")
    if text is None:
        return None
    value = json.loads(text.splitlines()[0]).get("id")
    return str(value) if value else None


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
        self._connect_query: str | None = None  # under Spark Connect, checked once
        self._warned = False

    def location(self, query_id: str | None) -> str | None:
        """The checkpoint of query ``query_id``, when given or already looked up."""
        return self.checkpoint_location or self._found.get(query_id or "")

    def known_location(self) -> str | None:
        """The checkpoint, when given, or looked up for the one query whose batches this
        reader read; ``None`` otherwise. Asks Spark nothing."""
        found = {location for location in self._found.values() if location is not None}
        return self.checkpoint_location or (found.pop() if len(found) == 1 else None)

    def read(self, batch_df: Any, batch_id: int) -> BatchInfo:
        """Pipeline, batch id, query id, source offsets and planning time of the batch."""
        query_id = query_id_of(batch_df)
        if query_id is None and is_connect(batch_df):
            query_id = self._connect_query_id(batch_df, int(batch_id))
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

    def _connect_query_id(self, batch_df: Any, batch_id: int) -> str:
        """Under Spark Connect: the query id recorded in the checkpoint, once it is known
        to be the query running this batch (a wrong ``checkpoint_location`` would otherwise
        read another query's id, offsets and planning time): one of the session's running
        queries and, when several run, the only one that can be running ``batch_id``
        (:func:`confirm_connect_query`). Checked on the first batch only."""
        location = self.checkpoint_location
        if location is None:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: under Spark Connect fanout cannot ask Spark for "
                "the query's checkpoint; pass FanOut(checkpoint_location=...) the query's "
                "checkpointLocation"
            )
        if self._connect_query is not None:
            return self._connect_query
        query_id = checkpoint_query_id(location)
        queries = list(batch_df.sparkSession.streams.active)
        running = sorted(str(q.id) for q in queries)
        if query_id is None or query_id not in running:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: checkpoint_location {location} "
                + (
                    "holds no query metadata"
                    if query_id is None
                    else f"belongs to query {query_id}"
                )
                + f", and the queries running in this session are {running or 'none'}: pass "
                "FanOut(checkpoint_location=...) the query's own checkpointLocation"
            )
        if len(queries) > 1:
            confirm_connect_query(self.pipeline, location, query_id, queries, batch_id)
        self._connect_query = query_id
        return query_id

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


_ONE_SESSION_A_QUERY = (
    "run each fanout query from a Spark Connect session of its own (on the client: "
    "SparkSession.builder.remote(url).create() per query), where it is the only running "
    "query, or pass FanOut(checkpoint_location=...) the query's own checkpointLocation"
)


def confirm_connect_query(
    pipeline: str, location: str, query_id: str, queries: list[Any], batch_id: int
) -> None:
    """Under Spark Connect, with several queries running in the session: refuse unless the
    checkpoint's query ``query_id`` is the only one that can be running ``batch_id``.

    The foreachBatch process is handed the DataFrame and the batch id only, not the query.
    The query running batch N has ``offsets/N`` in its checkpoint and no ``commits/N`` yet
    (Spark writes it after the batch), its ``status`` shows a trigger active, and its last
    progress, when it has one in this run, is of batch N-1 (or of N, an idle trigger's
    report): all stay so while this call blocks the batch. A running query for which one of
    these is false is not this batch's; one that cannot be told apart is, possibly.
    """
    try:
        offsets = read_file_directly(location, f"offsets/{batch_id}")
        committed = read_file_directly(location, f"commits/{batch_id}")
    except Exception:  # a filesystem pyarrow cannot read: the queries' states decide
        offsets, committed = "", None
    others = sorted(str(q.id) for q in queries if str(q.id) != query_id)
    if offsets is None or committed is not None:
        state = f"has no offsets/{batch_id}" if offsets is None else f"committed batch {batch_id}"
        raise ConfigurationError(
            f"pipeline {pipeline!r}: checkpoint_location {location} belongs to query "
            f"{query_id}, whose checkpoint {state}, so batch {batch_id} is not that query's "
            f"but one of the other queries running in this session ({', '.join(others)}): "
            + _ONE_SESSION_A_QUERY
        )
    possible = sorted(str(q.id) for q in queries if str(q.id) != query_id and _may_run(q, batch_id))
    if possible:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: under Spark Connect fanout cannot tell which query runs "
            f"batch {batch_id}: the query {query_id} of checkpoint_location {location} or "
            f"{'query' if len(possible) == 1 else 'queries'} {', '.join(possible)}, running in "
            f"the same session and possibly at batch {batch_id} too (the foreachBatch "
            "function is handed no query id); taking the wrong one would hide a reset of "
            "this query's checkpoint: " + _ONE_SESSION_A_QUERY
        )


def _may_run(query: Any, batch_id: int) -> bool:
    """Whether the running ``query`` can be running ``batch_id`` now (``True`` when its
    status or progress cannot be read)."""
    try:
        if not query.status["isTriggerActive"]:
            return False
        progress = query.lastProgress
        return progress is None or int(progress["batchId"]) in (batch_id - 1, batch_id)
    except Exception:
        return True
