"""A distributed, exactly-once append to a Delta table: the executors write the Parquet
files, the driver commits them once.

:func:`append_distributed` runs one Spark job over the DataFrame (``mapInArrow``): every
task writes its rows into the table's location with :class:`FileWriter`
(``<table>/<partition dirs>/part-<uuid>.parquet``) and returns one JSON row per file
(path, size, partition values, modification time, Delta statistics). The driver collects
those small rows and commits all files in ONE Delta commit carrying the app transaction
``(app_id, version)``, after checking ``transaction_version(app_id)`` on the same snapshot
it commits on. A writer that commits the same app id in between makes delta-rs refuse the
commit (a conflict); the check then runs again on the fresh snapshot, where the batch is
found done, and nothing of this attempt is committed. No row passes through the driver.

Files of an attempt that does not commit (a failed task, a failed commit, a driver that
died between the job and the commit, a replay that finds the batch already committed)
stay in the table's directory but are never referenced by its log, so no reader sees
them. They are removed by the table's normal cleanup: ``VACUUM`` deletes unreferenced
files older than the retention (``delta.deletedFileRetentionDuration``, 7 days by
default). Until then they only take storage.

Without Spark (a ``pyarrow.Table`` instead of a DataFrame) the same writer runs in this
process: the same files, statistics and commit.

The writer is taken only for a table it is known to write right: :func:`blockers` lists
every reader or writer feature of the table's protocol, every ``delta.*`` table property
(of the table, or of the one about to be created) and every ``delta.*`` column metadata
key outside the allowlists below, and callers then write through delta-rs' own writer.
The lists name what this writer and its tests cover; anything else, even a feature new
to Delta, steps back rather than risk files the table does not expect.

Layer 1: imports only :mod:`fanout.delta_tables`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.contract.sessions import result_schema
from fanout.delta_tables import io, ntz
from fanout.delta_tables.datafiles import FILE_ROW_DDL, DataFile, FileWriter

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

    from fanout.delta_tables.kept import KeptTable

log = logging.getLogger(__name__)

SchemaCheck = Callable[["pa.Schema", "pa.Schema"], None]
"""``check(table_schema, batch_schema)``: raises when the batch cannot be appended."""

TaskWrapper = Callable[[FileWriter], Callable[[Iterator["pa.RecordBatch"]],
                                             Iterator["pa.RecordBatch"]]]  # fmt: skip
"""``task(writer)``: the (picklable) function a Spark task runs instead of ``writer``."""

HANDLED_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz", "changeDataFeed"})
"""Reader/writer features a table may list (protocol 3/7) for the executors' writer:
``appendOnly`` (it only appends), ``invariants`` (none may be in use: any ``delta.*``
column metadata steps back), ``timestampNtz`` (:mod:`fanout.delta_tables.ntz`) and
``changeDataFeed`` (an append writes no change files: readers take its ``add`` actions as
inserts)."""

_LEGACY_WRITER_FEATURES = {2: ("appendOnly", "invariants"), 3: ("checkConstraints",),
                           4: ("changeDataFeed", "generatedColumns"), 5: ("columnMapping",),
                           6: ("identityColumns",)}  # fmt: skip
"""The features a legacy writer version (below 7) implies, each with those below it."""

_LEGACY_IN_USE_ONLY = frozenset({"checkConstraints", "generatedColumns", "columnMapping",
                                 "identityColumns"})  # fmt: skip
"""Implied by a legacy version whatever the table uses: fine while unused, which the
property and column metadata allowlists check (a constraint is a ``delta.constraints.*``
property, a generated or identity column a ``delta.*`` column metadata key, column
mapping a ``delta.columnMapping.mode`` other than ``none``)."""

HANDLED_PROPERTIES: Mapping[str, frozenset[str] | None] = {
    "delta.appendOnly": None,
    "delta.checkpointInterval": None,
    "delta.checkpoint.writeStatsAsJson": None,
    "delta.checkpoint.writeStatsAsStruct": None,
    "delta.deletedFileRetentionDuration": None,
    "delta.enableChangeDataFeed": None,
    "delta.enableExpiredLogCleanup": None,
    "delta.isolationLevel": None,
    "delta.logRetentionDuration": None,
    "delta.setTransactionRetentionDuration": None,
    "delta.minReaderVersion": None,  # checked as the features they imply
    "delta.minWriterVersion": None,
    "delta.columnMapping.mode": frozenset({"none"}),
    "delta.columnMapping.maxColumnId": None,  # bookkeeping: the mode says whether mapped
}
"""``delta.*`` table properties the executors' writer is known to be right under (``None``:
any value; else the values): none of them changes how a data file must be written.
``delta.feature.<name>`` is checked as the feature ``<name>``; any other ``delta.*``
property (statistics columns, file sizes, random prefixes, deletion vectors, row tracking,
type widening, ...) steps back to delta-rs' writer, which implements or refuses it."""


