"""Every delta-rs check-then-write uses one snapshot (issue 13, hole 6).

A zombie writer (an old driver still running) commits the same transaction
``(app id, batch id)`` between fanout's ``transaction_version`` check and its write. The
write must then fail on delta-rs' conflict check instead of committing a second copy, and
fanout must re-check the fresh snapshot and count the batch as done: one commit with the
data, asserted on the table's rows and on the txn actions of its log.

The zombie is injected deterministically: ``transaction_version`` (``transaction_state``,
which the sink's writers read) is wrapped so that right after the check returns (the
moment of the race), another writer commits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from arrow_batches import opened
from deltalake import DeltaTable, write_deltalake

from fanout import testing
from fanout.contract.batch import Batch, txn_app_id
from fanout.delta_tables import io as deltaio
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import entries_from_arrow
from tests.unit.fakes import committed

APP_ID = txn_app_id("p", "s")


def make_batch(data: dict[str, list[Any]], batch_id: int) -> Batch:
    return testing.make_batch(
        pa.table(data), batch_id=batch_id, pipeline="p", sink_name="s", query_id=None
    )


def txn_commits(path: Path, app_id: str) -> list[tuple[int, int]]:
    """``(table version, txn version)`` of every commit in the log carrying ``app_id``."""
    found = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"] == app_id:
                found.append((int(commit.stem), int(txn["version"])))
    return found


def table_rows(path: Path) -> list[dict[str, Any]]:
    return deltaio.read_delta(str(path)).sort_by("id").to_pylist()


def zombie_after_first_check(
    monkeypatch: pytest.MonkeyPatch, module: Any, zombie: Callable[[], None]
) -> list[int]:
    """Wrap ``module.transaction_version`` (and, where ``module`` has it,
    ``transaction_state``, which the sink's writers read: the version and whether a later
    epoch fenced it): after the first lookup returns its answer, the zombie commits.
    Returns the list of lookups seen (for asserting the re-check)."""
    real = deltaio.transaction_state
    calls: list[int] = []

    def checked_then_raced(table: Any, app_id: str) -> tuple[int | None, bool]:
        answer = real(table, app_id)
        calls.append(1)
        if len(calls) == 1:
            zombie()
        return answer

    monkeypatch.setattr(module, "transaction_version", lambda t, a: checked_then_raced(t, a)[0])
    if hasattr(module, "transaction_state"):
        monkeypatch.setattr(module, "transaction_state", checked_then_raced)
    return calls


def zombie_append(path: Path, ids: list[int], app_id: str, version: int) -> Callable[[], None]:
    def commit() -> None:
        write_deltalake(
            str(path),
            pa.table({"id": pa.array(ids, pa.int64())}),
            mode="append",
            commit_properties=deltaio.commit_properties({app_id: version}),
        )

    return commit


# -- the Delta sink, engine rs ------------------------------------------------------------


def test_append_zombie_commit_between_check_and_write_leaves_one_copy(tmp_path, monkeypatch):
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"id": pa.array([1, 2], pa.int64())}, 0))
    calls = zombie_after_first_check(monkeypatch, deltaio, zombie_append(path, [3, 4], APP_ID, 1))

    result = sink.write(make_batch({"id": pa.array([3, 4], pa.int64())}, 1))

    assert [r["id"] for r in table_rows(path)] == [1, 2, 3, 4]
    assert txn_commits(path, APP_ID) == [(0, 0), (1, 1)]  # the zombie's commit, only
    assert DeltaTable(str(path)).version() == 1
    assert result.already_written is True
    assert len(calls) == 2  # checked, conflict, checked again on the fresh snapshot


def test_append_whose_snapshot_lost_its_log_to_a_zombie_is_checked_again(tmp_path, monkeypatch):
    """A table keeping a short log (``delta.logRetentionDuration``): the zombie's commits
    removed the log files after this write's snapshot, so delta-rs cannot check them for
    conflicts and refuses the commit. fanout re-checks the fresh snapshot: the zombie
    wrote the batch, so this write commits nothing."""
    path = tmp_path / "t"
    short_log = {"delta.checkpointInterval": "2", "delta.logRetentionDuration": "interval 1 minute"}
    sink = opened(path, configuration=short_log)
    sink.write(make_batch({"id": pa.array([1, 2], pa.int64())}, 0))

    def zombie() -> None:
        zombie_append(path, [3, 4], APP_ID, 1)()
        for n in range(3):  # another writer's commits: a checkpoint at version 4
            zombie_append(path, [100 + n], "other", n)()
        log = path / "_delta_log"
        for file in log.iterdir():  # ten minutes pass
            os.utime(file, (file.stat().st_mtime - 600,) * 2)
        zombie_append(path, [103], "other", 3)()  # removes the log before version 3

    calls = zombie_after_first_check(monkeypatch, deltaio, zombie)

    result = sink.write(make_batch({"id": pa.array([3, 4], pa.int64())}, 1))

    assert not (path / "_delta_log" / f"{1:020d}.json").exists()
    assert [r["id"] for r in table_rows(path)] == [1, 2, 3, 4, 100, 101, 102, 103]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1
    assert DeltaTable(str(path)).version() == 5  # nothing committed by this write
    assert result.already_written is True
    assert len(calls) == 2  # checked, refused, checked again on the fresh snapshot


def test_append_after_another_writer_changed_the_tables_metadata_is_written(tmp_path, monkeypatch):
    """Another writer changes a table property between the check and the write: delta-rs
    refuses the commit ("Metadata changed since last commit"); fanout re-checks the fresh
    snapshot and writes the batch once."""
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"id": pa.array([1, 2], pa.int64())}, 0))

    def alter() -> None:
        DeltaTable(str(path)).alter.set_table_properties({"delta.checkpointInterval": "50"})

    calls = zombie_after_first_check(monkeypatch, deltaio, alter)

    result = sink.write(make_batch({"id": pa.array([3, 4], pa.int64())}, 1))

    assert [r["id"] for r in table_rows(path)] == [1, 2, 3, 4]
    assert txn_commits(path, APP_ID) == [(0, 0), (2, 1)]
    assert DeltaTable(str(path)).metadata().configuration["delta.checkpointInterval"] == "50"
    assert result.rows == 2 and not result.already_written
    assert len(calls) == 2  # checked, refused, checked again on the fresh snapshot


def test_append_zombie_creating_the_table_between_check_and_write(tmp_path, monkeypatch):
    path = tmp_path / "t"
    sink = opened(path)
    zombie_after_first_check(monkeypatch, deltaio, zombie_append(path, [1, 2], APP_ID, 0))

    result = sink.write(make_batch({"id": pa.array([1, 2], pa.int64())}, 0))

    assert [r["id"] for r in table_rows(path)] == [1, 2]
    assert txn_commits(path, APP_ID) == [(0, 0)]
    assert result.already_written is True


def test_append_zombie_of_an_older_batch_does_not_stop_this_one(tmp_path, monkeypatch):
    """A conflicting commit with the same app id but a lower version: re-checked, not
    done, written on the fresh snapshot (no failure loop, no lost batch)."""
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"id": pa.array([1], pa.int64())}, 0))
    zombie_after_first_check(monkeypatch, deltaio, zombie_append(path, [2], APP_ID, 1))

    result = sink.write(make_batch({"id": pa.array([3], pa.int64())}, 2))

    assert [r["id"] for r in table_rows(path)] == [1, 2, 3]
    assert txn_commits(path, APP_ID) == [(0, 0), (1, 1), (2, 2)]
    assert result.rows == 1 and not result.already_written


def test_merge_zombie_commit_between_check_and_write_is_done_not_a_retry(tmp_path, monkeypatch):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"])
    sink.write(make_batch({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}, 0))

    def zombie() -> None:
        DeltaTable(str(path)).merge(
            pa.table({"id": pa.array([2, 3], pa.int64()), "v": ["B", "C"]}),
            "t.id = s.id",
            source_alias="s",
            target_alias="t",
            commit_properties=deltaio.commit_properties({APP_ID: 1}),
        ).when_matched_update_all().when_not_matched_insert_all().execute()

    zombie_after_first_check(monkeypatch, deltaio, zombie)

    result = sink.write(make_batch({"id": pa.array([2, 3], pa.int64()), "v": ["B", "C"]}, 1))

    assert table_rows(path) == [{"id": 1, "v": "a"}, {"id": 2, "v": "B"}, {"id": 3, "v": "C"}]
    assert txn_commits(path, APP_ID) == [(0, 0), (1, 1)]
    assert result.already_written is True


# -- per-batch side tables (dead letters) -------------------------------------------------


def test_append_once_zombie_between_check_and_write_appends_nothing(tmp_path, monkeypatch):
    path = tmp_path / "dead"
    write_deltalake(str(path), pa.table({"id": pa.array([0], pa.int64())}))
    zombie_after_first_check(monkeypatch, deltaio, zombie_append(path, [5], "dl", 7))

    appended = deltaio.append_once(str(path), pa.table({"id": pa.array([5], pa.int64())}),
                                   "dl", 7)  # fmt: skip

    assert appended is False
    assert [r["id"] for r in table_rows(path)] == [0, 5]
    assert txn_commits(path, "dl") == [(1, 7)]


# -- the ledger's own mark ----------------------------------------------------------------


def test_ledger_mark_raced_by_a_zombie_driver_is_recorded_once(tmp_path, monkeypatch):
    import fanout.ledger.delta_table as ledger_module

    path = str(tmp_path / "ledger")
    ours, zombie = DeltaLedger(path), DeltaLedger(path)
    ours.open()
    zombie.open()
    zombie_after_first_check(
        monkeypatch, ledger_module, lambda: zombie.mark_committed(committed("p", "s", 4, rows=9))
    )

    assert ours.mark_committed(committed("p", "s", 4, rows=9)) is False

    marks = [e for e in entries_from_arrow(ours.read()) if e.status == "committed"]
    assert [(e.sink, e.batch_id, e.rows) for e in marks] == [("s", 4, 9)]
    assert ours.last_committed("p", ["s"]) == {"s": 4}


def test_ledger_mark_raced_by_an_older_mark_is_still_recorded(tmp_path, monkeypatch):
    import fanout.ledger.delta_table as ledger_module

    path = str(tmp_path / "ledger")
    ours, zombie = DeltaLedger(path), DeltaLedger(path)
    ours.open()
    zombie.open()
    zombie_after_first_check(
        monkeypatch, ledger_module, lambda: zombie.mark_committed(committed("p", "s", 3, rows=1))
    )

    assert ours.mark_committed(committed("p", "s", 4, rows=2)) is True

    marks = [e for e in entries_from_arrow(ours.read()) if e.status == "committed"]
    assert sorted((e.batch_id, e.rows) for e in marks) == [(3, 1), (4, 2)]
    assert ours.last_committed("p", ["s"]) == {"s": 4}
    assert ours.high_water("p") == 4
