"""delta-rs (1.6) lists a Delta table's history from the newest commit in storage but
numbers it down from the snapshot's version (delta-io/delta-rs#4488): every reader of the
history in fanout goes through :func:`fanout.delta_tables.io.numbered_history`, which
numbers it from the newest commit listed and keeps the commits up to the snapshot's
version (docs/architecture.md §4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from fanout.delta_tables import io as deltaio
from fanout.errors import HistoryUnsettledError


def _append(path: Path, n: int) -> None:
    """Commit row ``n``, its commit info naming it (``row``)."""
    properties = CommitProperties(custom_metadata={"row": str(n)})
    write_deltalake(str(path), pa.table({"n": [n]}), mode="append", commit_properties=properties)


def _versions(history: list[dict[str, Any]]) -> list[tuple[int, str | None]]:
    return [(info["version"], info.get("row")) for info in history]


def test_a_stale_snapshots_history_is_numbered_from_the_newest_commit(tmp_path: Path) -> None:
    path = tmp_path / "t"
    for n in range(3):  # version v commits row v
        _append(path, n)
    stale = DeltaTable(str(path))  # at version 2
    _append(path, 3)  # another handle's commit: version 3

    # delta-rs lists version 3 too, and numbers the list down from 2: each one off
    assert _versions(stale.history()) == [(2, "3"), (1, "2"), (0, "1"), (-1, "0")]
    assert _versions(stale.history(1)) == [(2, "3"), (1, "2")]

    assert _versions(deltaio.numbered_history(stale)) == [(2, "2"), (1, "1"), (0, "0")]
    assert _versions(deltaio.numbered_history(stale, 1)) == [(2, "2")]
    old = DeltaTable(str(path), version=1)  # a snapshot of an older version: the same
    assert _versions(deltaio.numbered_history(old, 2)) == [(1, "1"), (0, "0")]
    fresh = DeltaTable(str(path))
    assert _versions(deltaio.numbered_history(fresh, 2)) == [(3, "3"), (2, "2")]


def test_a_commit_landing_as_the_history_is_listed_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t"
    for n in range(3):
        _append(path, n)
    table = DeltaTable(str(path))
    history, listings = DeltaTable.history, []

    def racing(inner: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
        listings.append(limit)
        if len(listings) <= 2:  # a commit lands during each of the first two listings
            _append(path, 2 + len(listings))
        return history(inner, limit)

    monkeypatch.setattr(DeltaTable, "history", racing)
    assert _versions(deltaio.numbered_history(table, 2)) == [(2, "2"), (1, "1")]
    assert listings == [2, 2, 2]

    monkeypatch.setattr(deltaio, "HISTORY_READS", 2)
    listings.clear()
    with pytest.raises(HistoryUnsettledError, match="during each of 2 reads"):
        deltaio.numbered_history(table, 2)


def test_a_raced_history_is_read_again_after_a_short_growing_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the reads ran back to back (a busy loop against the writer it raced)."""
    monkeypatch.setattr(deltaio.random, "uniform", lambda low, high: high)  # no jitter
    pauses = [deltaio.history_pause(attempt) for attempt in range(1, deltaio.HISTORY_READS)]
    assert pauses[:7] == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.2])
    assert set(pauses[6:]) == {0.2} and sum(pauses) == pytest.approx(2.915)
    monkeypatch.setattr(deltaio.random, "uniform", lambda low, high: low)
    assert deltaio.history_pause(1) == pytest.approx(0.0025)
    slept: list[float] = []
    monkeypatch.setattr(deltaio.time, "sleep", slept.append)
    table = _Raced()
    with pytest.raises(HistoryUnsettledError):
        deltaio.numbered_history(table)  # type: ignore[arg-type]
    assert len(slept) == deltaio.HISTORY_READS - 1 and slept[0] == pytest.approx(0.0025)