class UnfitTableError(Exception):
    """The table changed between the check and the commit of an append (another writer
    created it, or gave it a feature) so that the files written for it do not fit it:
    nothing is committed, and a retry, which checks the table again, can write."""


@dataclass(frozen=True)
class AppendOutcome:
    """What :func:`append_distributed` did.

    :param rows: rows committed (0 when skipped or empty).
    :param files: data files committed.
    :param version: the table version after the commit (``None`` when nothing committed).
    :param already_written: the table already records ``version`` (or a later one) for
        the app id: nothing was written.
    :param empty: the input had no rows: nothing was committed.
    """

    rows: int = 0
    files: int = 0
    version: int | None = None
    already_written: bool = False
    empty: bool = False


def append_distributed(
    source: Any,
    path: str,
    *,
    app_id: str,
    version: int,
    partition_by: Sequence[str] | None = None,
    storage_options: Mapping[str, str] | None = None,
    configuration: Mapping[str, str | None] | None = None,
    merge_schema: bool = False,
    check: SchemaCheck | None = None,
    task: TaskWrapper | None = None,
    metadata: Mapping[str, str] | None = None,
) -> AppendOutcome:
    """Append ``source`` (a Spark DataFrame, or a ``pyarrow.Table``) to the Delta table
    at ``path`` (created when missing) exactly once per ``(app_id, version)``.

    :param check: called with the table's and the batch's Arrow schemas on every snapshot
        the commit is based on; raise to refuse the batch.
    :param merge_schema: batch columns the table lacks are added to the table first (a
        metadata-only commit), so the data commit's schema is the merged one.
    :param configuration: table properties of a table this call creates.
    :param task: wraps the :class:`FileWriter` into the function each Spark task runs
        (e.g. to call hooks around a task's files); it must return what the writer
        returns, one row per file.
    :param metadata: custom commit metadata of the data commit (its commit info).
    """
    pending = PendingAppend(
        delta_schema(arrow_schema_of(source)), path, app_id=app_id, version=version,
        partition_by=partition_by, storage_options=storage_options,
        configuration=configuration, merge_schema=merge_schema, check=check,
        metadata=metadata,
    )  # fmt: skip
    return pending.run(source, task)


