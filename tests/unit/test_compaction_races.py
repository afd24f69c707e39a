"""Compactions racing other compactions of the same Delta table (ARCHITECTURE §4), on real
delta-rs tables: what delta-rs does with two racing commits (the facts the design rests
on), fanout's taking back of a compaction that came second, and the ledger's compaction
by an overwrite of its own rows."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from fanout.delta_tables.compaction import compact
from fanout.delta_tables.io import read_arrow
from fanout.errors import LedgerError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, now_utc


def _table(path: Path, ids: range, **kwargs: Any) -> str:
    for i in ids:
        write_deltalake(str(path), pa.table({"id": [i]}), mode="append", **kwargs)
    return str(path)


def _ids(path: str, version: int | None = None) -> list[int]:
    return sorted(read_arrow(DeltaTable(path, version=version)).column("id").to_pylist())


def _log(path: str, version: int) -> list[dict[str, Any]]:
    text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _optimize(table: DeltaTable) -> None:
    table.optimize.compact()


def _overwrite(table: DeltaTable) -> None:
    write_deltalake(table, read_arrow(table), mode="overwrite")


# -- what delta-rs does ---------------------------------------------------------------


@pytest.mark.parametrize("second", [_optimize, _overwrite], ids=["optimize", "overwrite"])
def test_delta_rs_commits_a_compaction_whose_files_an_optimize_removed_first(
    tmp_path: Path, second: Any
) -> None:
    """The finding, in delta-rs alone: its conflict check counts only removals with
    ``dataChange=true``, an ``OPTIMIZE``'s are ``false``. When a delta-rs release refuses
    these commits, this test fails: fanout's taking back is then never needed."""
    path = _table(tmp_path / "t", range(4))
    first, late = DeltaTable(path), DeltaTable(path)
    first.optimize.compact()
    second(late)
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("second", [_optimize, _overwrite], ids=["optimize", "overwrite"])
def test_delta_rs_refuses_a_compaction_planned_before_an_overwrite(
    tmp_path: Path, second: Any
) -> None:
    path = _table(tmp_path / "t", range(4))
    first, late = DeltaTable(path), DeltaTable(path)
    _overwrite(first)
    with pytest.raises(CommitFailedError, match="concurrent transaction deleted data"):
        second(late)
    assert _ids(path) == [0, 1, 2, 3]
    assert len(DeltaTable(path).file_uris()) == 1


def test_an_append_committed_during_an_overwrite_survives_it(tmp_path: Path) -> None:
    path = _table(tmp_path / "t", range(4))
    stale = DeltaTable(path)
    write_deltalake(path, pa.table({"id": [9]}), mode="append")
    _overwrite(stale)  # rewrites the four rows it read, keeps the file it did not
    assert _ids(path) == [0, 1, 2, 3, 9]


def test_an_append_planned_before_an_overwrite_is_refused_and_commits_again(
    tmp_path: Path,
) -> None:
    path = _table(tmp_path / "t", range(4))
    stale = DeltaTable(path)
    _overwrite(DeltaTable(path))
    with pytest.raises(CommitFailedError, match="concurrent transaction deleted data"):
        write_deltalake(stale, pa.table({"id": [9]}), mode="append")
    write_deltalake(path, pa.table({"id": [9]}), mode="append")  # the retry, fresh
    assert _ids(path) == [0, 1, 2, 3, 9]


# -- fanout's compaction --------------------------------------------------------------


def test_a_compaction_after_another_programs_optimize_of_the_same_files_is_taken_back(
    tmp_path: Path,
) -> None:
    path = _table(tmp_path / "t", range(4))
    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()  # another program, first (version 4)

    done = compact(mine, "test table", None)  # marks the table (5), compacts (6)

    assert done.taken_back and (done.files_added, done.files_removed) == (0, 0)
    assert done.version == mine.version() == 7
    assert _ids(path) == [0, 1, 2, 3]
    assert len(DeltaTable(path).file_uris()) == 1  # the other program's file
    assert _ids(path, version=6) == [0, 0, 1, 1, 2, 2, 3, 3]  # the window: one version
    back = [a for a in _log(path, 7) if "add" in a or "remove" in a]
    assert [("remove" in a, (a.get("add") or a.get("remove"))["dataChange"]) for a in back] == [
        (True, False)
    ]  # a reader streaming the table skips it, as it skipped the compaction


