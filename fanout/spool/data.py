"""The spool's data table, ``<spool>/batches``: the rows of every spooled batch,
partitioned by pipeline, epoch and batch id. A batch's rows are appended in one commit
(carrying the app transaction ``fanout-spool/<pipeline>[@e<epoch>]`` at the batch id), after
its index rows, whenever a fresh snapshot of the table holds none of its files: a replayed
batch is not spooled twice, and a batch removed once its sinks held it gets its rows back
when spooled again (the live batch the catch-up released while in flight, or a replay of
it). A batch's files are plain Parquet (the partition values live in the Delta log, not in
the files), so Spark reads them with ``spark.read.parquet`` and no Delta classes: executors
read a spooled batch like any Parquet input. Each append (a *spooling*) gives its rows an id
of its own (:data:`SPOOLING_COLUMN`): two drivers of one pipeline spooling one batch at once
may both find its rows absent and both append them, and readers then take one spooling's
files only (:func:`_one_spooling`), so no row of the batch is read twice. A batch whose
columns the table keeps with another type or spelling is written in files of its own types
(:func:`changed_types`, :func:`append_own_types`): delta-rs would cast them to the table's.

This module decides the table's layout (its reserved columns, its properties), which files
hold a batch (:func:`files_in`, :func:`sizes_in`), and how a batch's types fit the table's;
:class:`fanout.spool.table.Spool` appends and removes the rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fanout.contract.batch import BatchInfo
from fanout.delta_tables.io import open_table
from fanout.errors import SpoolError
from fanout.spool.index import SHORT_LOG, BatchKey

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import pyarrow as pa
    from deltalake import DeltaTable

PIPELINE_COLUMN = "_fanout_pipeline"
EPOCH_COLUMN = "_fanout_epoch"
BATCH_COLUMN = "_fanout_batch"
PARTITION_COLUMNS = (PIPELINE_COLUMN, EPOCH_COLUMN, BATCH_COLUMN)
SPOOLING_COLUMN = "_fanout_spooling"
"""The id (a uuid) of the append that wrote a row: one per spooling of a batch. A spool
written by an older version has no such column (its rows read as one spooling)."""
RESERVED_COLUMNS = (*PARTITION_COLUMNS, SPOOLING_COLUMN)
STATS_PROPERTY = "delta.dataSkippingStatsColumns"
DATA_CONFIG = {**SHORT_LOG, STATS_PROPERTY: SPOOLING_COLUMN}
"""The data table's properties: its files' statistics are of :data:`SPOOLING_COLUMN`
alone (by default delta-rs keeps the first 32 columns', and the id comes last), so each
file's spooling is read from the Delta log, not from the file."""


def _all_files(table: DeltaTable, pipeline: str, key: BatchKey) -> list[str]:
    predicate = [
        (PIPELINE_COLUMN, "=", pipeline),
        (EPOCH_COLUMN, "=", str(key[0])),
        (BATCH_COLUMN, "=", str(key[1])),
    ]
    return list(table.file_uris(file_pruning_predicate=predicate))


def any_files(table: DeltaTable | None, pipeline: str, key: BatchKey) -> bool:
    """Whether ``table``'s loaded version holds rows of batch ``key``."""
    return table is not None and bool(_all_files(table, pipeline, key))


def files_in(table: DeltaTable | None, pipeline: str, key: BatchKey) -> list[str]:
    """The files of one spooling of batch ``key`` in ``table``'s loaded version (each
    spooling appended all of its rows in one commit, and none was removed since)."""
    if table is None:
        return []
    uris = _all_files(table, pipeline, key)
    if len(uris) <= 1:  # the common case: one spooling, one file; its log read is enough
        return uris
    names = {name for name, _ in _one_spooling(table, pipeline, [key]).get(key, [])}
    return [uri for uri in uris if uri.rsplit("/", 1)[-1] in names]


def sizes_in(
    table: DeltaTable | None, pipeline: str, keys: Iterable[BatchKey] | None = None
) -> dict[BatchKey, int]:
    """Bytes per batch of ``pipeline`` with files in ``table``'s loaded version (one
    spooling's files)."""
    chosen = _one_spooling(table, pipeline, keys)
    return {key: sum(size for _, size in files) for key, files in chosen.items()}


SpooledFile = tuple[str, int]
"""A data file's name (its path's last part) and size in bytes."""


def _one_spooling(
    table: DeltaTable | None, pipeline: str, keys: Iterable[BatchKey] | None = None
) -> dict[BatchKey, list[SpooledFile]]:
    """Per batch of ``pipeline`` with files in ``table``'s loaded version, the files of
    one of its spoolings: the smallest id by the log's statistics of
    :data:`SPOOLING_COLUMN`, files without one (written by an older version, as one
    spooling) first. Two spoolings are two complete copies of the batch (a replayed batch
    has the rows it had), so any one of them is the batch, and every reader picks the same."""
    if table is None:
        return {}
    wanted = None if keys is None else set(keys)
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    spoolings: dict[BatchKey, dict[str | None, list[SpooledFile]]] = {}
    count = len(actions.get("path", []))
    columns = (
        actions.get(f"partition.{PIPELINE_COLUMN}", [None] * count),
        actions.get(f"partition.{EPOCH_COLUMN}", [None] * count),
        actions.get(f"partition.{BATCH_COLUMN}", [None] * count),
        actions.get("path", []),
        actions.get("size_bytes", [0] * count),
        actions.get(f"min.{SPOOLING_COLUMN}", [None] * count),
    )
    for owner, epoch, batch_id, path, size, spooling in zip(*columns, strict=True):
        if owner != pipeline:
            continue
        key = (int(epoch), int(batch_id))
        if wanted is None or key in wanted:
            files = spoolings.setdefault(key, {}).setdefault(spooling, [])
            files.append((str(path).rsplit("/", 1)[-1], int(size)))
    return {
        key: by_id[min(by_id, key=lambda s: (s is not None, s or ""))]
        for key, by_id in spoolings.items()
    }


def changed_types(table: DeltaTable, schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` (a batch's, as Arrow) that the spool's data table
    ``table`` keeps with another type (as Delta stores them, nested fields and their
    nullability included) or under another spelling of the name (Delta's names are
    case-insensitive). The table has one schema for every batch of every pipeline spooled
    in it, the first type and spelling each column had; delta-rs' append casts a batch's
    columns to it without a word: a ``double`` 12.5 into a ``long`` column was written as
    12, which Spark then could not read back as the batch's ``double`` (the catch-up failed
    at the batch at every probe), and a ``double`` 0.1 into a ``float`` one as
    0.100000001490116, which it read back widened (the sink got other values); and it
    refuses a name spelt in another case (``ID`` beside ``id``: the batch could not be
    spooled, and the query stopped at it)."""
    import pyarrow as pa
    from deltalake import Schema

    from fanout.delta_tables.distributed import delta_schema

    kept = {f.name.lower(): (f.name, f.type) for f in table.schema().fields}
    stored = Schema.from_arrow(delta_schema(pa.schema(schema)))
    return [
        f.name
        for f in stored.fields
        if (known := kept.get(f.name.lower())) is not None and known != (f.name, f.type)
    ]


def unfilled_columns(table: DeltaTable, schema: pa.Schema) -> list[str]:
    """The columns the spool's data table ``table`` keeps ``NOT NULL`` (the first batch
    spooled had them non-nullable: a Spark column of a literal, ``range``, a rate source)
    that ``schema`` (a batch's, as Arrow) lacks or lets hold nulls. delta-rs' append
    checks the table's invariants: a batch without such a column (dropped from the query
    since) was refused ("rows failed validation check"), so it could not be spooled and
    the query stopped at it."""
    given = {f.name.lower(): f.nullable for f in schema}
    return [
        f.name for f in table.schema().fields if not f.nullable and given.get(f.name.lower(), True)
    ]


def with_partition_columns(arrow: pa.Table, pipeline: str, info: BatchInfo) -> pa.Table:
    """``arrow`` (a batch's rows) with the data table's partition columns appended; a
    :class:`fanout.SpoolError` when the batch has a column of a name the spool reserves."""
    import pyarrow as pa

    clash = [c for c in RESERVED_COLUMNS if c in arrow.column_names]
    if clash:
        raise SpoolError(
            f"pipeline {pipeline!r}, batch {info.batch_id}: the batch has a column "
            f"{clash[0]!r}, a name the spool reserves; rename it upstream"
        )
    n = arrow.num_rows
    return (
        arrow.append_column(PIPELINE_COLUMN, pa.array([pipeline] * n, pa.string()))
        .append_column(EPOCH_COLUMN, pa.array([info.epoch] * n, pa.int32()))
        .append_column(BATCH_COLUMN, pa.array([info.batch_id] * n, pa.int64()))
    )


def append_own_types(
    data_path: str,
    storage_options: Mapping[str, str] | None,
    arrow: pa.Table,
    table: DeltaTable,
    app_id: str,
    batch_id: int,
) -> DeltaTable:
    """Append the batch's rows to ``table`` (one commit, carrying the spool's app
    transaction at ``batch_id``) in files holding each column in the batch's own type
    (:func:`changed_types`): delta-rs' append would cast them to the table's, and the
    catch-up reads a batch's files with the batch's own schema. The table's schema is
    left as it is; only fanout reads the spool's files (by path, with the batch's
    schema from the index). The spooling id comes first in each file, so its
    statistics, which the readers choose one spooling by, are kept."""
    import pyarrow as pa

    from fanout.delta_tables.datafiles import FileWriter
    from fanout.delta_tables.distributed import delta_schema
    from fanout.delta_tables.io import commit_properties

    stored = delta_schema(arrow.schema)
    first = [stored.field(SPOOLING_COLUMN)]
    rest = [f for f in stored if f.name != SPOOLING_COLUMN]
    writer = FileWriter(
        data_path, pa.schema(first + rest), PARTITION_COLUMNS,
        storage_options, stats_columns=1,
    )  # fmt: skip
    files = writer.write(iter(arrow.to_batches()))
    table.create_write_transaction(
        [f.add_action() for f in files],
        mode="append",
        schema=table.schema(),
        partition_by=list(table.metadata().partition_columns) or None,
        commit_properties=commit_properties({app_id: batch_id}),
    )
    table.update_incremental()
    return table


def ready_for(
    data_path: str,
    storage_options: Mapping[str, str] | None,
    schema: pa.Schema,
    table: DeltaTable | None,
) -> DeltaTable | None:
    """The data table (``None``: none yet), able to take rows of ``schema``: with the
    ``timestampNtz`` feature when they hold a ``timestamp_ntz`` (delta-rs misses one
    inside a map, and adds none for a merged schema's map: :mod:`fanout.delta_tables.ntz`),
    created here when delta-rs would create it without."""
    from fanout.delta_tables import ntz
    from fanout.delta_tables.distributed import delta_schema

    stored = delta_schema(schema)
    if table is not None:
        ntz.finish_create(table)
        ntz.enable_feature(table, stored)
        return _spooling_stats(data_path, storage_options, table)
    if not ntz.hidden_ntz(stored):
        return None
    try:
        return ntz.create_table(
            data_path, stored, partition_by=PARTITION_COLUMNS, configuration=DATA_CONFIG,
            storage_options=storage_options,
        )  # fmt: skip
    except Exception:
        table = open_table(data_path, storage_options)
        if table is None:
            raise
        # another instance created it meanwhile
        return ready_for(data_path, storage_options, schema, table)


def _spooling_stats(
    data_path: str, storage_options: Mapping[str, str] | None, table: DeltaTable
) -> DeltaTable:
    """``table``, keeping statistics of :data:`SPOOLING_COLUMN` for the files it adds
    (a spool an older version created lacks the property: one commit sets it, before
    this version's first append; the readers need each file's spooling)."""
    if table.metadata().configuration.get(STATS_PROPERTY) == SPOOLING_COLUMN:
        return table
    try:
        table.alter.set_table_properties(
            {STATS_PROPERTY: SPOOLING_COLUMN}, raise_if_not_exists=False
        )
    except Exception:
        again = open_table(data_path, storage_options)
        if again is None or again.metadata().configuration.get(STATS_PROPERTY) != SPOOLING_COLUMN:
            raise
        return again  # another instance set it meanwhile
    return table
