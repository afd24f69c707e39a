"""The spool: one pipeline's batches kept for the sinks that lag, in two Delta tables written
with delta-rs from the driver: ``<spool>/batches``, the rows of every spooled batch
(:mod:`fanout.spool.data`), and ``<spool>/index``, one row per (batch, sink that needs it)
(:mod:`fanout.spool.index`). :class:`Spool` adds, reads and removes batches.

A batch's index rows go once the sinks they name have committed it (:meth:`Spool.release`,
which chooses and removes under the spool's lock), only those rows; its rows go once no
index row of it remains, and their files are vacuumed at once (nothing else reads a batch
every sink needing it holds; a ``fanout ledger skip --release-spooled`` in another process
may release a batch a running pipeline's catch-up reads: that catch-up fails, reads the
sink's mark again and drops the batch, docs/architecture.md §14.4). Another instance on
the spool (in another process) may interleave: see docs/architecture.md §14.3.

The names of :mod:`fanout.spool.index` and :mod:`fanout.spool.data` that scripts and the
design pages import from here stay importable from here.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import BatchInfo, pipeline_scope
from fanout.contract.locations import shown_location
from fanout.contract.sql import sql_literal
from fanout.delta_tables.io import one_line, open_table, read_arrow
from fanout.errors import (
    CheckpointResetError,
    CheckpointRollbackError,
    SpoolError,
)
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import location_secrets, redact
from fanout.spool.data import (
    BATCH_COLUMN,
    DATA_CONFIG,
    EPOCH_COLUMN,
    PARTITION_COLUMNS,
    PIPELINE_COLUMN,
    SPOOLING_COLUMN,
    any_files,
    append_own_types,
    changed_types,
    files_in,
    ready_for,
    sizes_in,
    unfilled_columns,
    with_partition_columns,
)
from fanout.spool.index import (
    SHORT_LOG,
    BatchKey,
    SpooledBatch,
    append_index,
    batches_of_index,
    existing_index,
    from_index_row,
    index_location,
    index_schema,
    merged,
    open_index,
)
from fanout.spool.refusals import spool_reset_message, spool_rollback_message

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

__all__ = [
    "BATCH_COLUMN",
    "EPOCH_COLUMN",
    "PARTITION_COLUMNS",
    "PIPELINE_COLUMN",
    "SHORT_LOG",
    "SPOOLING_COLUMN",
    "BatchKey",
    "Chosen",
    "Spool",
    "SpooledBatch",
    "batches_of_index",
    "changed_types",
    "existing_index",
    "index_schema",
    "open_index",
    "read_spooled",
    "unfilled_columns",
]

log = logging.getLogger("fanout")

Chosen = Mapping[BatchKey, Iterable[str]] | Iterable[BatchKey]
"""Batches to remove, each with the sinks whose index rows go (a bare key: every sink the
instance knows needs it)."""


@dataclass
class Spool:
    """One pipeline's spool at ``path`` (a directory: local path or object-store URI).

    Thread-safe: the live path adds batches while the catch-up thread reads and removes.
    """

    path: str
    pipeline: str
    storage_options: Mapping[str, str] | None = None
    ledger: str | None = None
    """The pipeline's ledger as the commands fanout prints name it
    (:func:`fanout.contract.locations.command_location`), for the refusals' commands;
    ``None``: unknown (a spool opened alone), named ``<path>``."""
    _batches: dict[BatchKey, SpooledBatch] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def data_path(self) -> str:
        """The Delta table of the spooled rows."""
        return f"{self.path.rstrip('/')}/batches"

    @property
    def index_path(self) -> str:
        """The Delta table saying which sink needs which batch."""
        return index_location(self.path)

    @property
    def _shown(self) -> str:
        """The spool's location as its errors name it (a password masked)."""
        return shown_location(self.path)

    def _masked(self, exc: BaseException) -> str:
        """``exc``'s text on one line, the location's password masked (the store's own
        error names the location as written)."""
        return redact(one_line(str(exc)), location_secrets(self.path))

    def open(self) -> None:
        """Read the index (creating it when missing): the batches spooled by earlier runs."""
        from deltalake import DeltaTable

        with self._lock:
            try:
                table = open_table(self.index_path, self.storage_options)
                if table is None:
                    table = DeltaTable.create(
                        self.index_path,
                        schema=index_schema(),
                        mode="ignore",
                        name="fanout_spool_index",
                        configuration=SHORT_LOG,
                        storage_options=dict(self.storage_options or {}) or None,
                    )
                rows = read_arrow(table, filters=[("pipeline", "=", self.pipeline)]).to_pylist()
            except Exception as exc:
                raise SpoolError(
                    f"spool at {self._shown}: cannot open its index: {self._masked(exc)}"
                ) from exc
            self._load(rows)

    def load(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Take the pipeline's batches from ``rows`` of the index a caller read (any
        pipeline's: the others are left), as :meth:`open` does, without opening the index
        or creating it (``fanout status``: one read of the index a draw)."""
        with self._lock:
            self._load([row for row in rows if row["pipeline"] == self.pipeline])

    def _load(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._batches = {}
        for row in rows:
            self._merge(from_index_row(row))
        sizes = self._sizes()
        for key, batch in self._batches.items():
            self._batches[key] = replace(batch, size_bytes=sizes.get(key, 0), files_read=True)

    # -- reading ---------------------------------------------------------------------

    def batches(self) -> list[SpooledBatch]:
        """Every spooled batch of the pipeline, in batch order."""
        with self._lock:
            return [self._batches[k] for k in sorted(self._batches)]

    def get(self, key: BatchKey) -> SpooledBatch | None:
        """The spooled batch ``key``, or ``None``."""
        with self._lock:
            return self._batches.get(key)

    def needed_by(self, sink: str) -> list[SpooledBatch]:
        """The spooled batches ``sink`` was recorded as needing, in batch order (the
        caller drops those its marks already hold)."""
        return [b for b in self.batches() if sink in b.needed_by]

    def read(self, spark: Any, key: BatchKey) -> Any:
        """Batch ``key`` as a Spark DataFrame with the schema it had: a Parquet read of the
        batch's files (empty when the batch had no rows)."""
        from pyspark.sql.types import StructType

        batch = self.get(key)
        if batch is None:
            raise SpoolError(
                f"spool at {self._shown}: batch {key[1]} (epoch {key[0]}) is not spooled"
            )
        schema = StructType.fromJson(json.loads(batch.schema_json))
        files = self._files(key)
        if not files:
            if batch.rows:
                raise SpoolError(
                    f"spool at {self._shown}: batch {batch.batch_id} (epoch {batch.epoch}) "
                    f"had {batch.rows} rows but its files are gone"
                )
            return spark.createDataFrame([], schema)
        return spark.read.schema(schema).parquet(*files)

    def size(self) -> tuple[int, int, int]:
        """``(batches, rows, bytes)`` the spool holds for the pipeline."""
        batches = self.batches()
        return len(batches), sum(b.rows for b in batches), sum(b.size_bytes for b in batches)

    # -- writing ---------------------------------------------------------------------

    def add(
        self,
        df: Any,
        info: BatchInfo,
        needed_by: Iterable[str],
        now: datetime,
        arrow: Callable[[], pa.Table] | None = None,
        party: Iterable[str] | None = None,
        *,
        replayed: bool | Iterable[str] = False,
    ) -> SpooledBatch:
        """Spool batch ``info`` (the sinks needing it, every call; its rows, once) and
        return it as the index now knows it. ``arrow`` gives the batch as Arrow when a
        conversion is shared with the sinks (default: ``df.toArrow()``); ``party``: every
        sink configured now (:attr:`SpooledBatch.party`); ``replayed``: a replay an
        earlier attempt may have written, recorded for the sinks ``needed_by`` (``True``)
        or for those of them it names (:attr:`SpooledBatch.replayed`; an index row is
        appended for a sink already recorded without it). Raises
        :class:`fanout.SpoolError`, and :class:`fanout.CheckpointResetError` or
        :class:`fanout.CheckpointRollbackError` when the spool holds a batch of the same
        id from another query or another plan (:meth:`check`)."""
        sinks = frozenset(needed_by)
        key = (info.epoch, info.batch_id)
        if isinstance(replayed, bool):
            doubted = sinks if replayed else frozenset()
        else:
            doubted = sinks & frozenset(replayed)
        with self._lock:  # one writer at a time: a removal's vacuum must not see our files
            self.check(info)
            return self._add(df, info, sinks, key, now, arrow, party, doubted)

    def note_replayed(self, key: BatchKey, sink: str) -> SpooledBatch:
        """Record in the index, before its catch-up writes batch ``key`` to ``sink``, that
        an attempt of that write may have begun (:attr:`SpooledBatch.replayed` for the
        sink: a later run's catch-up asks the sink before writing it again,
        :mod:`fanout.steps.replay_lag`). One read of the index (of the batch's row for the
        sink, filtered in delta-rs) and one row appended (one commit), only when the sink
        is not recorded so yet; returns the batch as the index
        now knows it. Nothing is appended when the index on disk no longer holds a row of
        the batch for the sink: another process released it (``fanout ledger skip
        --release-spooled``) since this instance read the index, and a row appended then
        would spool the batch for the sink again, its mark past it, so that every later
        start logged the release command; the batch is returned as this instance knows it,
        and its write goes on as any catch-up write a skip overtakes (docs/architecture.md
        §14.4). Raises :class:`fanout.SpoolError`."""
        with self._lock:
            batch = self._batches.get(key)
            if batch is None:
                raise SpoolError(
                    f"spool at {self._shown}: batch {key[1]} (epoch {key[0]}) is not spooled"
                )
            if sink in batch.replayed:
                return batch
            noted = replace(batch, needed_by=frozenset([sink]), replayed=frozenset([sink]))
            try:
                if not self._index_holds(key, sink):
                    log.info(
                        "pipeline %s, batch %s, sink %s: not noted in the spool's index: "
                        "another process released the batch for the sink meanwhile (a "
                        "`fanout ledger skip --release-spooled`)",
                        self.pipeline, key[1], sink,
                        extra=batch_fields(self.pipeline, key[1], sink),
                    )  # fmt: skip
                    return batch
                self._append_index(noted, [sink])
            except Exception as exc:
                raise SpoolError(
                    f"pipeline {self.pipeline!r}, batch {key[1]}: cannot record in the index of "
                    f"the spool at {self._shown} that sink {sink!r} is being caught up on it: "
                    f"{type(exc).__name__}: {self._masked(exc)}"
                ) from exc
            return self._merge(noted)

    def check(self, info: BatchInfo) -> None:
        """Refuse batch ``info`` when the spool holds a batch of the same ``(epoch, batch
        id)`` of another query (:class:`fanout.CheckpointResetError`) or of the same query
        planned at another time (:class:`fanout.CheckpointRollbackError`): the checkpoint
        was replaced or rolled back while sinks lagged, and the spooled rows are not this
        batch's. Values unknown on either side are not compared."""
        spooled = self.get((info.epoch, info.batch_id))
        if spooled is None or spooled.query_id is None or info.query_id is None:
            return
        if spooled.query_id != info.query_id:
            raise CheckpointResetError(
                spool_reset_message(info, spooled.info(), spooled.needed_by, self.path, self.ledger)
            )
        if (
            spooled.batch_timestamp_ms is not None
            and info.batch_timestamp_ms is not None
            and spooled.batch_timestamp_ms != info.batch_timestamp_ms
        ):
            raise CheckpointRollbackError(
                spool_rollback_message(info, spooled.info(), spooled.needed_by, self.path)
            )

    def _add(
        self,
        df: Any,
        info: BatchInfo,
        sinks: frozenset[str],
        key: BatchKey,
        now: datetime,
        arrow: Callable[[], pa.Table] | None,
        party: Iterable[str] | None = None,
        replayed: frozenset[str] = frozenset(),
    ) -> SpooledBatch:
        # The index row first, then the rows if a fresh snapshot lacks them: a removal in
        # another instance deletes a batch's rows only when no index row of it remains, so
        # it cannot strand the row appended here (§14.3). A crash between the two leaves
        # an index row without rows for a batch Spark has not committed: the replay
        # spools it again and appends them.
        try:
            existing = self.get(key)
            table: pa.Table | None = None
            if existing is not None:
                rows, schema_json = existing.rows, existing.schema_json
            else:
                table = self._arrow(df, info, arrow)
                rows, schema_json = table.num_rows, df.schema.json()
            batch = SpooledBatch(
                self.pipeline,
                info.epoch,
                info.batch_id,
                rows,
                schema_json,
                now,
                sinks,
                info.query_id,
                None if info.source_offsets is None else json.dumps(info.source_offsets),
                info.batch_timestamp_ms,
                party=None if party is None else frozenset(party),
                replayed=replayed,
            )
            new_sinks = sinks - (existing.needed_by if existing else frozenset())
            new_sinks |= batch.replayed - (existing.replayed if existing else frozenset())
            if new_sinks:
                self._append_index(batch, new_sinks)
            data = open_table(self.data_path, self.storage_options)  # one snapshot serves all
            if rows and not any_files(data, self.pipeline, key):
                if table is None:  # removed (every sink then holding it), now needed again
                    table = self._arrow(df, info, arrow)
                data = self._append_rows(table, info, data)
            size = sizes_in(data, self.pipeline, [key]).get(key, 0)
        except SpoolError:
            raise
        except Exception as exc:
            raise SpoolError(
                f"pipeline {self.pipeline!r}, batch {info.batch_id}: cannot spool the batch for "
                f"{', '.join(sorted(sinks))} at {self._shown}: {type(exc).__name__}: "
                + self._masked(exc)
            ) from exc
        known = self._merge(batch)
        known = self._batches[key] = replace(known, size_bytes=size, files_read=True)
        return known

    def _arrow(self, df: Any, info: BatchInfo, arrow: Callable[[], pa.Table] | None) -> pa.Table:
        table = arrow() if arrow is not None else df.toArrow()
        return with_partition_columns(table, self.pipeline, info)

    def release(self, choose: Callable[[], Chosen]) -> int:
        """Remove the batches ``choose()`` names (those every sink needing them holds),
        choosing and removing under the spool's lock, so no :meth:`add` of this instance
        can record a new sink for a batch between the choice and its removal; returns how
        many were removed from this instance's view (see :meth:`remove`)."""
        with self._lock:
            return self.remove(choose())

    def remove(self, chosen: Chosen) -> int:
        """Remove batches from the sinks that hold them: ``chosen`` maps each batch to the
        sinks whose index rows go (a bare key: the sinks this instance knows need it).
        Only those rows are deleted; a batch's rows go (and their files are vacuumed) only
        when no index row of it remains on a fresh snapshot of the index, so a sink that
        another instance or process spooled the batch for keeps it. Returns how many
        batches left this instance's view."""
        with self._lock:
            pairs = self._pairs(chosen)
            if not pairs:
                return 0
            index = open_table(self.index_path, self.storage_options)
            scope = sql_literal(self.pipeline)
            if index is not None:
                for (epoch, batch_id), sinks in sorted(pairs.items()):
                    names = ", ".join(sql_literal(s) for s in sorted(sinks))
                    index.delete(
                        f"pipeline = {scope} AND epoch = {epoch} AND batch_id = {batch_id} "
                        f"AND sink IN ({names})"
                    )
            left = self._index_rows(set(pairs))
            for key in sorted(pairs):
                if key in left:  # spooled for other sinks (by another instance): kept
                    needed = frozenset[str]().union(*(r.needed_by for r in left[key]))
                    replayed = frozenset[str]().union(*(r.replayed for r in left[key]))
                    known = self._batches.get(key) or left[key][0]
                    self._batches[key] = replace(known, needed_by=needed, replayed=replayed)
                else:
                    self._batches.pop(key, None)
            self._delete_rows(sorted(set(pairs) - set(left)))
            return sum(1 for key in pairs if key not in left)

    def remove_orphans(self, garbage: Callable[[BatchKey], bool]) -> list[BatchKey]:
        """Delete the rows of batches of the pipeline that have rows and no index row (a
        removal or a spooling cut short, or an older version's spooling: rows first) and
        that ``garbage(key)`` says no sink can need; returns them."""
        with self._lock:
            data = open_table(self.data_path, self.storage_options)
            with_rows = set(sizes_in(data, self.pipeline))
            if not with_rows:
                return []
            indexed = set(self._index_rows(with_rows))
            orphans = sorted(k for k in with_rows - indexed if garbage(k))
            self._delete_rows(orphans)
            return orphans

    def _pairs(self, chosen: Chosen) -> dict[BatchKey, frozenset[str]]:
        if isinstance(chosen, Mapping):
            pairs = {key: frozenset(sinks) for key, sinks in chosen.items()}
        else:
            pairs = {}
            for key in chosen:
                known = self._batches.get(key)
                pairs[key] = known.needed_by if known is not None else frozenset()
        return {key: sinks for key, sinks in pairs.items() if sinks}

    def _index_holds(self, key: BatchKey, sink: str) -> bool:
        """Whether the index, on a fresh snapshot, holds a row of batch ``key`` for
        ``sink``: the filters go down to delta-rs, which skips every other file by its
        statistics (a scan of the whole index, one file per spooling and never compacted,
        would cost a lagging sink's catch-up a read growing with its backlog, under the
        lock the live batches' spooling takes)."""
        index = open_table(self.index_path, self.storage_options)
        if index is None:
            return False
        epoch, batch_id = key
        filters = [("pipeline", "=", self.pipeline), ("epoch", "=", epoch),
                   ("batch_id", "=", batch_id), ("sink", "=", sink)]  # fmt: skip
        return read_arrow(index, columns=["sink"], filters=filters).num_rows > 0

    def _index_rows(self, keys: set[BatchKey]) -> dict[BatchKey, list[SpooledBatch]]:
        """The index rows of ``keys``, on a fresh snapshot of the index."""
        index = open_table(self.index_path, self.storage_options)
        if index is None or not keys:
            return {}
        rows = read_arrow(index, filters=[("pipeline", "=", self.pipeline)]).to_pylist()
        found: dict[BatchKey, list[SpooledBatch]] = {}
        for row in rows:
            batch = from_index_row(row)
            if batch.key in keys:
                found.setdefault(batch.key, []).append(batch)
        return found

    def _delete_rows(self, keys: Sequence[BatchKey]) -> None:
        if not keys:
            return
        data = open_table(self.data_path, self.storage_options)
        if data is None:
            return
        scope = sql_literal(self.pipeline)
        for epoch, batch_id in keys:
            data.delete(
                f"{PIPELINE_COLUMN} = {scope} AND {EPOCH_COLUMN} = {epoch} "
                f"AND {BATCH_COLUMN} = {batch_id}"
            )
        # lite (full=False): only the files the log removed, never files not yet in it,
        # which may be another pipeline's rows written before their commit
        data.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=False)

    # -- internals -------------------------------------------------------------------

    def _merge(self, batch: SpooledBatch) -> SpooledBatch:
        batch = merged(self._batches.get(batch.key), batch)
        self._batches[batch.key] = batch
        return batch

    def _append_rows(
        self, arrow: pa.Table, info: BatchInfo, table: DeltaTable | None = None
    ) -> DeltaTable | None:
        """Append the batch's rows (one commit) to ``table``, the snapshot just read
        (``None``: open it, or create the table); returns the table at the new version."""
        import pyarrow as pa
        from deltalake import write_deltalake

        from fanout.delta_tables.io import commit_properties

        app_id = f"fanout-spool/{pipeline_scope(self.pipeline, info.epoch)}"
        if arrow.num_rows == 0:
            return table  # nothing to read back: the index row alone carries the schema
        spooling = pa.repeat(pa.scalar(uuid.uuid4().hex, pa.string()), arrow.num_rows)
        arrow = arrow.append_column(SPOOLING_COLUMN, spooling)
        if table is None:
            table = open_table(self.data_path, self.storage_options)
        table = ready_for(self.data_path, self.storage_options, arrow.schema, table)
        changed = [] if table is None else changed_types(table, arrow.schema)
        unfilled = [] if table is None else unfilled_columns(table, arrow.schema)
        if changed or unfilled:
            assert table is not None
            log.info(
                "pipeline %s, batch %s: column(s) %s of the batch have another type than the "
                "spool's table keeps for them, or it may hold nulls in (or lacks) column(s) %s "
                "the table keeps NOT NULL: its rows are written with the batch's own types",
                self.pipeline, info.batch_id, ", ".join(map(repr, changed)) or "none",
                ", ".join(map(repr, unfilled)) or "none",
                extra=batch_fields(self.pipeline, info.batch_id),
            )  # fmt: skip
            return append_own_types(
                self.data_path, self.storage_options, arrow, table, app_id, info.batch_id
            )
        write_deltalake(
            self.data_path if table is None else table,
            arrow,
            mode="append",
            partition_by=list(PARTITION_COLUMNS),
            schema_mode="merge",  # a later batch may carry new columns
            commit_properties=commit_properties({app_id: info.batch_id}),
            configuration=None if table is not None else DATA_CONFIG,
            storage_options=None if table is not None else dict(self.storage_options or {}) or None,
        )
        # write_deltalake moves a DeltaTable it is given to the version it committed
        return table if table is not None else open_table(self.data_path, self.storage_options)

    def _append_index(self, batch: SpooledBatch, sinks: Iterable[str]) -> None:
        append_index(self.index_path, self.storage_options, batch, sinks)

    def _files(self, key: BatchKey) -> list[str]:
        return files_in(open_table(self.data_path, self.storage_options), self.pipeline, key)

    def _sizes(self, keys: Iterable[BatchKey] | None = None) -> dict[BatchKey, int]:
        return sizes_in(open_table(self.data_path, self.storage_options), self.pipeline, keys)


def read_spooled(
    path: str, pipeline: str, storage_options: Mapping[str, str] | None = None
) -> list[SpooledBatch]:
    """The batches the spool at ``path`` holds for ``pipeline``, read without creating or
    changing anything (for the commands that only look: ``fanout recover``). Raises
    :class:`fanout.ConfigurationError` when ``path`` holds no spool
    (:func:`existing_index`)."""
    index = existing_index(path, pipeline, storage_options)
    rows = read_arrow(index, filters=[("pipeline", "=", pipeline)]).to_pylist()
    batches = batches_of_index(rows).get(pipeline, [])
    if not batches:
        return batches
    sizes = Spool(path, pipeline, storage_options=storage_options)._sizes()
    return [replace(b, size_bytes=sizes.get(b.key, 0), files_read=True) for b in batches]
