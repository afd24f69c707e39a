"""The Delta sink keeps its table's snapshot between batches (fanout.delta_tables.kept).

Each batch starts from the snapshot the last one committed on, brought up to date, instead
of opening the table again; what changed meanwhile (another writer's commit, the table
deleted, or made again) must still be seen, so the rows and the log are exactly what
opening the table every batch gives.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltacheck import ids
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink

from fanout import testing
from fanout.contract.batch import Batch, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.delta_tables import io as deltaio
from fanout.delta_tables.kept import KeptTable

APP_ID = txn_app_id("p", "s")
WRITE_FROM = ["driver", "executors"]


def batch(batch_id: int, first: int, rows: int = 3) -> Batch:
    ids = list(range(first, first + rows))
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"b{batch_id}"] * rows})
    return testing.make_batch(data, batch_id=batch_id, pipeline="p", sink_name="s", query_id=None)


def opened_sink(path: Path, write_from: str) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), write_from=write_from)  # type: ignore[arg-type]
    sink.open(SinkContext(pipeline="p"))
    return sink


def sink_after(path: Path, write_from: str, batches: int) -> DeltaSink:
    """An opened sink that wrote batches ``0..batches-1`` (3 rows each, ids from 0)."""
    sink = opened_sink(path, write_from)
    for b in range(batches):
        sink.write(batch(b, 3 * b))
    return sink


def txns(path: Path) -> list[tuple[int, int]]:
    """``(table version, batch id)`` of every commit carrying the sink's app id."""
    found = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"] == APP_ID:
                found.append((int(commit.stem), int(txn["version"])))
    return found


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every table open from now on (``fanout.delta_tables.io.open_table``)."""
    seen: list[str] = []
    real = deltaio.open_table

    def counting(path: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(deltaio, "open_table", counting)
    return seen


@pytest.mark.parametrize("form", ["path", "file:/", "file:///"])
@pytest.mark.parametrize("write_from", WRITE_FROM)
def test_batches_after_open_write_without_opening_the_table(
    tmp_path: Path, write_from: str, form: str, opens: list[str]
) -> None:
    lake = tmp_path / "lake"
    # a local table named by its path, or by a file: URI as Hadoop (file:/x) or a browser
    # (file:///x) writes it: the executors' writer and the kept snapshot's check read both
    name = {"path": str(lake), "file:/": f"file:{lake}", "file:///": f"file://{lake}"}[form]
    write_deltalake(str(lake), pa.table({"id": pa.array([-1], pa.int64()), "v": ["old"]}))
    sink = DeltaSink(name="s", path=name, write_from=write_from)  # type: ignore[arg-type]
    sink.open(SinkContext(pipeline="p"))
    assert opens == [name]  # open() checks the table, and keeps that snapshot
    results = [sink.write(batch(b, 3 * b)) for b in range(3)]
    assert opens == [name]
    assert [r.rows for r in results] == [3, 3, 3]
    assert [r.details["version"] for r in results] == [1, 2, 3]
    assert ids(lake) == [-1, *range(9)]
    assert txns(lake) == [(1, 0), (2, 1), (3, 2)]
    replay = sink.write(batch(2, 6))  # the last batch again: found in the kept snapshot
    assert (replay.already_written, opens) == (True, [name])
    assert ids(lake) == [-1, *range(9)]
    assert sorted(p.name for p in lake.iterdir() if p.suffix == ".parquet") == sorted(
        Path(uri).name for uri in DeltaTable(str(lake)).file_uris()
    )  # every data file under the table, none elsewhere


@pytest.mark.parametrize("write_from", WRITE_FROM)
def test_another_writers_commit_between_batches_is_seen(
    tmp_path: Path, write_from: str, opens: list[str]
) -> None:
    lake = tmp_path / "lake"
    sink = sink_after(lake, write_from, 1)
    write_deltalake(
        str(lake), pa.table({"id": pa.array([100, 101], pa.int64()), "v": ["x", "x"]}),
        mode="append",
    )  # fmt: skip
    sink.write(batch(1, 3))
    assert ids(lake) == [0, 1, 2, 3, 4, 5, 100, 101]
    assert txns(lake) == [(0, 0), (2, 1)]  # committed after the other writer's version 1
    assert DeltaTable(str(lake)).version() == 2


@pytest.mark.parametrize("write_from", WRITE_FROM)
def test_a_table_deleted_between_batches_is_made_again(
    tmp_path: Path, write_from: str, opens: list[str]
) -> None:
    lake = tmp_path / "lake"
    sink = sink_after(lake, write_from, 2)
    shutil.rmtree(lake)
    result = sink.write(batch(2, 6))
    # a new table holding only the batch, from version 0: not a log starting at version 2
    assert (result.rows, result.already_written) == (3, False)
    assert ids(lake) == [6, 7, 8]
    assert txns(lake) == [(0, 2)]
    assert sorted(p.name for p in (lake / "_delta_log").glob("*.json")) == [f"{0:020d}.json"]


@pytest.mark.parametrize("write_from", WRITE_FROM)
def test_a_table_made_again_with_fewer_commits_is_opened_afresh(
    tmp_path: Path, write_from: str, opens: list[str]
) -> None:
    lake = tmp_path / "lake"
    sink = sink_after(lake, write_from, 3)
    shutil.rmtree(lake)
    write_deltalake(str(lake), pa.table({"id": pa.array([500], pa.int64()), "v": ["new"]}))
    sink.write(batch(3, 9))
    assert ids(lake) == [9, 10, 11, 500]
    assert txns(lake) == [(1, 3)]
    assert str(lake) in opens  # the kept snapshot (version 2) could not be brought up to date


def test_a_kept_snapshot_serves_one_caller_at_a_time(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    write_deltalake(str(lake), pa.table({"id": pa.array([1], pa.int64())}))
    kept = KeptTable(str(lake))
    table = DeltaTable(str(lake))
    kept.keep(table)
    first = kept.latest()
    second = kept.latest()  # the kept one is taken: this caller gets a table of its own
    assert first is table
    assert second is not None and second is not table
    assert (first.version(), second.version()) == (0, 0)
    kept.keep(first)
    assert kept.latest() is first
    kept.keep(first)
    kept.forget()
    assert kept.latest() is not first


def test_a_kept_table_pickles_without_its_snapshot(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    write_deltalake(str(lake), pa.table({"id": pa.array([1], pa.int64())}))
    kept = KeptTable(str(lake), {"timeout": "5s"})
    kept.keep(DeltaTable(str(lake)))
    copy = pickle.loads(pickle.dumps(kept))
    assert (copy.path, copy.storage_options, copy._table) == (str(lake), {"timeout": "5s"}, None)
    assert kept._table is not None


def test_no_table_yet_is_none_and_the_first_batch_keeps_the_table_it_made(
    tmp_path: Path, opens: list[str]
) -> None:
    lake = tmp_path / "lake"
    kept = KeptTable(str(lake))
    assert kept.latest() is None
    sink = opened_sink(lake, "driver")
    sink.write(batch(0, 0))  # creates the table (opened once after, to keep it)
    before = len(opens)
    sink.write(batch(1, 3))
    assert len(opens) == before
    assert ids(lake) == [0, 1, 2, 3, 4, 5]
    assert txns(lake) == [(0, 0), (1, 1)]
