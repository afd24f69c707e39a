"""The data files a compaction changed, read from a Delta table's versions: which it removed
and added, whether they duplicated rows, and whether they are still in storage."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.delta_tables.values import partition_text

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataFile:
    """An active file of a table version, with what an action re-adding it needs."""

    path: str
    size: int
    modification_time: int
    rows: int | None
    partition_values: dict[str, str | None]


def at_version(table: DeltaTable, version: int, storage_options: Mapping[str, str] | None) -> Any:
    """``table`` loaded at ``version``."""
    from deltalake import DeltaTable

    return DeltaTable(
        table.table_uri, version=version, storage_options=dict(storage_options or {}) or None
    )


def changed(
    table: DeltaTable, version: int, storage_options: Mapping[str, str] | None
) -> tuple[list[DataFile], list[DataFile]]:
    """The files the commit at ``version`` removed and those it added."""
    before = files(at_version(table, version - 1, storage_options))
    after = files(at_version(table, version, storage_options))
    gone = [f for path, f in before.items() if path not in after]
    new = [f for path, f in after.items() if path not in before]
    return gone, new


def files(table: Any) -> dict[str, DataFile]:
    """The table's active files, by path, with what a re-add needs. The path is the
    file's name in storage, as delta-rs' actions take it: the log holds it URL-encoded
    (``city=New%20York/`` is ``city=New%2520York/`` there), and an action given that
    spelling is encoded again and names no file."""
    from urllib.parse import unquote

    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=False))
    partitions = actions.column("partition") if "partition" in actions.column_names else None
    found: dict[str, DataFile] = {}
    for i, action in enumerate(
        actions.drop_columns(["partition"] if partitions else []).to_pylist()
    ):
        values: dict[str, str | None] = {}
        if partitions is not None:
            scalar = partitions[i]
            for field in scalar.type:
                values[field.name] = _action_value(scalar[field.name]) if scalar.is_valid else None
        rows = action.get("num_records")
        path = unquote(action["path"])
        found[path] = DataFile(
            path=path,
            size=int(action["size_bytes"]),
            modification_time=int(action["modification_time"]),
            rows=None if rows is None else int(rows),
            partition_values=values,
        )
    return found


def _action_value(value: Any) -> str | None:
    """A file's partition value (an Arrow scalar) as an action re-adding the file names
    it: as :func:`fanout.delta_tables.values.partition_text` serializes it, a decimal in
    plain notation (``0.0000001``, not ``1E-7``), also a negative one with a fractional
    part, which that serializer refuses (delta-rs cannot write it; delta-spark can)."""
    import pyarrow.types as pat

    if value.is_valid and pat.is_decimal(value.type):
        return format(value.as_py(), "f")
    return partition_text(value)


def duplicates(gone: list[DataFile], new: list[DataFile], what: str, version: int) -> bool:
    """Whether the compaction committed at ``version`` added more rows than it removed:
    some of its files had been removed (rewritten) by another compaction first."""
    if any(f.rows is None for f in [*gone, *new]):
        log.warning(
            "%s: the compaction committed at version %d cannot be checked against a racing "
            "compaction (files without row counts)", what, version,
        )  # fmt: skip
        return False
    return sum(f.rows or 0 for f in new) > sum(f.rows or 0 for f in gone)


def undone(gone: list[DataFile], new: list[DataFile], now: Mapping[str, Any]) -> bool:
    """Whether a compaction that removed ``gone`` and added ``new`` is undone in the
    version whose files are ``now``: its added files gone again, the removed ones back."""
    return bool(gone) and not any(f.path in now for f in new) and all(f.path in now for f in gone)


def missing(
    table: DeltaTable, found: list[DataFile], storage_options: Mapping[str, str] | None
) -> list[str]:
    """Which of ``found`` (paths relative to ``table``'s root) are gone from its storage,
    looked up through delta-rs' own object store (a local disk or an object store alike):
    adding back a file vacuum deleted would fail every read of the table."""
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import FileType

    store = DeltaStorageHandler(table.table_uri, dict(storage_options or {}) or None)
    infos = store.get_file_info([f.path for f in found])
    gone = [f.path for f, info in zip(found, infos, strict=True) if info.type == FileType.NotFound]
    return sorted(gone)