def test_a_compaction_taken_back_in_partitions_whose_values_need_escaping_keeps_rows_once(
    tmp_path: Path,
) -> None:
    """The files of a partition ``city=New York`` live in ``city=New%20York/``, and the
    log names them URL-encoded once more (``city=New%2520York/...``): the taking back
    removes and adds back the files themselves. It named them encoded a third time, so
    it removed nothing (every row stayed twice) and added back files that do not exist."""
    path = str(tmp_path / "t")
    for i, city in enumerate(["New York", "New York", "x:y/z", "x:y/z"]):
        rows = pa.table({"id": [i], "city": [city]})
        write_deltalake(path, rows, mode="append", partition_by=["city"])
    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()  # another program, first

    done = compact(mine, "test table", None)

    assert done.taken_back
    table = DeltaTable(path)
    rows = read_arrow(table).to_pydict()
    assert sorted(zip(rows["id"], rows["city"], strict=True)) == [
        (0, "New York"), (1, "New York"), (2, "x:y/z"), (3, "x:y/z")
    ]  # fmt: skip
    assert len(table.file_uris()) == 2  # the other program's two compacted files


def test_a_compaction_in_decimal_partitions_is_checked_and_taken_back(tmp_path: Path) -> None:
    """A table partitioned by a decimal column: the check after the compaction read its
    files' partition values with a serializer that knows no decimal, so it raised a
    TypeError after the compaction had committed (logged by the Delta sink as a failed
    compaction to retry), and a compaction that came second was never taken back."""
    from decimal import Decimal

    path = str(tmp_path / "t")
    for i, band in enumerate([Decimal("1.50"), Decimal("1.50"), Decimal("0.0000001")] * 2):
        rows = pa.table({"id": [i], "band": pa.array([band], pa.decimal128(12, 7))})
        write_deltalake(path, rows, mode="append", partition_by=["band"])
    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()  # another program, first

    done = compact(mine, "test table", None)

    assert done.taken_back
    rows = read_arrow(DeltaTable(path)).to_pydict()
    assert sorted(zip(rows["id"], rows["band"], strict=True)) == [
        (0, Decimal("1.5000000")), (1, Decimal("1.5000000")), (2, Decimal("0.0000001")),
        (3, Decimal("1.5000000")), (4, Decimal("1.5000000")), (5, Decimal("0.0000001")),
    ]  # fmt: skip
    assert len(DeltaTable(path).file_uris()) == 2  # the other program's two compacted files


def test_a_compaction_overlapping_part_of_another_keeps_every_row_once(tmp_path: Path) -> None:
    """The other compaction planned before a file was appended: this one rewrote that
    file too. Taking it back restores that file, in its partition."""
    path = str(tmp_path / "t")
    day = dt.date(2026, 11, 29)
    for i in range(4):
        rows = pa.table({"id": [i], "day": pa.array([day], pa.date32())})
        write_deltalake(path, rows, mode="append", partition_by=["day"])
    other = DeltaTable(path)  # plans on ids 0-3
    write_deltalake(path, pa.table({"id": [4], "day": pa.array([day], pa.date32())}), mode="append")
    mine = DeltaTable(path)  # plans on ids 0-4
    other.optimize.compact()

    done = compact(mine, "test table", None)

    assert done.taken_back
    assert _ids(path) == [0, 1, 2, 3, 4]
    table = DeltaTable(path)
    assert len(table.file_uris()) == 2  # the other's compacted file, and id 4's again
    assert read_arrow(table).column("day").to_pylist() == [day] * 5


