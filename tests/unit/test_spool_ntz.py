"""The spool's data table and timestamps without a time zone inside maps: delta-rs (1.6)
neither gives a table it creates the ``timestampNtz`` feature for one there, nor adds the
feature when a later batch brings such a column (the spool merges schemas), and the kernel
then refuses the commit; a lagging sink's batch could not be spooled. Real spool (delta-rs)
in a tmp dir; the rows are read back from the data table."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from fanout.contract.batch import BatchInfo
from fanout.delta_tables.io import read_arrow
from fanout.ledger.entry import now_utc
from fanout.spool.table import Spool
from tests.unit.fakes import SchemaFrame

NTZ = pa.timestamp("us")
T1 = datetime(2024, 2, 29, 23, 59, 59, 999999)
T2 = datetime(9999, 12, 31, 0, 0, 0, 1)


def spooled(spool: Spool, batch_id: int, table: pa.Table) -> None:
    info = BatchInfo(pipeline="pipe", batch_id=batch_id, query_id="q")
    spool.add(SchemaFrame([]), info, ["s"], now_utc(), arrow=lambda: table)


OTHER_SPOOL_COLUMNS = ("_fanout_pipeline", "_fanout_epoch", "_fanout_spooling")  # the id: random


def data_rows(spool: Spool) -> list[dict[str, Any]]:
    rows = read_arrow(DeltaTable(spool.data_path)).to_pylist()
    names = {"_fanout_batch": "batch_id"}
    kept = [
        {names.get(k, k): v for k, v in r.items() if k not in OTHER_SPOOL_COLUMNS} for r in rows
    ]
    return sorted(kept, key=lambda r: r["id"])


def test_batches_with_ntz_in_maps_are_spooled_and_read_back(tmp_path):
    spool = Spool(str(tmp_path / "spool"), "pipe")
    spool.open()
    first = pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "m": pa.array([[("a", T1)], [("b", None)]], pa.map_(pa.string(), NTZ)),
    })  # fmt: skip
    later = pa.table({
        "id": pa.array([3], pa.int64()),
        "m": pa.array([[("c", T2)]], pa.map_(pa.string(), NTZ)),
        "keyed": pa.array([[(T2, 5)]], pa.map_(NTZ, pa.int32())),
    })  # fmt: skip

    spooled(spool, 0, first)
    spooled(spool, 1, later)

    assert data_rows(spool) == [
        {"id": 1, "m": [("a", T1)], "keyed": None, "batch_id": 0},
        {"id": 2, "m": [("b", None)], "keyed": None, "batch_id": 0},
        {"id": 3, "m": [("c", T2)], "keyed": [(T2, 5)], "batch_id": 1},
    ]
    protocol = DeltaTable(spool.data_path).protocol()
    assert "timestampNtz" in (protocol.reader_features or [])


def test_a_new_ntz_map_column_gets_the_feature_on_a_table_without_it(tmp_path):
    spool = Spool(str(tmp_path / "spool"), "pipe")
    spool.open()
    spooled(spool, 0, pa.table({"id": pa.array([1], pa.int64())}))
    assert not DeltaTable(spool.data_path).protocol().reader_features

    spooled(spool, 1, pa.table({
        "id": pa.array([2], pa.int64()),
        "m": pa.array([[("a", T1)]], pa.map_(pa.string(), NTZ)),
    }))  # fmt: skip

    assert data_rows(spool) == [
        {"id": 1, "batch_id": 0, "m": None},
        {"id": 2, "batch_id": 1, "m": [("a", T1)]},
    ]