class PendingAppend:
    """An exactly-once append in two steps, for callers that run the tasks writing its
    files themselves (a job shared with other sinks): :meth:`writer` on the driver before
    the job, then :meth:`commit` with the files the tasks wrote. The parameters are
    :func:`append_distributed`'s; ``batch_schema`` is the batch's Arrow schema, with the
    types Delta stores (:func:`delta_schema`); ``opened``: the table, opened by the caller
    just now, for the first check (one open fewer, ~5 ms on the driver before the job);
    ``kept``: where the snapshot the append ends on is left for the next batch
    (:mod:`fanout.delta_tables.kept`); ``metadata``: custom commit metadata of the data
    commit; ``taken_out``: asked of a snapshot whose app transaction says the batch is
    done, whether a RESTORE took it out since (then it is written again, not skipped);
    ``refuse``: the error raised when a snapshot the append checks (and would commit from)
    carries a later epoch's fence on its app transaction (found with the version read
    anyway, :func:`fanout.delta_tables.io.transaction_state`); without it, such a fence is
    read as the batch written; ``first_write``: called with a snapshot that records no
    transaction of ``app_id`` (the sink's first write to the table), before anything is
    written, to refuse (raise) what that snapshot holds (the Delta sink: a renamed sink's
    batch)."""

    def __init__(
        self,
        batch_schema: pa.Schema,
        path: str,
        *,
        app_id: str,
        version: int,
        partition_by: Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        configuration: Mapping[str, str | None] | None = None,
        merge_schema: bool = False,
        check: SchemaCheck | None = None,
        opened: DeltaTable | None = None,
        kept: KeptTable | None = None,
        metadata: Mapping[str, str] | None = None,
        taken_out: Callable[[DeltaTable], bool] | None = None,
        refuse: Callable[[DeltaTable], Exception] | None = None,
        first_write: Callable[[DeltaTable], None] | None = None,
    ) -> None:
        self.batch_schema = batch_schema
        self.refuse = refuse
        self.first_write = first_write
        self.path = path
        self.app_id = app_id
        self.version = version
        self.partition_by = partition_by
        self.storage_options = storage_options
        self.configuration = configuration
        self.merge_schema = merge_schema
        self.check = check
        self._evolved = False
        self._snapshot: tuple[DeltaTable | None, pa.Schema] | None = None
        self._partitions: list[str] = []
        self._opened = opened
        self._kept = kept
        self.metadata = metadata
        self.taken_out = taken_out

    def writer(self) -> FileWriter | None:
        """The writer of this append's files (checked against the table's schema, which
        ``merge_schema`` first extends); ``None`` when the table already records the
        batch."""
        snapshot = self._checked_snapshot()
        if snapshot is None:
            return None
        table, schema = snapshot
        partitions = _partition_columns(table, self.partition_by)
        missing = [c for c in partitions if c not in schema.names]
        if missing:
            raise ValueError(f"partition column(s) {missing} missing from the batch")
        self._snapshot, self._partitions = snapshot, partitions
        return FileWriter(self.path, schema, tuple(partitions), self.storage_options)

    def run(self, source: Any, task: TaskWrapper | None = None) -> AppendOutcome:
        """Both steps around a job of this append's own over ``source`` (a Spark
        DataFrame, or a ``pyarrow.Table`` written here): :func:`append_distributed`."""
        writer = self.writer()
        if writer is None:
            return AppendOutcome(already_written=True)
        return self.commit(write_files(source, writer, task))

    def commit(self, files: Sequence[DataFile]) -> AppendOutcome:
        """Commit ``files`` (written by :meth:`writer`'s writer) in one commit carrying
        the app transaction; a lost commit race is checked again on the fresh snapshot,
        where the batch may be found done (then nothing of this attempt is committed)."""
        if not files:
            return AppendOutcome(empty=True)
        snapshot, conflicts = self._snapshot, 0
        while True:
            if snapshot is None:
                snapshot = self._checked_snapshot()
                if snapshot is None:
                    return AppendOutcome(already_written=True)
            table, schema = snapshot
            if snapshot is not self._snapshot and table is not None:
                self._refuse_unfit(table)
            if table is not None and list(table.metadata().partition_columns) != self._partitions:
                raise ValueError(
                    f"the Delta table at {self.path!r} was created by another writer "
                    f"meanwhile, partitioned by {table.metadata().partition_columns}, not "
                    f"{self._partitions}"
                )
            try:
                _commit(table, self.path, files, schema, self.app_id, self.version,
                        self.partition_by, self.configuration, self.storage_options,
                        self.metadata)  # fmt: skip
            except Exception as exc:
                conflicts += 1
                if io.is_commit_conflict(exc) and conflicts < io.COMMIT_ATTEMPTS:
                    log.info("%s: lost a commit race for %s@%d, checking again: %s",
                             self.path, self.app_id, self.version, exc)  # fmt: skip
                    snapshot = None
                    continue
                raise
            if table is not None:  # the version it made: its snapshot brought up to date
                table.update_incremental()  # (~2 ms, where opening the table took ~4)
            else:
                table = io.open_table(self.path, self.storage_options)
            self._keep(table)
            return AppendOutcome(
                rows=sum(f.rows for f in files),
                files=len(files),
                version=table.version() if table is not None else None,
            )

    def _refuse_unfit(self, table: DeltaTable) -> None:
        """Raise :class:`UnfitTableError` when ``table``, found after the files were
        written (a table another writer created or changed meanwhile), has a feature the
        files do not follow: committed, their rows would read as nulls or break it."""
        reasons = blockers(table, self._partitions, self.batch_schema)
        if reasons:
            raise UnfitTableError(
                f"the Delta table at {self.path!r} changed while the executors wrote the "
                f"batch's files, and now has {', '.join(reasons)}, which those files do "
                "not follow: nothing was committed; the retry writes the batch with "
                "delta-rs' own writer"
            )

    def _checked_snapshot(self) -> tuple[DeltaTable | None, pa.Schema] | None:
        """The table (``None``: not created yet) and the schema to write, checked; ``None``
        when the table already records the batch."""
        while True:
            table, self._opened = self._opened, None
            if table is None:
                table = io.open_table(self.path, self.storage_options)
            ntz.finish_create(table)
            done, fenced = io.transaction_state(table, self.app_id)
            if fenced and self.refuse is not None:
                assert table is not None
                raise self.refuse(table)
            if fenced or (done is not None and done >= self.version):
                if self.taken_out is None or table is None or not self.taken_out(table):
                    self._keep(table)
                    return None
            if table is None:
                return None, self.batch_schema
            if done is None and self.first_write is not None:
                self.first_write(table)
            table_schema = delta_schema(table.schema().to_arrow())
            if self.check is not None:
                self.check(table_schema, self.batch_schema)
            if (
                self.merge_schema
                and not self._evolved
                and _add_new_columns(table, table_schema, self.batch_schema)
            ):
                self._evolved = True
                continue  # check again on the snapshot with the new columns
            return table, table_schema

    def _keep(self, table: DeltaTable | None) -> None:
        if self._kept is not None:
            self._kept.keep(table)


