"""The executor side of a distributed Delta append: write a partition's rows as Parquet
data files inside a Delta table's location and describe each file the way a Delta ``add``
action does (:class:`DataFile`: path relative to the table, size, partition values,
modification time, statistics).

:class:`FileWriter` is configuration only: it is pickled into every Spark task
(``mapInArrow``), opens its filesystem there, and yields one JSON row per file written.
A file is named ``part-<uuid>.parquet``, so two attempts of one task, or two attempts of
one batch, never overwrite each other's files: what the driver does not commit is never
referenced by the table (see :mod:`fanout.delta_tables.distributed`).

Statistics follow Delta's ``stats`` JSON (``numRecords``, ``minValues``, ``maxValues``,
``nullCount``) and are conservative: a reader skips files by them, so a value this module
cannot state exactly (NaN, long strings, decimals, nested values, booleans, binary, dates
and timestamps outside the years 1 to 9999) is left out, which only means the file is never
skipped on that column. Dates and timestamps are formatted from their integers
(:mod:`fanout.delta_tables.values`), and a partition value no Delta table can keep (an
empty string, a year past 9999) fails the task naming the column and value.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fanout.contract.locations import local_path
from fanout.delta_tables.dictionary import dictionary_columns
from fanout.delta_tables.values import (
    MICROS_PER_DAY,
    UnstorablePartitionValue,
    date_text,
    in_four_digit_years,
    micros_of,
    partition_text,
    refusal,
    timestamp_text,
    value_problem,
)

if TYPE_CHECKING:
    import pyarrow as pa

FILE_ROW_DDL = "file string"
"""The Spark schema of what a :class:`FileWriter` task yields: one JSON :class:`DataFile`."""

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
"""The directory name of a null partition value (Hive's, as Delta writers use)."""

ROW_GROUP_ROWS = 262_144
"""Rows buffered per Parquet row group (a task's memory holds one row group at a time
per partition value it meets)."""

MAX_STATS_STRING = 32
"""Strings longer than this are left out of ``minValues``/``maxValues`` (as Delta
truncates them; leaving them out is always correct)."""


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written into a Delta table's location, as its ``add`` action
    describes it.

    :param path: relative to the table root, not URL-encoded (delta-rs encodes it in the
        log).
    :param partition_values: each partition column's value as Delta serializes it
        (``None`` for null).
    :param modification_time: when it was written, epoch milliseconds.
    :param stats: Delta's statistics JSON.
    :param rows: the rows in the file (``numRecords``).
    """

    path: str
    size: int
    partition_values: Mapping[str, str | None]
    modification_time: int
    stats: str
    rows: int

    def to_json(self) -> str:
        """This file as one JSON object (what a task yields)."""
        return json.dumps(
            {
                "path": self.path,
                "size": self.size,
                "partition_values": dict(self.partition_values),
                "modification_time": self.modification_time,
                "stats": self.stats,
                "rows": self.rows,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> DataFile:
        """The file a task described with :meth:`to_json`."""
        value = json.loads(text)
        return cls(
            value["path"],
            int(value["size"]),
            value["partition_values"],
            int(value["modification_time"]),
            value["stats"],
            int(value["rows"]),
        )

    def add_action(self) -> Any:
        """The delta-rs ``AddAction`` committing this file."""
        from deltalake.transaction import AddAction

        return AddAction(
            path=self.path,
            size=self.size,
            partition_values=dict(self.partition_values),
            modification_time=self.modification_time,
            data_change=True,
            stats=self.stats,
        )


@dataclass(frozen=True)
class FileWriter:
    """Writes the rows it is given as Parquet files under ``root`` (pickled to executors).

    :param root: the table location (local path or object-store URI).
    :param schema: the table's columns (Arrow, Delta-compatible types) the files hold,
        partition columns included; batch columns are cast to these types, table columns
        missing from a batch are written as nulls.
    :param partition_by: the table's partition columns: not stored in the files, one
        directory ``col=value`` per value, as Hive and Delta lay them out.
    :param storage_options: object-store options (delta-rs' filesystem opens the store).
    :param stats_columns: statistics cover the first this-many data columns (Delta's
        ``delta.dataSkippingNumIndexedCols`` default).
    """

    root: str
    schema: pa.Schema
    partition_by: Sequence[str] = ()
    storage_options: Mapping[str, str] | None = None
    stats_columns: int = 32

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function: write this task's rows, yield one row per file."""
        yield from file_rows(self.write(batches))

    def write(self, batches: Iterator[pa.RecordBatch]) -> list[DataFile]:
        """Write ``batches`` (one file per partition value met) and describe the files.
        An empty input writes nothing."""
        import pyarrow as pa

        data_schema = pa.schema([f for f in self.schema if f.name not in self.partition_by])
        open_files: dict[tuple[str | None, ...], _OpenFile] = {}
        filesystem, base = self._filesystem()
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                for values, part in self._split(batch):
                    current = open_files.get(values)
                    if current is None:
                        current = _OpenFile.start(
                            filesystem, base, self._directory(values), data_schema,
                            self.stats_columns,
                        )  # fmt: skip
                        open_files[values] = current
                    current.append(part)
            return [
                f.finish(dict(zip(self.partition_by, values, strict=True)))
                for values, f in open_files.items()
            ]
        finally:
            for f in open_files.values():
                f.abort()

    # -- internals -----------------------------------------------------------------------

    def _filesystem(self) -> tuple[Any, str]:
        """The filesystem to write to and the table root in it."""
        return table_filesystem(self.root, self.storage_options)

    def _split(self, batch: pa.RecordBatch) -> Iterator[tuple[tuple[str | None, ...], Any]]:
        """The batch's rows by partition value (the whole batch when unpartitioned)."""
        import functools

        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.partition_by:
            yield (), batch
            return
        table = pa.Table.from_batches([batch])
        columns = list(self.partition_by)
        for name in columns:  # a partition column the batch lacks: null for every row
            if name not in table.column_names:
                kind = self.schema.field(name).type
                table = table.append_column(pa.field(name, kind), pa.nulls(len(table), kind))
        groups = table.select(columns).group_by(columns, use_threads=False).aggregate([])
        # Arrow scalars, not Python values: a timestamp past the year 9999 has no datetime
        for index in range(groups.num_rows):
            row = {c: groups.column(c)[index] for c in columns}
            masks = [
                pc.is_null(table.column(c)) if not row[c].is_valid
                else pc.fill_null(pc.equal(table.column(c), row[c]), False)
                for c in columns
            ]  # fmt: skip
            part = table.filter(functools.reduce(pc.and_, masks))
            yield tuple(_partition_text(c, row[c]) for c in columns), part

    def _directory(self, values: tuple[str | None, ...]) -> str:
        parts = [
            f"{quote(c, safe='')}={NULL_PARTITION if v is None else quote(v, safe='')}"
            for c, v in zip(self.partition_by, values, strict=True)
        ]
        return "/".join(parts)


def table_filesystem(root: str, storage_options: Mapping[str, str] | None) -> tuple[Any, str]:
    """A pyarrow filesystem holding the Delta table at ``root``, and the table's path in it
    (``""`` on an object store, where the filesystem is rooted at the table). A local
    table may be named by a path or a ``file:`` URI (``file:///x``, or ``file:/x`` as
    Hadoop and Spark write it)."""
    import pyarrow.fs as pafs

    local = local_path(root)
    if local is not None:
        return pafs.LocalFileSystem(), local.rstrip("/")
    from deltalake.fs import DeltaStorageHandler

    handler = DeltaStorageHandler(root, dict(storage_options or {}) or None)
    return pafs.PyFileSystem(handler), ""


def file_rows(files: Sequence[DataFile]) -> Iterator[pa.RecordBatch]:
    """What a task yields for the files it wrote: one :data:`FILE_ROW_DDL` row each."""
    import pyarrow as pa

    if files:
        yield pa.RecordBatch.from_pydict(
            {"file": [f.to_json() for f in files]}, schema=pa.schema([("file", pa.string())])
        )


def conform(part: pa.Table, data_schema: pa.Schema) -> pa.Table:
    """``part`` with exactly the file's columns and types (missing ones null)."""
    import pyarrow as pa

    arrays = []
    for f in data_schema:
        if f.name in part.column_names:
            column = part.column(f.name)
            if not f.nullable and column.null_count:
                raise ValueError(
                    f"column {f.name!r} is NOT NULL in the Delta table but "
                    f"{column.null_count} row(s) of the batch hold null"
                )
            arrays.append(column.cast(f.type))
        else:
            arrays.append(pa.nulls(part.num_rows, type=f.type))
    return pa.Table.from_arrays(arrays, schema=data_schema)


def _partition_text(column: str, value: pa.Scalar) -> str | None:
    """``column``'s partition value ``value`` as Delta serializes it; raises
    :class:`~fanout.delta_tables.values.UnstorablePartitionValue` naming the column and
    the value when no Delta table can keep it."""
    problem = value_problem(column, value)
    if problem is not None:
        raise UnstorablePartitionValue(refusal(column, problem))
    return partition_text(value)


@dataclass
class _OpenFile:
    """One Parquet file being written, with its running statistics."""

    path: str
    relative: str
    filesystem: Any
    stream: Any
    writer: Any
    stats: _Stats
    schema: pa.Schema
    done: bool = False
    buffer: list[Any] = field(default_factory=list)  # tables and record batches
    buffered: int = 0

    @classmethod
    def start(
        cls, filesystem: Any, base: str, directory: str, schema: pa.Schema, stats_columns: int
    ) -> _OpenFile:
        name = f"part-{uuid.uuid4()}.parquet"
        relative = f"{directory}/{name}" if directory else name
        path = f"{base}/{relative}" if base else relative
        if base:  # a local table (object stores have no directories)
            filesystem.create_dir(f"{base}/{directory}" if directory else base, recursive=True)
        stream = filesystem.open_output_stream(path)
        names = [f.name for f in schema][:stats_columns]
        return cls(path, relative, filesystem, stream, None, _Stats(names), schema)

    def append(self, table: pa.Table) -> None:
        """Buffer ``table``; write a row group once enough rows are buffered (Spark hands
        a task its rows in Arrow batches of 10,000: one row group each would make
        files slow to read)."""
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.buffer:
            return
        parts = [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in self.buffer]
        table = conform(pa.concat_tables(parts, promote_options="default"), self.schema)
        self.buffer, self.buffered = [], 0
        if self.writer is None:  # opened on the first rows: they choose the encodings
            import pyarrow.parquet as pq

            self.writer = pq.ParquetWriter(
                self.stream, self.schema, compression="snappy",
                use_dictionary=dictionary_columns(table),
            )  # fmt: skip
        self.writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.stats.add(table)

    def finish(self, partition_values: dict[str, str | None]) -> DataFile:
        self._flush()
        if self.writer is None:  # never happens: a file is started for rows
            raise RuntimeError(f"{self.path}: finished before any row was written")
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()
        self.done = True
        return DataFile(
            self.relative,
            int(size),
            partition_values,
            int(time.time() * 1000),
            self.stats.to_json(),
            self.stats.rows,
        )

    def abort(self) -> None:
        """Close what a failed write left open (the partial file stays unreferenced)."""
        if self.done:
            return
        self.done = True
        for closable in (self.writer, self.stream):
            if closable is None:
                continue
            try:
                closable.close()
            except Exception:  # already failing: the first error is the one reported
                pass


@dataclass
class _Stats:
    """Delta statistics of one file, accumulated batch by batch."""

    columns: list[str]
    rows: int = 0
    minimum: dict[str, Any] = field(default_factory=dict)
    maximum: dict[str, Any] = field(default_factory=dict)
    nulls: dict[str, int] = field(default_factory=dict)
    unstated: set[str] = field(default_factory=set)  # min/max left out
    kinds: dict[str, pa.DataType] = field(default_factory=dict)

    def add(self, table: pa.Table) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.types as pat

        self.rows += table.num_rows
        for name in self.columns:
            column = table.column(name)
            kind = column.type
            if not _is_struct(kind):
                self.nulls[name] = self.nulls.get(name, 0) + column.null_count
            if name in self.unstated:
                continue
            if not _has_min_max(kind) or (_is_float(kind) and _has_nan(column)):
                self.unstated.add(name)
                continue
            if column.null_count == len(column):
                continue
            self.kinds[name] = kind
            if pat.is_timestamp(kind) or pat.is_date32(kind):  # integers: any year
                column = column.cast(pa.int64() if pat.is_timestamp(kind) else pa.int32())
            low, high = (v.as_py() for v in pc.min_max(column).values())
            if self.minimum.get(name) is None or low < self.minimum[name]:
                self.minimum[name] = low
            if self.maximum.get(name) is None or high > self.maximum[name]:
                self.maximum[name] = high

    def to_json(self) -> str:
        stated = [
            n for n in self.columns if n not in self.unstated and self.minimum.get(n) is not None
        ]
        minimum = {n: _stat(self.minimum[n], self.kinds[n]) for n in stated}
        maximum = {n: _stat(self.maximum[n], self.kinds[n], up=True) for n in stated}
        keep = [n for n in stated if minimum[n] is not None and maximum[n] is not None]
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": {n: minimum[n] for n in keep},
                "maxValues": {n: maximum[n] for n in keep},
                "nullCount": self.nulls,
            }
        )


