"""The spool's index, ``<spool>/index``: one row per (batch, sink that needs it), with what
the batch's ledger marks must carry (query id, source offsets, planning time), the batch's
Spark schema, the sinks configured when it was spooled (``party``: an older epoch's batch is
settled only once each of them holds it, :func:`fanout.spool.settled.party_of`), and whether
it was spooled for the sink from a replay an earlier attempt may have written, or a
catch-up began writing it to the sink (``replayed``: its catch-up asks the sink first,
:mod:`fanout.steps.replay_lag`). Rows of a replayed batch may repeat; readers take the
union. This module decides what a row says (:class:`SpooledBatch`, :func:`from_index_row`,
:func:`merged`, :func:`append_index`) and opens the index read only (:func:`open_index`,
:func:`existing_index`); :class:`fanout.spool.table.Spool` decides when rows are added or
deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import BatchInfo
from fanout.contract.locations import shown_location
from fanout.delta_tables.io import open_fanout_table
from fanout.delta_tables.retention import LOG_RETENTION_PROPERTY, OWN_LOG_RETENTION
from fanout.errors import ConfigurationError, SpoolError
from fanout.observe.secrets import location_secrets, redact

if TYPE_CHECKING:
    import pyarrow as pa

SHORT_LOG = {LOG_RETENTION_PROPERTY: OWN_LOG_RETENTION}
"""The spool's tables keep minutes of Delta log: a sink behind for hours spools a batch
a commit, and delta-rs lists the whole log at each."""

BatchKey = tuple[int, int]
"""``(epoch, batch_id)``: batches sort by it."""


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
    (:meth:`fanout.spool.table.Spool.note_replayed`): before the catch-up writes it to one
    of them, the sink is asked whether it can tell it holds the batch
    (:mod:`fanout.steps.replay_lag`). Kept in the index, so a later run asks too."""

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
    """The index table's Arrow schema."""
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


def append_index(
    index_path: str,
    storage_options: Mapping[str, str] | None,
    batch: SpooledBatch,
    sinks: Iterable[str],
) -> None:
    """Append one index row of ``batch`` per sink of ``sinks`` (one commit) to the index
    at ``index_path``."""
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
        index_path,
        pa.Table.from_pylist(rows, schema=index_schema()),
        mode="append",
        schema_mode="merge",  # an older version's index lacks the party, replayed columns
        storage_options=dict(storage_options or {}) or None,
    )


def index_location(path: str) -> str:
    """The index table of the spool at ``path`` (:attr:`fanout.spool.table.Spool.index_path`)."""
    return f"{path.rstrip('/')}/index"


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
    index_path = index_location(path)
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
        index_location(path),
        storage_options,
        error=SpoolError,
        what="spool",
        location=path,
        mask=lambda text: redact(text, location_secrets(path)),  # the store names the path
    )


def batches_of_index(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[SpooledBatch]]:
    """Per pipeline, its spooled batches (in batch order) from rows of the index (as
    dicts): each batch with the union of the sinks its rows name, as
    :meth:`fanout.spool.table.Spool.open` reads them (without their sizes)."""
    found: dict[str, dict[BatchKey, SpooledBatch]] = {}
    for row in rows:
        batch = from_index_row(row)
        known = found.setdefault(batch.pipeline, {})
        known[batch.key] = merged(known.get(batch.key), batch)
    return {name: [b[k] for k in sorted(b)] for name, b in found.items()}


def from_index_row(row: Mapping[str, Any]) -> SpooledBatch:
    """The batch one index row (as a dict) says, for the one sink it names."""
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


def merged(current: SpooledBatch | None, batch: SpooledBatch) -> SpooledBatch:
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