class _Raced:
    """A table another writer commits to during every listing of its history."""

    table_uri = "memory://raced"
    latest = 0

    def version(self) -> int:
        return 0

    @property
    def _table(self) -> _Raced:
        return self

    def get_latest_version(self) -> int:
        self.latest += 1
        return self.latest

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        return []


def test_no_code_of_fanout_reads_delta_rs_history_but_io() -> None:
    """Every history read goes through :func:`fanout.delta_tables.io` (``numbered_history``,
    or ``commit_metadata``, which uses no version): a new ``.history(`` call elsewhere in
    the core or a plugin would number a stale snapshot's history wrongly again (the
    compaction check and the Delta replay lost rows so, docs/architecture.md §4)."""
    import re

    root = Path(__file__).resolve().parents[2]
    sources = [*root.glob("fanout/**/*.py"), *root.glob("plugins/*/fanout_*/**/*.py")]
    io = root / "fanout" / "delta_tables" / "io.py"
    call = re.compile(r"\.history\(")
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in sources
        if path != io
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if call.search(line) and not line.lstrip().startswith(('"', "#"))
    ]
    assert len(sources) > 100 and found == [], found


# -- a commit without a commit info ---------------------------------------------------


def _bare_commit(path: Path, version: int) -> None:
    """Another writer's commit without a commit info (delta-spark with
    ``spark.databricks.delta.commitInfo.enabled`` false): an app transaction alone."""
    log = path / "_delta_log" / f"{version:020d}.json"
    log.write_text('{"txn":{"appId":"other","version":1}}\n')


def test_a_commit_without_a_commit_info_is_numbered_and_counted(tmp_path: Path) -> None:
    """delta-rs leaves it out and numbers every older commit one too high (row 2 as
    version 3), and its ``limit`` counts it: before, the helper did the same."""
    path = tmp_path / "t"
    for n in range(3):
        _append(path, n)
    _bare_commit(path, 3)
    for n in (4, 5):
        _append(path, n)
    table = DeltaTable(str(path))
    assert _versions(table.history()) == [(5, "5"), (4, "4"), (3, "2"), (2, "1"), (1, "0")]

    assert _versions(deltaio.numbered_history(table)) == [
        (5, "5"), (4, "4"), (3, None), (2, "2"), (1, "1"), (0, "0")
    ]  # fmt: skip
    assert _versions(deltaio.numbered_history(table, 3)) == [(5, "5"), (4, "4"), (3, None)]
    assert _versions(deltaio.numbered_history(table, 4)) == [
        (5, "5"), (4, "4"), (3, None), (2, "2")
    ]  # fmt: skip
    assert _versions(deltaio.numbered_history(table, 2)) == [(5, "5"), (4, "4")]


def test_a_newest_commit_without_a_commit_info_is_numbered(tmp_path: Path) -> None:
    path = tmp_path / "t"
    for n in range(2):
        _append(path, n)
    _bare_commit(path, 2)
    table = DeltaTable(str(path))

    assert _versions(deltaio.numbered_history(table)) == [(2, None), (1, "1"), (0, "0")]
    assert _versions(deltaio.numbered_history(table, 1)) == [(2, None)]


def test_a_history_whose_log_start_was_cleaned_up_is_numbered_from_delta_rs_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer entries than versions because the oldest commits' files are gone (log
    cleanup after a checkpoint), every commit with its commit info: delta-rs' listing is
    kept, each entry's number checked by one read of a commit file (not every file)."""
    path = tmp_path / "t"
    for n in range(5):
        _append(path, n)
    DeltaTable(str(path)).create_checkpoint()
    for version in range(3):
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    _append(path, 5)
    read = deltaio._read_commit
    reads: list[int] = []
    monkeypatch.setattr(deltaio, "_read_commit", lambda s, v: reads.append(v) or read(s, v))

    history = deltaio.numbered_history(DeltaTable(str(path)))

    assert _versions(history) == [(5, "5"), (4, "4"), (3, "3")]
    assert reads == [3, 2]  # the oldest entry's commit, and the file before it: none
