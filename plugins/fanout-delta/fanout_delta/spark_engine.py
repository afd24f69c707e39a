"""The delta-spark engine of the Delta sink: distributed writes through the Delta JVM
classes (the ``delta-spark`` jars must be on the Spark classpath).

Idempotence is Delta's own: an append carries the writer options ``txnAppId`` /
``txnVersion``, a MERGE the session confs ``spark.databricks.delta.write.txnAppId`` /
``txnVersion``, and Delta skips a commit whose version is not above the recorded one. The
confs are set on a new session per write, so sinks writing in parallel threads do not
overwrite each other's confs. ``delta`` (the Python package) is imported lazily.

Each commit records the batch's plan as its ``userMetadata`` (the writer option, or for a
MERGE the session conf ``spark.databricks.delta.commitInfo.userMetadata``, which it
overrides for these commits): a batch found already written by the delta-rs lookup is
skipped only when that commit recorded the same plan (:mod:`fanout_delta.plans`). Where
delta-rs cannot read the table, Delta's own check skips silently, unchecked.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import Batch
from fanout.contract.dead_letters import DeadLetter, letter_rows
from fanout.contract.sink import SinkResult
from fanout.delta_tables import io as deltaio
from fanout.errors import SinkWriteError
from fanout_delta.constraints import (
    TableConstraints,
    holds_refused_spark,
    refuse_spark,
    split_refused_spark,
    write_refused,
)
from fanout_delta.fence import batch_version
from fanout_delta.merge import merge_predicate, quote, winners_then_refusals
from fanout_delta.partition_values import (
    holds_unstorable_spark,
    partition_columns,
    refuse_unstorable_spark,
    split_unstorable_spark,
)
from fanout_delta.plans import SPARK_METADATA_CONF, refuse_replanned, taken_out, user_metadata
from fanout_delta.schema import check_batch_schema

if TYPE_CHECKING:
    from fanout_delta.target import DeltaTarget

logger = logging.getLogger(__name__)

DELTA_CLASS = "io.delta.tables.DeltaTable"
"""The JVM class whose presence tells that the Delta jars are loaded."""

_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def delta_jvm_missing(spark: Any) -> str | None:
    """Why the delta-spark engine cannot run in ``spark``, or ``None`` when it can."""
    if spark is None:
        return "there is no active SparkSession"
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return "the SparkSession has no JVM gateway (Spark Connect?)"
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_CLASS, False, loader)
    except Exception as exc:  # py4j raises Py4JJavaError (ClassNotFoundException) here
        return (
            f"the JVM class {DELTA_CLASS} cannot be loaded ({type(exc).__name__}); the "
            "delta-spark jars are needed on the Spark classpath (spark.jars.packages "
            "io.delta:delta-spark_<scala>:<version>, or configure_spark_with_delta_pip)"
        )
    return None


def write_spark(sink: DeltaTarget, batch: Batch) -> SinkResult:
    """Write one batch with delta-spark (append or merge), exactly once per batch id."""
    key = batch.idempotency_key
    path, batch_id, app_id = sink.path, key.version, key.app_id
    assert path is not None  # checked by open()
    df = batch.df
    dead = 0
    dead_letters = sink.dead_letters
    table = _open_with_rs(sink)
    partitions = partition_columns(sink, table)
    constraints = TableConstraints.of(table, "spark")
    letters: list[DeadLetter] = []
    if sink.mode == "merge":  # one row per key, as the rs engine's merge_source
        df, letters = merge_source_spark(sink, df, partitions, batch_id, constraints)
    elif dead_letters is not None:
        df, broken = split_refused_spark(df, constraints, sink=sink.name, batch_id=batch_id)
        df, letters = split_unstorable_spark(df, partitions, engine="spark")
        letters = [*broken, *letters]
    # refuses a later epoch's fence, and a renamed sink's first write of a batch it holds
    written = batch_version(table, batch, sink.name, path, sinks=sink.sinks,
                            harmless=sink.rewrite_harmless,
                            storage_options=sink.storage_options)  # fmt: skip
    held = written is not None and written >= batch_id
    if dead_letters is not None and (sink.mode == "merge" or letters):
        # first, and not again for a batch the table holds: see the rs engine
        dead = len(letters) if held else write_refused(dead_letters, batch, letters,
                                                       constraints, path)  # fmt: skip
    if held:
        if taken_out(table, app_id, batch_id, sink.storage_options):
            raise SinkWriteError(
                f"the Delta table {path} records the batch's transaction ({app_id}), but a "
                "RESTORE since its commit took its rows out. delta-spark skips a batch whose "
                "transaction the table records, so engine 'spark' cannot write it again: "
                "restore the table to a version holding the batch (its commit or later), or "
                "write it with engine 'rs', which writes a restored-away batch again",
                sink=sink.name,
                batch_id=batch_id,
            )
        refuse_replanned(batch, sink.name, path, table, ledger=sink.ledger)
        return SinkResult(df.count(), dead_lettered=dead, already_written=True)
    if table is not None:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        check_batch_schema(
            pa.schema(table.schema().to_arrow()),
            # Only the types matter here, not the zone: Delta stores timestamps in UTC.
            to_arrow_schema(df.schema, timezone="UTC"),
            merge_schema=sink.merge_schema,
            sink=sink.name,
            batch_id=batch_id,
        )
    if dead_letters is None and sink.mode == "append":  # before Spark's task fails unreadably
        refuse_spark(df, constraints, sink=sink.name, batch_id=batch_id, table=path)
        refuse_unstorable_spark(df, partitions, sink.name, batch_id)
    details: dict[str, Any] = {"mode": sink.mode, "engine": "spark"}
    plan = user_metadata(batch)
    if sink.mode == "append":
        _append(sink, df, app_id, batch_id, plan)
        rows = df.count()
    else:
        rows = _merge(sink, df, app_id, batch_id, plan)
    return SinkResult(rows=rows, details=details, dead_lettered=dead)


def _merge(sink: DeltaTarget, source: Any, app_id: str, batch_id: int, plan: str | None) -> int:
    from delta.tables import DeltaTable

    session = source.sparkSession.newSession()
    session.conf.set(_TXN_APP_ID, app_id)
    session.conf.set(_TXN_VERSION, str(batch_id))
    if plan is not None:
        session.conf.set(SPARK_METADATA_CONF, plan)
    if sink.merge_schema:
        session.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
    if not DeltaTable.isDeltaTable(session, sink.path):
        # First batch: create the table with an idempotent append of the source.
        _append(sink, source, app_id, batch_id, plan)
        return int(source.count())
    (
        DeltaTable.forPath(session, sink.path)
        .alias("t")
        .merge(source.alias("s"), merge_predicate(sink.keys or []))
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    return int(source.count())


def _append(sink: DeltaTarget, df: Any, app_id: str, batch_id: int, plan: str | None) -> None:
    """An idempotent Delta append of ``df`` (also creates the table on the first batch),
    its commit recording ``plan`` (:func:`fanout_delta.plans.user_metadata`)."""
    writer = (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", str(batch_id))
    )
    if plan is not None:
        writer = writer.option("userMetadata", plan)
    if sink.merge_schema:
        writer = writer.option("mergeSchema", "true")
    if sink.partition_by:
        writer = writer.partitionBy(*sink.partition_by)
    for key, value in (sink.configuration or {}).items():
        writer = writer.option(key, value)
    writer.save(sink.path)


def merge_source_spark(
    sink: DeltaTarget,
    df: Any,
    partitions: list[str],
    batch_id: int,
    constraints: TableConstraints | None = None,
) -> tuple[Any, list[DeadLetter]]:
    """:func:`fanout_delta.rs_engine.merge_source` in Spark: each key's winner is chosen
    among all its rows before a refused one counts
    (:func:`~fanout_delta.merge.winners_then_refusals`); the refused winners' rows (for a
    partition value, or the table's ``constraints``) are collected, or counted to fail
    the batch, only when a row is refused."""
    keys, order_by, name = sink.keys or [], sink.order_by, sink.name
    constraints = constraints or TableConstraints()
    letters: list[DeadLetter] = []
    if sink.dead_letters is not None:
        df, letters = split_null_keys_spark(df, keys)

    def choose(rows: Any) -> Any:
        return dedupe_spark(rows, keys, order_by, name, batch_id)

    def split(rows: Any) -> tuple[Any, list[DeadLetter]]:
        if sink.dead_letters is not None:
            rows, broken = split_refused_spark(rows, constraints, sink=name, batch_id=batch_id,
                                               pad=False)  # fmt: skip
            rows, unstorable = split_unstorable_spark(rows, partitions, engine="spark")
            return rows, [*broken, *unstorable]
        refuse_spark(rows, constraints, sink=name, batch_id=batch_id, table=str(sink.path),
                     pad=False)  # fmt: skip
        refuse_unstorable_spark(rows, partitions, name, batch_id)  # fails on a refused winner
        return rows, []  # every refused row lost its key

    def any_refused(rows: Any) -> bool:
        return holds_unstorable_spark(rows, partitions, engine="spark") or holds_refused_spark(
            rows, constraints, sink=name, batch_id=batch_id
        )

    df, refused = winners_then_refusals(
        df, choose=choose, any_refused=any_refused, split_refused=split
    )
    return df, [*letters, *refused]


def split_null_keys_spark(df: Any, keys: Sequence[str]) -> tuple[Any, list[DeadLetter]]:
    """The rows with every key set, and a dead letter for each row with a null key (those
    rows are collected to the driver: they are expected to be few).

    They are collected as Arrow and taken by
    :func:`~fanout.contract.dead_letters.letter_rows`, as the rs engine takes them
    (:func:`fanout_delta.merge.split_null_keys`), so both engines write the same letters:
    ``collect()`` hands a timestamp over as a naive local time of the driver's zone (the
    instant lost) and a map as a dict, whose keys JSON may not take."""
    from pyspark.sql import functions as F

    if not keys:
        return df, []
    null_any = functools.reduce(lambda a, b: a | b, [F.col(quote(k)).isNull() for k in keys])
    letters = [
        DeadLetter(row, f"null in key column {column!r}: a null key cannot be merged", column)
        for row in letter_rows(df.filter(null_any).toArrow())
        for column in [next(k for k in keys if row[k] is None)]
    ]
    return df.filter(~null_any), letters


def dedupe_spark(
    df: Any, keys: Sequence[str], order_by: Sequence[str] | None, sink: str, batch_id: int
) -> Any:
    """The Spark counterpart of :func:`fanout_delta.rs_engine.prepare_merge_source`.

    Ties on ``order_by`` go to the greatest values of the other columns in column order
    (nulls lose; maps, which Spark cannot order, compared as JSON), as in the rs engine:
    never to the arrival order, which a replay may change.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key_cols = [F.col(quote(k)) for k in keys]
    for key in keys:
        nulls = df.filter(F.col(quote(key)).isNull()).limit(1).count()
        if nulls:
            raise SinkWriteError(
                f"rows have a null in key column {key!r}; a null key cannot be merged. "
                "Filter or fill those rows in the stream.",
                sink=sink,
                batch_id=batch_id,
            )
    if not order_by:
        dup = df.groupBy(*key_cols).count().filter(F.col("count") > 1).limit(1).collect()
        if dup:
            key_value = {k: dup[0][i] for i, k in enumerate(keys)}
            raise SinkWriteError(
                f"key {key_value} occurs {dup[0]['count']} times in the batch; a MERGE takes "
                "one row per key. Set order_by to the column(s) whose greatest value wins.",
                sink=sink,
                batch_id=batch_id,
            )
        return df
    from pyspark.sql.types import MapType

    rank = "__fanout_rank__"
    kinds = {f.name: f.dataType for f in df.schema.fields}
    others = [c for c in df.columns if c not in keys and c not in order_by]
    ties = [
        F.to_json(F.col(quote(c))) if isinstance(kinds[c], MapType) else F.col(quote(c))
        for c in others
    ]
    order = [F.col(quote(c)).desc_nulls_last() for c in order_by] + [
        t.desc_nulls_last() for t in ties
    ]
    window = Window.partitionBy(*key_cols).orderBy(*order)
    return df.withColumn(rank, F.row_number().over(window)).filter(F.col(rank) == 1).drop(rank)


def compact_spark(spark: Any, path: str) -> None:
    """Bin-pack the table's small files with delta-spark's ``OPTIMIZE``."""
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).optimize().executeCompaction()


def _open_with_rs(sink: DeltaTarget) -> Any:
    """The table through delta-rs, for the txn lookup and the schema check; ``None`` when
    absent or not readable by delta-rs (then Delta's own txn check still applies)."""
    try:
        return deltaio.open_table(sink.path, sink.storage_options)  # type: ignore[arg-type]
    except Exception as exc:
        logger.debug("sink %r: delta-rs cannot read %s: %s", sink.name, sink.path, exc)
        return None
