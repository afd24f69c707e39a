"""Delta tables holding timestamps without a time zone (``TIMESTAMP_NTZ``) where delta-rs
does not look for them.

A table with a ``TIMESTAMP_NTZ`` anywhere in its schema needs the ``timestampNtz`` reader
and writer feature. delta-rs (1.6) gives a table that feature by itself only when it finds
the type at the top level, in a struct or in an array: a ``TIMESTAMP_NTZ`` inside a map (its
key or its value, at any depth) is missed, and the kernel then refuses the commit ("Table
contains TIMESTAMP_NTZ columns but does not have the required 'timestampNtz' feature").
delta-rs takes the feature neither from table properties (``delta.feature.timestampNtz``
fails to parse) nor at creation, so :func:`create_table` creates such a table in two
commits: version 0 with each map stored as the list of its entries (a schema in which
delta-rs finds the type, so the table gets the feature), version 1 with the real schema
(metadata only, no data). A create interrupted between the two is finished by the next
writer (:func:`finish_create`), told by version 0's commit metadata.

An existing table without the feature that gains such a column (``merge_schema``) gets the
feature first (:func:`enable_feature`): delta-rs adds it by itself for an append's new
top-level, struct or array column, but neither for a map nor for any new column of a merge.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fanout.contract.nested_types import holds_arrow_type
from fanout.delta_tables.io import latest_version, numbered_history

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

FEATURE = "timestampNtz"
PENDING_SCHEMA = "fanout.pendingSchema"
"""Commit metadata of version 0 of a table :func:`create_table` made: the Delta schema
(JSON) version 1 gives the table."""


def holds_ntz(kind: pa.DataType) -> bool:
    """Whether ``kind`` is, or holds at any depth, a timestamp without a time zone."""
    return holds_arrow_type(kind, _is_ntz)


def hidden_ntz(schema: pa.Schema) -> bool:
    """Whether ``schema`` holds a timestamp without a time zone inside a map, where
    delta-rs does not find it when it creates a table (see the module's docstring)."""
    return any(holds_arrow_type(field.type, _is_map_holding_ntz) for field in schema)


def has_feature(table: DeltaTable) -> bool:
    """Whether ``table``'s protocol holds the ``timestampNtz`` reader and writer feature."""
    protocol = table.protocol()
    readers, writers = protocol.reader_features or (), protocol.writer_features or ()
    return FEATURE in readers and FEATURE in writers


def create_table(
    path: str,
    schema: pa.Schema,
    *,
    partition_by: Sequence[str] | None = None,
    configuration: Mapping[str, str | None] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> DeltaTable:
    """Create the empty Delta table at ``path`` with ``schema`` (Arrow, the types Delta
    stores) and the ``timestampNtz`` feature, in two commits (see the module's docstring).
    Fails like any create-if-missing when another writer created a table there first."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Schema

    placeholder = pa.schema([f.with_type(_maps_as_lists(f.type)) for f in schema])
    table = DeltaTable.create(
        path,
        placeholder,
        mode="error",
        partition_by=list(partition_by) if partition_by else None,
        configuration=dict(configuration) if configuration else None,
        storage_options=dict(storage_options) if storage_options else None,
        commit_properties=CommitProperties(
            custom_metadata={PENDING_SCHEMA: Schema.from_arrow(schema).to_json()}
        ),
    )
    log.info("%s: created with the timestampNtz feature (a map holds TIMESTAMP_NTZ)", path)
    _set_schema(table, Schema.from_arrow(schema))
    return table


def finish_create(table: DeltaTable | None) -> None:
    """Give ``table`` the schema :func:`create_table` meant for it, if its creation stopped
    after version 0 (a crash, a lost race); else nothing (one cheap check; at version 0,
    version 0's commit info, read by :func:`fanout.delta_tables.io.numbered_history`:
    delta-rs' own ``history(1)`` of a snapshot at 0 lists the newest commit in storage).
    A snapshot at 0 of a table committed to since is left as it is (its creation was
    finished by the commit after it, or by the creator)."""
    from deltalake import Schema

    if table is None or table.version() != 0:
        return
    info = numbered_history(table, 1)  # version 0's (delta-rs' own lists the newest commit)
    pending = info[0].get(PENDING_SCHEMA) if info else None
    if pending is None:
        return
    if latest_version(table) > 0:
        return  # committed to since this snapshot (the creation finished): not from it
    log.info("finishing the creation of a Delta table with the timestampNtz feature")
    _set_schema(table, Schema.from_json(pending))


def enable_feature(table: DeltaTable | None, schema: pa.Schema) -> bool:
    """Add the ``timestampNtz`` feature to ``table`` (a commit of its own) when ``schema``,
    the batch's, holds a timestamp without a time zone and the table lacks the feature:
    merging that schema into the table needs it. Returns whether it committed; ``table``
    is then at the new version."""
    from deltalake import TableFeatures

    if table is None or not any(holds_ntz(f.type) for f in schema) or has_feature(table):
        return False
    log.info("adding the timestampNtz feature to the Delta table (the batch adds a "
             "TIMESTAMP_NTZ column)")  # fmt: skip
    table.alter.add_feature(
        TableFeatures.TimestampWithoutTimezone, allow_protocol_versions_increase=True
    )
    return True


def _set_schema(table: DeltaTable, schema: object) -> None:
    """A metadata-only commit giving the empty ``table`` ``schema`` (a Delta schema)."""
    table.create_write_transaction(
        [],
        mode="overwrite",
        schema=schema,  # type: ignore[arg-type]
        partition_by=list(table.metadata().partition_columns) or None,
    )
    table.update_incremental()  # create_write_transaction leaves the snapshot behind


def _is_ntz(kind: pa.DataType) -> bool:
    import pyarrow.types as pat

    return bool(pat.is_timestamp(kind)) and kind.tz is None


def _is_map_holding_ntz(kind: pa.DataType) -> bool:
    import pyarrow.types as pat

    return bool(pat.is_map(kind)) and holds_ntz(kind)


def _maps_as_lists(kind: pa.DataType) -> pa.DataType:
    """``kind`` with each map stored as the list of its entries (``key``, ``value``)."""
    import pyarrow as pa
    import pyarrow.types as pat

    if pat.is_map(kind):
        entry = pa.struct([
            pa.field("key", _maps_as_lists(kind.key_type), nullable=False),
            kind.item_field.with_type(_maps_as_lists(kind.item_type)).with_name("value"),
        ])  # fmt: skip
        return pa.list_(entry)
    if pat.is_struct(kind):
        return pa.struct([f.with_type(_maps_as_lists(f.type)) for f in kind])
    if pat.is_list(kind):
        item = kind.value_field
        return pa.list_(item.with_type(_maps_as_lists(item.type)))
    return kind