def _stat(value: Any, kind: pa.DataType, *, up: bool = False) -> Any:
    """A min/max value as Delta's stats JSON holds it, or ``None`` to leave it out. A
    timestamp or date comes as its integer (``up``: a maximum, rounded up to the
    microsecond); one outside the years 1 to 9999 is left out (the stats' format has no
    other year). A float zero is a minimum of ``-0.0`` and a maximum of ``0.0``: the
    minimum and maximum found hold one of the zeros, and readers pruning by the IEEE
    total order (delta-rs) skipped a file of ``-0.0`` for ``x >= 0.0``."""
    import pyarrow.types as pat

    if pat.is_timestamp(kind):
        micros = micros_of(value, kind, up=up)
        if not in_four_digit_years(micros // MICROS_PER_DAY, first_year=1):
            return None
        return timestamp_text(micros, sep="T") + "Z"
    if pat.is_date32(kind):
        return date_text(value) if in_four_digit_years(value, first_year=1) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value == 0.0:  # either zero may be in the file: as Parquet states them
            return 0.0 if up else -0.0
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= MAX_STATS_STRING else None
    return None


def _has_min_max(kind: pa.DataType) -> bool:
    import pyarrow.types as pat

    return (
        pat.is_integer(kind)
        or pat.is_floating(kind)
        or pat.is_string(kind)
        or pat.is_large_string(kind)
        or pat.is_date32(kind)
        or (pat.is_timestamp(kind) and kind.tz is not None)
    )


def _is_float(kind: pa.DataType) -> bool:
    import pyarrow.types as pat

    return bool(pat.is_floating(kind))


def _is_struct(kind: pa.DataType) -> bool:
    import pyarrow.types as pat

    return bool(pat.is_struct(kind))


def _has_nan(column: Any) -> bool:
    import pyarrow.compute as pc

    return bool(pc.any(pc.is_nan(column)).as_py())
