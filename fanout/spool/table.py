"""The spool's two Delta tables, written with delta-rs from the driver:

- ``<spool>/batches``: the rows of every spooled batch, partitioned by pipeline, epoch and
  batch id. A batch's rows are appended in one commit (carrying the app transaction
  ``fanout-spool/<pipeline>[@e<epoch>]`` at the batch id), after its index rows, whenever
  a fresh snapshot of the table holds none of its files: a replayed batch is not spooled
  twice, and a batch removed once its sinks held it gets its rows back when spooled again
  (the live batch the catch-up released while in flight, or a replay of it). A batch's
  files are plain Parquet (the partition values live in the Delta log, not in the files),
  so Spark reads them with ``spark.read.parquet`` and no Delta classes: executors read a
  spooled batch like any Parquet input. Each append (a *spooling*) gives its rows an id of
  its own (:data:`SPOOLING_COLUMN`): two drivers of one pipeline spooling one batch at once
  may both find its rows absent and both append them, and readers then take one
  spooling's files only (:func:`_one_spooling`), so no row of the batch is read twice. A
  batch whose columns the table keeps with another type or spelling is written in files
  of its own types (:func:`changed_types`): delta-rs would cast them to the table's.
- ``<spool>/index``: one row per (batch, sink that needs it), with what the batch's ledger
  marks must carry (query id, source offsets, planning time), the batch's Spark
  schema, the sinks configured when it was spooled (``party``: an older epoch's batch
  is settled only once each of them holds it, :func:`fanout.spool.settled.party_of`), and
  whether it was spooled for the sink from a replay an earlier attempt may have written,
  or a catch-up began writing it to the sink (``replayed``: its catch-up asks the sink
  first, :mod:`fanout.steps.replay_lag`). Rows of a replayed batch may repeat; readers take
  the union.

A batch's index rows go once the sinks they name have committed it (:meth:`Spool.release`,
which chooses and removes under the spool's lock), only those rows; its rows go once no
index row of it remains, and their files are vacuumed at once (nothing else reads a batch
every sink needing it holds; a ``fanout ledger skip --release-spooled`` in another process
may release a batch a running pipeline's catch-up reads: that catch-up fails, reads the
sink's mark again and drops the batch, docs/architecture.md §14.4). Another instance on
the spool (in another process) may interleave: see docs/architecture.md §14.3.
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
from fanout.delta_tables.io import one_line, open_fanout_table, open_table, read_arrow
from fanout.delta_tables.retention import LOG_RETENTION_PROPERTY, OWN_LOG_RETENTION
from fanout.errors import (
    CheckpointResetError,
    CheckpointRollbackError,
    ConfigurationError,
    SpoolError,
)
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import location_secrets, redact
from fanout.spool.refusals import spool_reset_message, spool_rollback_message

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

log = logging.getLogger("fanout")

PIPELINE_COLUMN = "_fanout_pipeline"
EPOCH_COLUMN = "_fanout_epoch"
BATCH_COLUMN = "_fanout_batch"
PARTITION_COLUMNS = (PIPELINE_COLUMN, EPOCH_COLUMN, BATCH_COLUMN)
SPOOLING_COLUMN = "_fanout_spooling"
"""The id (a uuid) of the append that wrote a row: one per spooling of a batch. A spool
written by an older version has no such column (its rows read as one spooling)."""
RESERVED_COLUMNS = (*PARTITION_COLUMNS, SPOOLING_COLUMN)
SHORT_LOG = {LOG_RETENTION_PROPERTY: OWN_LOG_RETENTION}
"""The spool's tables keep minutes of Delta log: a sink behind for hours spools a batch
a commit, and delta-rs lists the whole log at each."""
STATS_PROPERTY = "delta.dataSkippingStatsColumns"
DATA_CONFIG = {**SHORT_LOG, STATS_PROPERTY: SPOOLING_COLUMN}
"""The data table's properties: its files' statistics are of :data:`SPOOLING_COLUMN`
alone (by default delta-rs keeps the first 32 columns', and the id comes last), so each
file's spooling is read from the Delta log, not from the file."""

BatchKey = tuple[int, int]
"""``(epoch, batch_id)``: batches sort by it."""

Chosen = Mapping[BatchKey, Iterable[str]] | Iterable[BatchKey]
"""Batches to remove, each with the sinks whose index rows go (a bare key: every sink the
instance knows needs it)."""


@dataclass(frozen=True)
class SpooledBatch:
    """One batch in the spool: what the ledger marks of its sinks carry, its Spark schema,
    its size, and the sinks that need it."""

    pipeline: str
    epoch: int
    batch_id: int
    rows: int
    schema_json: str
    spooled_at: datetime
    needed_by: frozenset[str] = frozenset()
    query_id: str | None = None
    source_offsets: str | None = None
    batch_timestamp_ms: int | None = None
    size_bytes: int = 0
    party: frozenset[str] | None = None
    """The sinks configured when the batch was spooled (every sink of the ``FanOut``, also
    those that wrote or failed it, but one held back while it backfills:
    :func:`fanout.steps.lag_steps.party_of_batch`): the sinks that took part in it.
    ``None``: spooled by a version that did not record them (see
    :func:`fanout.spool.settled.party_of`)."""
    files_read: bool = False
    """Whether ``size_bytes`` was read from the data table (else it is unknown: a reader of
    the index alone)."""
    replayed: frozenset[str] = frozenset()
    """The sinks it was spooled for from a batch Spark replayed whose earlier attempt may
    have written it to them (:attr:`fanout.steps.state.BatchState.doubted`,
    :func:`fanout.steps.lag_steps.may_hold`), and those a catch-up began writing it to
    (:meth:`Spool.note_replayed`): before the catch-up writes it to one of them, the sink
    is asked whether it can tell it holds the batch (:mod:`fanout.steps.replay_lag`). Kept
    in the index, so a later run asks too."""

    @property
    def key(self) -> BatchKey:
        """``(epoch, batch_id)``."""
        return (self.epoch, self.batch_id)

    @property
    def rows_missing(self) -> bool:
        """Whether the index records rows the data table does not hold (known only when
        its files were read): a spooling cut short between its index row and its rows (a
        replay of the same checkpoint appends them; after a reset nothing does), or rows
        another process removed (§14.3). Such a batch holds nothing for its sinks."""
        return self.files_read and self.rows > 0 and self.size_bytes == 0

    def info(self) -> BatchInfo:
        """The batch's context, as its live attempt had it: marks written from the spool
        carry the same query id, offsets and planning time, so the checkpoint guard
        reads them like any mark."""
        offsets = json.loads(self.source_offsets) if self.source_offsets else None
        return BatchInfo(
            self.pipeline,
            self.batch_id,
            self.query_id,
            offsets,
            epoch=self.epoch,
            batch_timestamp_ms=self.batch_timestamp_ms,
        )


def index_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("pipeline", pa.string(), nullable=False),
            pa.field("epoch", pa.int32(), nullable=False),
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("sink", pa.string(), nullable=False),
            pa.field("rows", pa.int64()),
            pa.field("schema_json", pa.string()),
            pa.field("query_id", pa.string()),
            pa.field("source_offsets", pa.string()),
            pa.field("batch_timestamp_ms", pa.int64()),
            pa.field("spooled_at", pa.timestamp("us", tz="UTC")),
            pa.field("party", pa.string()),  # JSON list; absent from older indexes
            pa.field("replayed", pa.bool_()),  # absent from older indexes
        ]
    )


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
        return f"{self.path.rstrip('/')}/index"

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
            self._merge(_from_index_row(row))
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
            if rows and not _any_files(data, self.pipeline, key):
                if table is None:  # removed (every sink then holding it), now needed again
                    table = self._arrow(df, info, arrow)
                data = self._append_rows(table, info, data)
            size = _sizes_in(data, self.pipeline, [key]).get(key, 0)
        except SpoolError:
            raise
        except Exception as exc:
            raise SpoolError(
                f"pipeline {self.pipeline!r}, batch {info.batch_id}: cannot spool the batch for "
                f"{', '.join(sorted(sinks))} at {self._shown}: {type(exc).__name__}: "
                + self._masked(exc)
            ) from exc
        merged = self._merge(batch)
        merged = self._batches[key] = replace(merged, size_bytes=size, files_read=True)
        return merged

    def _arrow(self, df: Any, info: BatchInfo, arrow: Callable[[], pa.Table] | None) -> pa.Table:
        table = arrow() if arrow is not None else df.toArrow()
        return _with_partition_columns(table, self.pipeline, info)

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
            with_rows = set(_sizes_in(data, self.pipeline))
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
            batch = _from_index_row(row)
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
        batch = _merged(self._batches.get(batch.key), batch)
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
        table = self._ready_for(arrow.schema, table)
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
            return self._append_own_types(arrow, table, app_id, info.batch_id)
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

    def _append_own_types(
        self, arrow: pa.Table, table: DeltaTable, app_id: str, batch_id: int
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
            self.data_path, pa.schema(first + rest), PARTITION_COLUMNS,
            self.storage_options, stats_columns=1,
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

    def _ready_for(self, schema: pa.Schema, table: DeltaTable | None) -> DeltaTable | None:
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
            return self._spooling_stats(table)
        if not ntz.hidden_ntz(stored):
            return None
        try:
            return ntz.create_table(
                self.data_path, stored, partition_by=PARTITION_COLUMNS, configuration=DATA_CONFIG,
                storage_options=self.storage_options,
            )  # fmt: skip
        except Exception:
            table = open_table(self.data_path, self.storage_options)
            if table is None:
                raise
            return self._ready_for(schema, table)  # another instance created it meanwhile

    def _spooling_stats(self, table: DeltaTable) -> DeltaTable:
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
            again = open_table(self.data_path, self.storage_options)
            if again is None or again.metadata().configuration.get(STATS_PROPERTY) != (
                SPOOLING_COLUMN
            ):
                raise
            return again  # another instance set it meanwhile
        return table

    def _append_index(self, batch: SpooledBatch, sinks: Iterable[str]) -> None:
        import pyarrow as pa
        from deltalake import write_deltalake

        rows = [
            {
                "pipeline": batch.pipeline,
                "epoch": batch.epoch,
                "batch_id": batch.batch_id,
                "sink": sink,
                "rows": batch.rows,
                "schema_json": batch.schema_json,
                "query_id": batch.query_id,
                "source_offsets": batch.source_offsets,
                "batch_timestamp_ms": batch.batch_timestamp_ms,
                "spooled_at": batch.spooled_at,
                "party": None if batch.party is None else json.dumps(sorted(batch.party)),
                "replayed": sink in batch.replayed,
            }
            for sink in sorted(sinks)
        ]
        write_deltalake(
            self.index_path,
            pa.Table.from_pylist(rows, schema=index_schema()),
            mode="append",
            schema_mode="merge",  # an older version's index lacks the party, replayed columns
            storage_options=dict(self.storage_options or {}) or None,
        )

    def _files(self, key: BatchKey) -> list[str]:
        return _files_in(open_table(self.data_path, self.storage_options), self.pipeline, key)

    def _sizes(self, keys: Iterable[BatchKey] | None = None) -> dict[BatchKey, int]:
        return _sizes_in(open_table(self.data_path, self.storage_options), self.pipeline, keys)


def _all_files(table: DeltaTable, pipeline: str, key: BatchKey) -> list[str]:
    predicate = [
        (PIPELINE_COLUMN, "=", pipeline),
        (EPOCH_COLUMN, "=", str(key[0])),
        (BATCH_COLUMN, "=", str(key[1])),
    ]
    return list(table.file_uris(file_pruning_predicate=predicate))


def _any_files(table: DeltaTable | None, pipeline: str, key: BatchKey) -> bool:
    """Whether ``table``'s loaded version holds rows of batch ``key``."""
    return table is not None and bool(_all_files(table, pipeline, key))


def _files_in(table: DeltaTable | None, pipeline: str, key: BatchKey) -> list[str]:
    """The files of one spooling of batch ``key`` in ``table``'s loaded version (each
    spooling appended all of its rows in one commit, and none was removed since)."""
    if table is None:
        return []
    uris = _all_files(table, pipeline, key)
    if len(uris) <= 1:  # the common case: one spooling, one file; its log read is enough
        return uris
    names = {name for name, _ in _one_spooling(table, pipeline, [key]).get(key, [])}
    return [uri for uri in uris if uri.rsplit("/", 1)[-1] in names]


def _sizes_in(
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


def existing_index(
    path: str,
    pipeline: str | None,
    storage_options: Mapping[str, str] | None = None,
    *,
    named: str = "--spool",
) -> Any:
    """The index table of the spool at ``path``, opened without creating anything. Raises
    :class:`fanout.ConfigurationError` when there is none: every ``FanOut`` given a spool
    creates it when it starts, so that is not the pipeline's spool, and a mistyped path
    read as an empty spool hides the lagging sinks (``fanout status``) or counts them at
    their marks, not at their spooled batches (``fanout recover``). ``named`` says where
    the path came from."""
    index_path = Spool(path, pipeline or "").index_path
    index = open_index(path, storage_options)
    if index is None:
        raise ConfigurationError(
            f"{named} {shown_location(path)}: no spool there (no {shown_location(index_path)} "
            "table, which a pipeline run "
            "with a spool creates when it starts); give the pipeline's spool "
            "(pipeline.spool in its file, FanOut(spool=...)), or leave --spool out"
        )
    return index


def open_index(path: str, storage_options: Mapping[str, str] | None = None) -> Any:
    """The index table of the spool at ``path`` read only (``None`` when there is none): a
    store that cannot be read (unreachable, credentials not found) is a
    :class:`fanout.SpoolError` naming the spool, not delta-rs' bare ``OSError`` (a
    traceback in ``fanout status`` and ``fanout validate``)."""
    return open_fanout_table(
        Spool(path, "").index_path,
        storage_options,
        error=SpoolError,
        what="spool",
        location=path,
        mask=lambda text: redact(text, location_secrets(path)),  # the store names the path
    )


def batches_of_index(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[SpooledBatch]]:
    """Per pipeline, its spooled batches (in batch order) from rows of the index (as
    dicts): each batch with the union of the sinks its rows name, as :meth:`Spool.open`
    reads them (without their sizes)."""
    found: dict[str, dict[BatchKey, SpooledBatch]] = {}
    for row in rows:
        batch = _from_index_row(row)
        known = found.setdefault(batch.pipeline, {})
        known[batch.key] = _merged(known.get(batch.key), batch)
    return {name: [b[k] for k in sorted(b)] for name, b in found.items()}


def _from_index_row(row: Mapping[str, Any]) -> SpooledBatch:
    return SpooledBatch(
        pipeline=row["pipeline"],
        epoch=int(row["epoch"]),
        batch_id=int(row["batch_id"]),
        rows=int(row["rows"] or 0),
        schema_json=row["schema_json"],
        spooled_at=row["spooled_at"],
        needed_by=frozenset([row["sink"]]),
        query_id=row["query_id"],
        source_offsets=row["source_offsets"],
        batch_timestamp_ms=row["batch_timestamp_ms"],
        party=frozenset(json.loads(row["party"])) if row.get("party") else None,
        replayed=frozenset([row["sink"]]) if row.get("replayed") else frozenset(),
    )


def _merged(current: SpooledBatch | None, batch: SpooledBatch) -> SpooledBatch:
    """Another index row of a batch (a replay's, another sink's) added to what is known."""
    if current is None:
        return batch
    party = _union(current.party, batch.party)
    return replace(
        current,
        needed_by=current.needed_by | batch.needed_by,
        party=party,
        replayed=current.replayed | batch.replayed,
    )


def _union(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    """Two recorded parties of one batch (rows of a replay, or of two instances) as one:
    every sink either names; unknown only when neither was recorded."""
    if a is None or b is None:
        return a if b is None else b
    return a | b


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


def _with_partition_columns(arrow: pa.Table, pipeline: str, info: BatchInfo) -> pa.Table:
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
