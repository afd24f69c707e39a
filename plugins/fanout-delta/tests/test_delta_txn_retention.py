"""fanout's Delta transaction ids against ``delta.setTransactionRetentionDuration``
(issue 13, item 8).

Every transaction fanout commits carries ``lastUpdated`` (delta-spark drops one without it
at its next checkpoint whenever the table sets a retention), and a sink or ledger table
whose retention is shorter than the outage a pipeline may have is refused at ``open()``
with a message naming the table, the property, its value and what to do.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink

from fanout import testing
from fanout.contract.batch import Batch, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.delta_tables import io as deltaio
from fanout.delta_tables.retention import PROPERTY
from fanout.errors import ConfigurationError
from fanout.ledger.delta import DeltaLedger
from tests.unit.fakes import committed

APP_ID = txn_app_id("p", "s")


def make_batch(data: dict[str, list[Any]], batch_id: int) -> Batch:
    return testing.make_batch(
        pa.table(data), batch_id=batch_id, pipeline="p", sink_name="s", query_id=None
    )


def txn_actions(path: Path) -> list[dict[str, Any]]:
    """Every txn action in the table's log, in commit order."""
    return [
        action["txn"]
        for commit in sorted((path / "_delta_log").glob("*.json"))
        for action in map(json.loads, commit.read_text().splitlines())
        if "txn" in action
    ]


def table_with_retention(path: Path, value: str) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array([0], pa.int64())}),
                    configuration={PROPERTY: value})  # fmt: skip


# -- lastUpdated on every transaction -----------------------------------------------------


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_sink_commits_carry_last_updated(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "t"
    sink = DeltaSink("s", path=str(path), mode=mode, keys=["id"] if mode == "merge" else None)
    sink.open(SinkContext(pipeline="p"))
    before = int(time.time() * 1000)
    sink.write(make_batch({"id": pa.array([1], pa.int64())}, 0))
    sink.write(make_batch({"id": pa.array([2], pa.int64())}, 1))
    after = int(time.time() * 1000)

    txns = txn_actions(path)
    assert [(t["appId"], t["version"]) for t in txns] == [(APP_ID, 0), (APP_ID, 1)]
    assert all(before <= (t.get("lastUpdated") or 0) <= after for t in txns), txns


def test_ledger_marks_and_side_tables_carry_last_updated(tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    before = int(time.time() * 1000)
    ledger.mark_committed(committed("p", "s", 3))
    deltaio.append_once(str(tmp_path / "dead"), pa.table({"x": [1]}), "dl", 3)
    after = int(time.time() * 1000)

    txns = txn_actions(tmp_path / "ledger") + txn_actions(tmp_path / "dead")
    assert sorted((t["appId"], t["version"]) for t in txns) == [
        ("dl", 3), ("fanout/p", 3), ("fanout/p/s", 3)
    ]  # fmt: skip
    assert all(before <= (t.get("lastUpdated") or 0) <= after for t in txns), txns


# -- the retention property, checked at open() ---------------------------------------------


def test_sink_refuses_a_table_whose_retention_is_shorter_than_a_week(tmp_path: Path) -> None:
    path = tmp_path / "t"
    table_with_retention(path, "interval 1 hours")
    sink = DeltaSink("orders_delta", path=str(path))

    with pytest.raises(ConfigurationError) as caught:
        sink.open(SinkContext(pipeline="p"))

    text = str(caught.value)
    assert f"Delta sink 'orders_delta' (table '{path}')" in text
    assert f"{PROPERTY} = 'interval 1 hours'" in text
    assert "less than 7 days" in text
    assert "written again" in text
    assert "UNSET TBLPROPERTIES" in text and "'interval 7 days'" in text
    assert "min_txn_retention_hours" in text


def test_sink_refuses_a_short_retention_in_its_own_configuration(tmp_path: Path) -> None:
    sink = DeltaSink("s", path=str(tmp_path / "new"), configuration={PROPERTY: "interval 2 days"})
    with pytest.raises(ConfigurationError, match="'interval 2 days'"):
        sink.open(SinkContext(pipeline="p"))


def test_sink_accepts_a_long_retention_with_a_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "t"
    table_with_retention(path, "interval 30 days")
    with caplog.at_level(logging.WARNING):
        DeltaSink("s", path=str(path)).open(SinkContext(pipeline="p"))
    warned = [r.getMessage() for r in caplog.records if PROPERTY in r.getMessage()]
    assert len(warned) == 1 and "'interval 30 days'" in warned[0] and "30 days" in warned[0]


def test_sink_floor_is_an_option(tmp_path: Path) -> None:
    path = tmp_path / "t"
    table_with_retention(path, "interval 1 hours")
    sink = DeltaSink("s", path=str(path), min_txn_retention_hours=0.5)
    sink.open(SinkContext(pipeline="p"))  # no error
    with pytest.raises(ConfigurationError, match="min_txn_retention_hours"):
        DeltaSink("s", path=str(path), min_txn_retention_hours=-1).open(SinkContext("p"))


def test_sink_refuses_a_retention_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "t"
    table_with_retention(path, "a fortnight")
    with pytest.raises(ConfigurationError) as caught:
        DeltaSink("s", path=str(path)).open(SinkContext(pipeline="p"))
    assert f"{PROPERTY} = 'a fortnight' is not an interval" in str(caught.value)


def test_ledger_refuses_a_retention_that_would_expire_its_epoch(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    DeltaLedger(str(path)).open()
    DeltaTable(str(path)).alter.set_table_properties({PROPERTY: "interval 30 days"})

    with pytest.raises(ConfigurationError) as caught:
        DeltaLedger(str(path)).open()

    text = str(caught.value)
    assert f"ledger at {path}: table property {PROPERTY} = 'interval 30 days'" in text
    assert "epoch" in text and "'interval 3650 days'" in text