def write_files(source: Any, writer: FileWriter, task: TaskWrapper | None = None) -> list[DataFile]:
    """Write ``source``'s rows with ``writer``: on the executors, one task per partition
    of a Spark DataFrame (only the file descriptions reach the driver; ``task`` wraps the
    writer there), or here for a ``pyarrow.Table``."""
    if hasattr(source, "mapInArrow"):
        function = writer if task is None else task(writer)
        rows = source.mapInArrow(function, result_schema(FILE_ROW_DDL)).collect()
        return [DataFile.from_json(row[0]) for row in rows]
    return writer.write(iter(source.to_batches()))


def arrow_schema_of(source: Any) -> pa.Schema:
    """The Arrow schema of a Spark DataFrame (without reading it) or of a pyarrow table."""
    if hasattr(source, "mapInArrow"):
        from pyspark.sql.pandas.types import to_arrow_schema

        # Only the types matter here: Delta stores timestamps in UTC.
        return to_arrow_schema(source.schema, timezone="UTC")
    return source.schema  # type: ignore[no-any-return]


def blockers(
    table: DeltaTable | None,
    partition_by: Sequence[str] | None,
    batch_schema: pa.Schema,
    configuration: Mapping[str, str | None] | None = None,
) -> list[str]:
    """Why the files of this append cannot be written by :class:`FileWriter` (empty when
    they can): a protocol feature, a ``delta.*`` table property or column metadata key
    outside the allowlists (:data:`HANDLED_FEATURES`, :data:`HANDLED_PROPERTIES`), or a
    partition column of a type whose value it cannot serialize. ``configuration``: the
    table properties a table this append creates gets (``table`` is ``None``), checked
    alike: a table created with column mapping reads its columns by physical names the
    writer's files do not have."""
    import pyarrow.types as pat

    reasons: list[str] = []
    if table is None:
        reasons += _property_blockers(configuration or {})
    else:
        protocol = table.protocol()
        reasons += _feature_blockers(
            protocol.min_reader_version, protocol.min_writer_version,
            protocol.reader_features, protocol.writer_features,
        )  # fmt: skip
        configuration = table.metadata().configuration
        reasons += _property_blockers(configuration)
        mapped = configuration.get("delta.columnMapping.mode") not in (None, "none")
        keys = _field_metadata(table.schema().fields)
        reasons += [
            f"column metadata {key} (on {', '.join(map(repr, columns))})"
            for key, columns in sorted(keys.items())
            if not (mapped and key.startswith("delta.columnMapping."))  # said once, above
        ]
    partitions = _partition_columns(table, partition_by)
    for name in partitions:
        index = batch_schema.get_field_index(name)
        if index < 0:
            continue
        kind = batch_schema.field(index).type
        serializable = (pat.is_integer, pat.is_string, pat.is_large_string, pat.is_boolean,
                        pat.is_date, pat.is_timestamp)  # fmt: skip
        if not any(test(kind) for test in serializable):
            reasons.append(f"partition column {name!r} of type {kind}")
    return sorted(set(reasons))