def test_a_compaction_nobody_raced_stays(tmp_path: Path) -> None:
    path = _table(tmp_path / "t", range(4))
    done = compact(DeltaTable(path), "test table", None)
    assert (done.taken_back, done.files_removed, done.files_added) == (False, 4, 1)
    assert _ids(path) == [0, 1, 2, 3]
    assert DeltaTable(path).version() == 5  # the table's mark (4), the compaction


def _racing_history(monkeypatch: pytest.MonkeyPatch, path: str, calls: set[int]) -> None:
    """Another writer appends (ids 100 on) as the history is read, at the calls ``calls``
    (counted from 0), each of the two reads allowed."""
    history, seen = DeltaTable.history, iter(range(100, 200))

    def racing(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
        call = next(seen)
        if call - 100 in calls:
            write_deltalake(path, pa.table({"id": [call]}), mode="append")
        return history(table, limit)

    monkeypatch.setattr(DeltaTable, "history", racing)
    monkeypatch.setattr("fanout.delta_tables.io.HISTORY_READS", 2)


def test_a_compaction_whose_history_reads_all_raced_writers_says_its_rows_may_be_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read of the history raced by another writer's commit: the compaction, which
    another program's OPTIMIZE of the same files came before, is left unchecked, its rows
    twice until the next fanout compaction checks it: the error says so, and what to do
    (before, it said to run the compaction again, which left them twice); the next
    compaction takes it back."""
    from fanout.errors import CompactionError

    path = _table(tmp_path / "t", range(4))
    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()  # another program, first (version 4)
    _racing_history(monkeypatch, path, {1, 2})  # the scan's read first (no mark) left alone

    with pytest.raises(CompactionError) as raised:
        compact(mine, "sink 'orders' table /t", None)

    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3, 101, 102]  # left as the error says
    text = str(raised.value)
    assert text.startswith(
        "sink 'orders' table /t: the compaction committed after version 3 could not be "
        "checked against another compaction of the same files"
    ), text
    assert "rows are now in the table twice" in text and "RESTORE the table to" in text, text
    assert "run the compaction again" not in text, text
    monkeypatch.undo()
    compact(DeltaTable(path), "sink 'orders' table /t", None)
    assert _ids(path) == [0, 1, 2, 3, 101, 102]


def test_a_taking_back_whose_history_reads_all_raced_writers_says_it_was_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction taken back, the version of its taking back unread (each read raced):
    the error names the compaction, says it was taken back, and what the unchecked third
    compaction would have left (before: "not checked against a compaction racing it",
    false: it was, and taken back)."""
    from fanout.errors import CompactionError

    path = _table(tmp_path / "t", range(4))
    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()  # another program, first (version 4)
    _racing_history(monkeypatch, path, {2, 3})  # the scan's and the compaction's left alone

    with pytest.raises(CompactionError) as raised:
        compact(mine, "sink 'orders' table /t", None)

    assert _ids(path) == [0, 1, 2, 3, 102, 103]  # taken back: each row once
    text = str(raised.value)
    assert text.startswith(
        "sink 'orders' table /t: the compaction committed at version 6 rewrote files another "
        "compaction had rewritten first, and was taken back; whether a third compaction "
        "rewrote its files before that could not be checked"
    ), text


# -- the ledger -----------------------------------------------------------------------


def _mark(pipeline: str, sink: str, batch_id: int) -> LedgerEntry:
    return LedgerEntry(
        pipeline=pipeline, sink=sink, batch_id=batch_id, status="committed", query_id="q",
        started_at=now_utc(),
    )  # fmt: skip


def _marked(ledger: DeltaLedger) -> dict[str, Any]:
    return {
        "orders": ledger.last_committed("orders", ["a", "b"]),
        "users": ledger.last_committed("users", ["a"]),
        "high": (ledger.high_water("orders"), ledger.high_water("users")),
    }


def _rows(path: str) -> list[tuple[str, str, int]]:
    rows = DeltaLedger(path).read().to_pylist()
    return sorted((r["pipeline"], r["sink"], r["batch_id"]) for r in rows)


def _filled(path: str) -> DeltaLedger:
    ledger = DeltaLedger(path, compact_after_files=None)
    ledger.open()
    for batch_id in range(3):
        ledger.mark_committed(_mark("orders", "a", batch_id))
        ledger.mark_committed(_mark("users", "a", batch_id))
    ledger.mark_committed(_mark("orders", "b", 0))
    return ledger


ROWS = sorted(
    [("orders", "a", b) for b in range(3)]
    + [("users", "a", b) for b in range(3)]
    + [("orders", "b", 0)]
)
MARKS = {"orders": {"a": 2, "b": 0}, "users": {"a": 2}, "high": (2, 2)}


def test_the_ledgers_compaction_keeps_every_row_and_mark_and_old_reads(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    before = DeltaTable(path).version()

    report = ledger.maintain(vacuum_retention_hours=None, checkpoint=False, cleanup_logs=False)

    assert report.files_compacted == 7
    assert _rows(path) == ROWS
    assert _marked(DeltaLedger(path)) == MARKS  # the marks are the log's transactions
    assert len(DeltaTable(path).file_uris()) == 2  # one file per pipeline
    old = read_arrow(DeltaTable(path, version=before)).to_pylist()  # a reader of before
    assert sorted((r["pipeline"], r["sink"], r["batch_id"]) for r in old) == ROWS


def test_a_mark_committed_during_the_ledgers_compaction_stays_once(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    stale = DeltaTable(path)
    other = DeltaLedger(path)  # a second pipeline's FanOut on the same ledger
    other.mark_committed(_mark("users", "a", 3))

    ledger._table.compact(stale)  # as after its own mark, on the snapshot of that commit

    assert _rows(path) == sorted([*ROWS, ("users", "a", 3)])
    assert _marked(DeltaLedger(path)) == {**MARKS, "users": {"a": 3}, "high": (2, 3)}


def test_a_mark_committed_as_the_compaction_reads_the_history_is_not_taken_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs (1.6) lists a table's history from the newest commit in storage but numbers
    it down from the snapshot's version: a mark committed between the compaction's refresh
    and its history read made the compaction's own commit look one version older, the mark
    before it the compaction, which then "took back" that mark's file (its row lost)."""
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    stale = DeltaTable(path)
    other = DeltaLedger(path, compact_after_files=None)  # a second pipeline's FanOut
    other.mark_committed(_mark("users", "a", 3))  # after the compaction's snapshot
    history = DeltaTable.history
    marks = iter([_mark("users", "a", 4)])

    def racing(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
        for entry in marks:  # once: the next mark lands as the history is read
            other.mark_committed(entry)
        return history(table, limit)

    monkeypatch.setattr(DeltaTable, "history", racing)
    ledger._table.compact(stale)

    assert _rows(path) == sorted([*ROWS, ("users", "a", 3), ("users", "a", 4)])
    assert _marked(DeltaLedger(path)) == {**MARKS, "users": {"a": 4}, "high": (2, 4)}
    assert len(DeltaTable(path).file_uris()) == 4  # the compaction stays: 2, and 2 marks


def test_a_mark_planned_before_the_ledgers_compaction_commits_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A second pipeline's FanOut checked its marks on the snapshot before the compaction:
    delta-rs refuses its append (the overwrite removed files with dataChange=true), and
    the mark is checked and committed again on the fresh snapshot."""
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    other = DeltaLedger(path, compact_after_files=None)
    other.open()
    other.lookup("users", ["a"])  # its batch's lookup: the snapshot its mark commits on

    ledger.maintain(vacuum_retention_hours=None, checkpoint=False, cleanup_logs=False)
    with caplog.at_level(logging.INFO, logger="fanout.ledger.delta"):
        assert other.mark_committed(_mark("users", "a", 3))
    assert "lost a commit race" in caplog.text  # refused once, committed on the fresh one
    other.record_failure(_failure("users", "a", 4))

    assert _rows(path) == sorted([*ROWS, ("users", "a", 3), ("users", "a", 4)])
    assert _marked(DeltaLedger(path)) == {**MARKS, "users": {"a": 3}, "high": (2, 3)}


def _failure(pipeline: str, sink: str, batch_id: int) -> LedgerEntry:
    return LedgerEntry(
        pipeline=pipeline, sink=sink, batch_id=batch_id, status="failed", query_id="q",
        started_at=now_utc(), error="target down",
    )  # fmt: skip


def test_an_optimize_planned_before_the_ledgers_compaction_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    other = DeltaTable(path)  # another program's OPTIMIZE of the ledger, planned

    ledger.maintain(vacuum_retention_hours=None, checkpoint=False, cleanup_logs=False)

    with pytest.raises(CommitFailedError):
        other.optimize.compact()
    assert _rows(path) == ROWS


def test_the_ledgers_compaction_after_another_programs_optimize_is_taken_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    stale = DeltaTable(path)
    DeltaTable(path).optimize.compact()  # another program, first

    ledger._table.compact(stale)

    assert _rows(path) == ROWS
    assert "raced another compaction" in caplog.text and "taken back" in caplog.text
    assert _marked(DeltaLedger(path)) == MARKS


class _MaintainedMeanwhile(DeltaLedger):
    """``fanout ledger maintain`` run twice at once: the other one compacts first."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        compaction = self._table.compaction

        def raced(table: Any) -> Any:
            DeltaLedger(self.path).maintain(vacuum_retention_hours=None, checkpoint=False)
            return compaction(table)

        self._table.compaction = raced  # type: ignore[method-assign]


class _MaintainedMeanwhileOnce(DeltaLedger):
    """``fanout ledger maintain`` run twice at once: the other one compacts first, once."""

    raced = 0

    def __init__(self, path: str) -> None:
        super().__init__(path)
        compaction = self._table.compaction

        def raced_once(table: Any) -> Any:
            if not self.raced:
                self.raced += 1
                _filled_more(self.path)
                DeltaLedger(self.path).maintain(vacuum_retention_hours=None, checkpoint=False)
            return compaction(table)

        self._table.compaction = raced_once  # type: ignore[method-assign]


def _filled_more(path: str) -> None:
    """Another mark, so the other maintenance has small files to compact."""
    DeltaLedger(path).mark_committed(_mark("extra", "s", 0))


def test_a_maintenance_whose_compaction_lost_the_race_compacts_again_on_a_fresh_snapshot(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "ledger")
    _filled(path)
    report = _MaintainedMeanwhileOnce(path).maintain(vacuum_retention_hours=None)
    assert report.version_after > report.version_before
    assert _rows(path) == sorted([*ROWS, ("extra", "s", 0)])  # each row once
    assert _marked(DeltaLedger(path)) == MARKS


def test_a_maintenance_whose_compactions_all_lost_the_race_says_to_run_it_again(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "ledger")
    _filled(path)
    again = r"(?s)refused every one .*run `fanout ledger maintain` again"
    with pytest.raises(LedgerError, match=again):
        _MaintainedMeanwhile(path).maintain(vacuum_retention_hours=None)
    assert _rows(path) == ROWS
    assert _marked(DeltaLedger(path)) == MARKS


def test_a_maintenance_whose_vacuum_meets_a_compaction_vacuums_again_on_a_fresh_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs commits a vacuum, and refuses it after a compaction committed since its
    snapshot (a running pipeline's own): before, `fanout ledger maintain` ended with that
    bare CommitFailedError (a traceback); now it vacuums again on the fresh snapshot."""
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    vacuum = DeltaTable.vacuum
    racers = iter([DeltaLedger(path)])

    def racing(table: DeltaTable, *args: Any, **kwargs: Any) -> list[str]:
        for other in racers:  # once: another FanOut marks and compacts as the vacuum starts
            other.mark_committed(_mark("users", "a", 3))
            other.maintain(vacuum_retention_hours=None, checkpoint=False, cleanup_logs=False)
        return vacuum(table, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "vacuum", racing)
    report = ledger.maintain(vacuum_retention_hours=0)

    assert _rows(path) == sorted([*ROWS, ("users", "a", 3)])
    assert _marked(DeltaLedger(path)) == {**MARKS, "users": {"a": 3}, "high": (2, 3)}
    assert len(report.files_vacuumed) == 10  # the 8 marks' files, and the first compaction's 2
    assert len(DeltaTable(path).file_uris()) == 2


def test_a_maintenance_without_compaction_whose_vacuums_all_met_commits_says_what_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every vacuum refused (another writer's commit each time), ``--no-compact``: the
    error counts the vacuums and says to run it again, and names no compaction, since
    none ran (before: 'the compaction before it stays')."""
    path = str(tmp_path / "ledger")
    ledger = _filled(path)
    tries: list[int] = []

    def refused(table: DeltaTable, *args: Any, **kwargs: Any) -> list[str]:
        tries.append(table.version())
        raise CommitFailedError("a concurrent transaction deleted data this operation read")

    monkeypatch.setattr(DeltaTable, "vacuum", refused)
    with pytest.raises(LedgerError) as raised:
        ledger.maintain(compact=False, vacuum_retention_hours=0)

    assert len(tries) == 5
    text = str(raised.value)
    assert text.startswith(
        f"ledger at {path}: other writers committed while each of 5 vacuums ran"
    ), text
    assert "compaction" not in text, text
    assert text.endswith("nothing was lost: run `fanout ledger maintain` again"), text
    assert _rows(path) == ROWS
    assert _marked(DeltaLedger(path)) == MARKS


# -- a compaction left unchecked (its process killed), found by a later run ---------------


def _unchecked(path: str, other_first: bool = True) -> None:
    """What a fanout compaction whose process was killed right after its commit leaves:
    its tagged commit, another program's OPTIMIZE of the same files before it when
    ``other_first``, no check and no taking back; the table's mark of fanout's compactions
    (committed by its first one) before them."""
    from deltalake import CommitProperties

    _compactions_marked(path)
    mine = DeltaTable(path)
    if other_first:
        DeltaTable(path).optimize.compact()
    tag = CommitProperties(custom_metadata={"fanoutCommit": "compaction killed"})
    mine.optimize.compact(commit_properties=tag)


def _compactions_marked(path: str) -> None:
    """The mark fanout's first compaction of the table (which none compacted before)
    commits before it."""
    from fanout.delta_tables.compaction.marker import mark_compacted

    table = DeltaTable(path)
    mark_compacted(table, None, table.version())


def _scan(path: str) -> int:
    """A later run's scan, in a fresh process (nothing remembered)."""
    from fanout.delta_tables import compaction
    from fanout.delta_tables.compaction import scan

    scan._checked_through.clear()
    return compaction.repair_unchecked(DeltaTable(path), "test table", None)


def test_a_later_scan_takes_back_an_unchecked_compaction_once(tmp_path: Path) -> None:
    path = _table(tmp_path / "t", range(4))
    _unchecked(path)
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3]

    assert _scan(path) == 6
    assert _ids(path) == [0, 1, 2, 3]
    assert DeltaTable(path).version() == 7  # taken back
    assert _scan(path) == 7  # found taken back: not again
    assert DeltaTable(path).version() == 7 and _ids(path) == [0, 1, 2, 3]


def test_an_unchecked_compaction_below_a_commit_without_commit_info_is_taken_back(
    tmp_path: Path,
) -> None:
    """Another writer's commit without a commit info after the killed compaction: delta-rs
    numbered the compaction one version high, so the scan compared the versions after it
    (no rows twice there) and left it: the rows stayed twice."""
    path = _table(tmp_path / "t", range(4))
    _unchecked(path)  # version 6
    log = Path(path, "_delta_log", f"{7:020d}.json")
    log.write_text('{"txn":{"appId":"other","version":1}}\n')  # another writer's, bare
    write_deltalake(path, pa.table({"id": [4]}), mode="append")  # version 8

    assert _scan(path) == 8
    assert _ids(path) == [0, 1, 2, 3, 4]
    assert DeltaTable(path).version() == 9  # taken back


def test_a_taken_back_compaction_is_not_taken_back_again_by_a_later_compaction(
    tmp_path: Path,
) -> None:
    path = _table(tmp_path / "t", range(4))
    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()
    assert compact(mine, "test table", None).taken_back  # version 7, after the mark (5)
    write_deltalake(path, pa.table({"id": [4]}), mode="append")
    from fanout.delta_tables.compaction import scan

    scan._checked_through.clear()
    done = compact(DeltaTable(path), "test table", None)

    assert not done.taken_back and (done.files_removed, done.files_added) == (2, 1)
    assert done.version == 9  # the compaction alone: nothing taken back again
    assert _ids(path) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("raced", [False, True], ids=["alone", "after-an-append"])
def test_a_legit_compaction_is_left_alone_by_a_later_scan(tmp_path: Path, raced: bool) -> None:
    """A fanout compaction nobody raced, left unchecked (or planned before an append that
    committed first: its snapshots are read, it rewrote no file twice): left as it is."""
    path = _table(tmp_path / "t", range(4))
    _compactions_marked(path)
    mine = DeltaTable(path)
    if raced:
        write_deltalake(path, pa.table({"id": [4]}), mode="append")
    from deltalake import CommitProperties

    tag = CommitProperties(custom_metadata={"fanoutCommit": "compaction killed"})
    mine.optimize.compact(commit_properties=tag)
    version = DeltaTable(path).version()

    assert _scan(path) == version
    assert DeltaTable(path).version() == version
    assert _ids(path) == ([0, 1, 2, 3, 4] if raced else [0, 1, 2, 3])


def test_an_unchecked_compaction_whose_files_a_later_one_rewrote_is_refused_naming_the_fix(
    tmp_path: Path,
) -> None:
    from fanout.errors import CompactionError

    path = _table(tmp_path / "t", range(4))
    _unchecked(path)  # version 6
    write_deltalake(path, pa.table({"id": [4]}), mode="append")
    DeltaTable(path).optimize.compact()  # another program's: rewrites version 6's file

    with pytest.raises(CompactionError) as raised:
        _scan(path)

    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3, 4]  # left as the error says
    text = str(raised.value)
    assert text.startswith(
        "test table: the compaction committed at version 6 (fanoutCommit = 'compaction "
        "killed') rewrote files another compaction had rewritten first, so rows are in the "
        "table twice; the process that committed it ended before it checked that, and it "
        "cannot be taken back now: since then a later commit removed its files ["
    ), text
    assert text.endswith(
        "Deduplicate the table, or RESTORE it to version 5 if nothing was written since. "
        "Every fanout compaction of the table reports this again until the fix commits with "
        "fanoutCommit = 'take back killed' in its commit info (delta-rs: "
        "CommitProperties(custom_metadata=...); Spark: the write option userMetadata = "
        "'take back killed'); a RESTORE to the version before it needs no mark"
    ), text
    write_deltalake(path, pa.table({"id": [5]}), mode="append")  # version 9
    with pytest.raises(CompactionError) as again:  # this process's next compaction
        compact(DeltaTable(path), "test table", None)
    assert str(again.value) == text
    done = DeltaTable(path)  # the compaction went on all the same: version 10
    assert done.version() == 10 and len(done.file_uris()) == 1
    assert done.history(1)[0]["fanoutCompactionsChecked"] == "5"  # not past the refused
    with pytest.raises(CompactionError) as next_run:  # a later run's: reported again
        _scan(path)
    assert str(next_run.value) == text
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 5]  # for a person to fix


@pytest.mark.parametrize("key", ["fanoutCommit", "userMetadata"], ids=["delta-rs", "spark"])
def test_a_refused_compaction_marked_fixed_by_a_person_is_no_longer_reported(
    tmp_path: Path, key: str
) -> None:
    """The fix the refusal names: deduplicate, commit with the mark (delta-rs' custom
    metadata, or the commit info's userMetadata a Spark write sets); the scans stop."""
    from deltalake import CommitProperties

    from fanout.errors import CompactionError

    path = _table(tmp_path / "t", range(4))
    _unchecked(path)  # version 6
    DeltaTable(path).optimize.compact()  # rewrites version 6's file: refused
    with pytest.raises(CompactionError):
        _scan(path)
    rows = pa.table({"id": sorted(set(_ids(path)))})
    fixed = CommitProperties(custom_metadata={key: "take back killed"})
    write_deltalake(path, rows, mode="overwrite", commit_properties=fixed)  # version 8

    assert _scan(path) == 8
    done = compact(DeltaTable(path), "test table", None)
    assert not done.taken_back and _ids(path) == [0, 1, 2, 3]


def test_the_scan_reads_the_history_back_to_the_last_checked_point_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fanout compaction records the version checked up to before it: a later scan
    reads the newest commits, more only until it meets that record; the same process
    then reads only the commits after the version it checked last."""
    from fanout.delta_tables import compaction, io
    from fanout.delta_tables.compaction import scan

    path = _table(tmp_path / "t", range(1))
    _compactions_marked(path)  # version 1: no fanout compaction at or before 0
    for i in range(1, 10):
        write_deltalake(path, pa.table({"id": [i]}), mode="append")  # versions 2-10
    compact(DeltaTable(path), "test table", None)  # version 11, checked up to 10
    for i in range(10, 15):
        write_deltalake(path, pa.table({"id": [i]}), mode="append")  # versions 12-16
    read = io.numbered_history
    oldest: list[tuple[int | None, int]] = []

    def recorded(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
        history = read(table, limit)
        oldest.append((limit, int(history[-1]["version"])))
        return history

    monkeypatch.setattr(io, "numbered_history", recorded)
    monkeypatch.setattr(scan, "FIRST_LOOK", 2)

    assert _scan(path) == 16
    assert oldest == [(2, 15), (8, 9)]  # met version 11's record (10) among the 8 newest
    oldest.clear()
    write_deltalake(path, pa.table({"id": [15]}), mode="append")
    assert compaction.repair_unchecked(DeltaTable(path), "test table", None) == 17
    assert oldest == [(1, 17)]  # remembered: the one commit since
    assert _ids(path) == list(range(16))


def test_an_unchecked_compaction_whose_removed_files_were_vacuumed_is_refused(
    tmp_path: Path,
) -> None:
    """Adding back a file vacuum deleted would break every read of the table: refused."""
    from deltalake import CommitProperties

    from fanout.errors import CompactionError

    path = _table(tmp_path / "t", range(4))
    _compactions_marked(path)
    other = DeltaTable(path)  # plans on ids 0-3
    write_deltalake(path, pa.table({"id": [4]}), mode="append")
    mine = DeltaTable(path)  # plans on ids 0-4: removes id 4's file alone
    other.optimize.compact()
    tag = CommitProperties(custom_metadata={"fanoutCommit": "compaction killed"})
    mine.optimize.compact(commit_properties=tag)  # version 7, killed unchecked
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    with pytest.raises(CompactionError, match=r"the files it removed are gone from storage"):
        _scan(path)
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3, 4]


@pytest.mark.parametrize("third", [False, True], ids=["alone", "then-an-optimize"])
def test_two_scans_at_once_take_an_unchecked_compaction_back_once(
    tmp_path: Path, third: bool
) -> None:
    """Two runs scanning the same table at once (two pipelines' sinks, a shared ledger):
    the second, planned before the first took the compaction back, finds it taken back
    (and, when an OPTIMIZE then rewrote the files added back, does not call that rows
    twice): no second taking back, every row once."""
    from fanout.delta_tables import compaction
    from fanout.delta_tables.compaction import scan

    path = _table(tmp_path / "t", range(4))
    _unchecked(path)  # version 6
    late = DeltaTable(path)  # the second run's snapshot, before the taking back
    assert _scan(path) == 6  # the first run takes it back: version 7
    if third:
        DeltaTable(path).optimize.compact()  # version 8 rewrites the files added back
    version = DeltaTable(path).version()

    scan._checked_through.clear()
    assert compaction.repair_unchecked(late, "test table", None) == 6

    assert DeltaTable(path).version() == version  # nothing committed again
    assert _ids(path) == [0, 1, 2, 3]