def _feature_blockers(
    reader: int,
    writer: int,
    reader_features: Sequence[str] | None,
    writer_features: Sequence[str] | None,
) -> list[str]:
    """The protocol's features :class:`FileWriter` is not known to handle."""
    reasons: list[str] = []
    if reader > 3 or writer > 7:
        reasons.append(f"protocol version {reader}/{writer}")
    listed = set(reader_features or ()) | set(writer_features or ())
    if writer < 7:  # a legacy version: the features it implies, fine while unused
        listed |= {f for v, fs in _LEGACY_WRITER_FEATURES.items() if v <= writer for f in fs}
        listed -= _LEGACY_IN_USE_ONLY
    reasons += [f"table feature {f}" for f in sorted(listed - HANDLED_FEATURES)]
    return reasons


def _property_blockers(configuration: Mapping[str, str | None]) -> list[str]:
    """The ``delta.*`` table properties (set, or to be set at creation) :class:`FileWriter`
    is not known to be right under, and the features a creation would give the table."""
    reasons: list[str] = []
    for key, value in configuration.items():
        if not key.startswith("delta."):
            continue  # a property of the user's, not Delta's
        if key.startswith("delta.feature."):
            feature = key.removeprefix("delta.feature.")
            if feature not in HANDLED_FEATURES:
                reasons.append(f"table feature {feature}")
            continue
        allowed = HANDLED_PROPERTIES.get(key, frozenset())
        if allowed is not None and (value or "").lower() not in allowed:
            what = "column mapping" if key == "delta.columnMapping.mode" else "table property"
            reasons.append(f"{what} {key}={value}")
    versions = [configuration.get(k) for k in ("delta.minReaderVersion", "delta.minWriterVersion")]
    if any(v is not None for v in versions):
        try:
            reader, writer = (int(v) if v is not None else 1 for v in versions)
        except ValueError:
            return [*reasons, f"protocol version {versions[0]}/{versions[1]}"]
        reasons += _feature_blockers(reader, writer, (), ())
    return reasons


def _field_metadata(fields: Sequence[Any]) -> dict[str, list[str]]:
    """The ``delta.*`` metadata keys of the columns (nested ones too), each with the
    columns carrying it: an invariant, a generation expression, an identity, a column
    mapping id or physical name, a type change, none of which :class:`FileWriter`
    follows."""
    found: dict[str, list[str]] = {}
    for f in fields:
        for key in f.metadata or {}:
            if key.startswith("delta."):
                found.setdefault(key, []).append(f.name)
        for key, names in _field_metadata(_nested_fields(f.type)).items():
            found.setdefault(key, []).extend(f"{f.name}.{n}" for n in names)
    return found


def _nested_fields(kind: Any) -> list[Any]:
    """The fields inside a delta-rs schema type (a struct's, through arrays and maps)."""
    if hasattr(kind, "fields"):
        return list(kind.fields)
    inner = [getattr(kind, a, None) for a in ("element_type", "key_type", "value_type")]
    return [f for t in inner if t is not None for f in _nested_fields(t)]


def delta_schema(schema: Any) -> pa.Schema:
    """``schema`` (any Arrow schema) with the types Delta stores: microsecond timestamps
    in UTC (or without zone), signed integers, plain (not large, not view) strings,
    binaries and lists, dictionary columns by their values."""
    import pyarrow as pa

    return pa.schema([f.with_type(_delta_type(f.type)) for f in pa.schema(schema)])


def _delta_type(kind: pa.DataType) -> pa.DataType:
    import pyarrow as pa
    import pyarrow.types as pat

    if pat.is_dictionary(kind):
        return _delta_type(kind.value_type)
    if pat.is_timestamp(kind):
        return pa.timestamp("us", tz=None if kind.tz is None else "UTC")
    if pat.is_unsigned_integer(kind):
        return {8: pa.int16(), 16: pa.int32()}.get(kind.bit_width, pa.int64())
    if pat.is_large_string(kind) or pat.is_string_view(kind):
        return pa.string()
    if pat.is_large_binary(kind) or pat.is_binary_view(kind) or pat.is_fixed_size_binary(kind):
        return pa.binary()
    if (pat.is_list(kind) or pat.is_large_list(kind) or pat.is_fixed_size_list(kind)
            or pat.is_list_view(kind) or pat.is_large_list_view(kind)):  # fmt: skip
        item = kind.value_field
        return pa.list_(pa.field("element", _delta_type(item.type), item.nullable))
    if pat.is_map(kind):
        return pa.map_(_delta_type(kind.key_type), kind.item_field.with_type(
            _delta_type(kind.item_type)))  # fmt: skip
    if pat.is_struct(kind):
        return pa.struct([f.with_type(_delta_type(f.type)) for f in kind])
    return kind


def _partition_columns(table: DeltaTable | None, partition_by: Sequence[str] | None) -> list[str]:
    if table is not None:
        return list(table.metadata().partition_columns)
    return list(partition_by or [])


def _add_new_columns(table: DeltaTable, table_schema: pa.Schema, batch_schema: pa.Schema) -> bool:
    """Add the batch's columns the table lacks, and new fields of its struct columns, in
    a metadata-only commit (delta-rs commits a schema change with an append only in
    overwrite mode). Returns whether it committed."""
    import pyarrow as pa
    import pyarrow.types as pat
    from deltalake import Schema

    new = [
        f
        for f in batch_schema
        if table_schema.get_field_index(f.name) < 0
        or (pat.is_struct(f.type) and not table_schema.field(f.name).type.equals(f.type))
    ]
    if not new:
        return False
    fields = Schema.from_arrow(pa.schema([f.with_nullable(True) for f in new])).fields
    ntz.enable_feature(table, pa.schema(new))  # delta-rs misses it inside a map
    log.info("adding column(s) %s to the Delta table", [f.name for f in new])
    table.alter.add_columns(fields)
    return True


def _commit(
    table: DeltaTable | None,
    path: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
    app_id: str,
    version: int,
    partition_by: Sequence[str] | None,
    configuration: Mapping[str, str | None] | None,
    storage_options: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """One commit adding ``files`` with the transaction ``(app_id, version)`` and the custom
    commit ``metadata``, based on the snapshot ``table`` (``None``: create the table;
    another writer having created it since is a conflict)."""
    from deltalake import Schema
    from deltalake.transaction import create_table_with_add_actions

    actions = [f.add_action() for f in files]
    commit = io.commit_properties({app_id: version}, metadata)
    if table is None and ntz.hidden_ntz(schema):
        # delta-rs would not give the table the timestampNtz feature: create it empty
        # with the feature first, then append to that snapshot.
        table = ntz.create_table(path, schema, partition_by=partition_by,
                                 configuration=configuration,
                                 storage_options=storage_options)  # fmt: skip
    if table is None:
        create_table_with_add_actions(
            path,
            Schema.from_arrow(schema),
            actions,
            mode="error",
            partition_by=list(partition_by) if partition_by else None,
            configuration=dict(configuration) if configuration else None,
            storage_options=dict(storage_options) if storage_options else None,
            commit_properties=commit,
        )
        return
    table.create_write_transaction(
        actions,
        mode="append",
        schema=table.schema(),
        partition_by=list(table.metadata().partition_columns) or None,
        commit_properties=commit,
    )
