"""What a Delta sink's open reads of its table's history for fanout's compactions, on real
delta-rs tables (ARCHITECTURE §4, "Compactions that race";
:mod:`fanout.delta_tables.compaction.marker`): nothing on a table fanout never compacted
(before, the 20 newest commits at every open, and the whole history once per process with
``compact_every``), back to the mark at most on one it did; and what a compaction of a
table without the mark reads first: it may hold fanout compactions all the same (a fanout
built before the mark, a mark a retention since removed expired)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink

from fanout.contract.sink import SinkContext
from fanout.delta_tables.compaction import compact, scan
from fanout.delta_tables.compaction.marker import MARK, compactions_after


def _table(path: Path, ids: range, **kwargs: Any) -> str:
    for i in ids:
        write_deltalake(str(path), pa.table({"id": [i]}), mode="append", **kwargs)
    return str(path)


def _histories(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The ``limit`` of every history read from now on."""
    reads: list[int | None] = []
    history = DeltaTable.history

    def counted(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
        reads.append(limit)
        return history(table, limit)

    monkeypatch.setattr(DeltaTable, "history", counted)
    scan._checked_through.clear()  # a new process
    return reads


@pytest.mark.parametrize("every", [None, 10], ids=["not-compacting", "compact_every"])
def test_the_open_reads_no_history_of_a_table_fanout_never_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int | None
) -> None:
    """Another program's OPTIMIZE among its commits changes nothing: only fanout's
    compactions are checked, and the table holds no mark of one."""
    path = _table(tmp_path / "t", range(30))
    DeltaTable(path).optimize.compact()
    reads = _histories(monkeypatch)

    DeltaSink(name="orders", path=path, engine="rs", compact_every=every).open(
        SinkContext(pipeline="p")
    )

    assert reads == []
    assert compactions_after(DeltaTable(path)) is None  # no mark: the open reads nothing


def test_the_first_compaction_marks_the_table_once_in_a_commit_of_no_file(
    tmp_path: Path,
) -> None:
    """The mark: an app transaction at the version before it, in a commit holding no
    file nor metadata (which would fail other writers' commits); later compactions add
    none."""
    import json

    path = _table(tmp_path / "t", range(4))

    compact(DeltaTable(path), "test table", None)  # the mark at 4, the compaction at 5
    write_deltalake(path, pa.table({"id": [4]}), mode="append")
    compact(DeltaTable(path), "test table", None)  # 7

    table = DeltaTable(path)
    assert table.version() == 7 and table.transaction_version(MARK) == 3
    log = Path(path, "_delta_log", f"{4:020d}.json").read_text().splitlines()
    assert sorted(next(iter(json.loads(line))) for line in log) == ["commitInfo", "txn"]
    assert [h.get("fanoutCommit", "").split(" ")[0] for h in table.history()] == [
        "compaction", "", "compaction", "compactions", "", "", "", ""
    ]  # fmt: skip
    assert compactions_after(table) == 3


def test_a_sinks_open_on_a_table_fanout_compacted_reads_back_to_the_mark_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 appends after fanout's first compaction of 200 commits: the open reads the
    commits after the mark's version once, not the history before it (before: the newest
    100, then 400)."""
    path = _table(tmp_path / "t", range(200))
    compact(DeltaTable(path), "test table", None)  # mark at 200, compaction at 201
    for i in range(200, 240):
        write_deltalake(path, pa.table({"id": [i]}), mode="append")  # 202-241
    reads = _histories(monkeypatch)

    DeltaSink(name="orders", path=path, engine="rs").open(SinkContext(pipeline="p"))

    assert reads == [42]  # the commits after 199, the mark's version: fewer than 100


def test_a_table_that_expires_app_transactions_is_looked_at_in_its_newest_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delta.setTransactionRetentionDuration`` set: an expired mark would look like none,
    so the mark is not trusted, and the open reads the 20 newest commits as before."""
    retention = {"delta.setTransactionRetentionDuration": "interval 30 days"}
    path = _table(tmp_path / "t", range(3), configuration=retention)
    assert compactions_after(DeltaTable(path)) is None
    reads = _histories(monkeypatch)

    DeltaSink(name="orders", path=path, engine="rs").open(SinkContext(pipeline="p"))

    assert reads == [20]


KILLED = {"fanoutCommit": "compaction killed"}
"""The tags of a fanout compaction whose process was killed before its check."""


def _killed_after_an_optimize(path: str, checked: int) -> None:
    """What a fanout compaction killed right after its commit leaves when another
    program's OPTIMIZE of the same files committed first: its tagged commit (recording
    every fanout compaction checked up to ``checked``), the rows it rewrote twice, no
    taking back."""
    from deltalake import CommitProperties

    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()
    tags = {**KILLED, "fanoutCompactionsChecked": str(checked)}
    mine.optimize.compact(commit_properties=CommitProperties(custom_metadata=tags))


def _ids(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


def _tags(path: str) -> list[str]:
    """Each commit's ``fanoutCommit`` kind, oldest first (``""``: none)."""
    infos = reversed(DeltaTable(path).history())
    return [str(info.get("fanoutCommit", "")).split(" ")[0] for info in infos]


def test_a_compaction_takes_back_what_a_fanout_built_before_the_mark_left_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table a fanout built before the mark compacted: its compactions carry the tags,
    no mark; the last was killed before its check, 3 appends back. A sink's open reads
    nothing of it (as of a table none compacted); the first compaction reads back to the
    newest checked record (version 10's: 4), takes the killed one back, and only then
    marks the table, at the version it checked up to (before: the mark at 13, the rows
    twice for good)."""
    from deltalake import CommitProperties

    path = _table(tmp_path / "t", range(4))  # 0-3
    old = {"fanoutCommit": "compaction old", "fanoutCompactionsChecked": "3"}
    DeltaTable(path).optimize.compact(commit_properties=CommitProperties(custom_metadata=old))
    _table(tmp_path / "t", range(4, 8))  # 5-8
    _killed_after_an_optimize(path, checked=4)  # the OPTIMIZE at 9, the killed one at 10
    _table(tmp_path / "t", range(8, 11))  # 11-13
    assert _ids(path) == sorted([*range(8), *range(8), 8, 9, 10])
    reads = _histories(monkeypatch)

    DeltaSink(name="orders", path=path, engine="rs", compact_every=10).open(
        SinkContext(pipeline="p")
    )
    assert reads == [] and DeltaTable(path).version() == 13  # the open: nothing

    done = compact(DeltaTable(path), "test table", None)

    assert _ids(path) == list(range(11))
    assert not done.taken_back and (done.files_removed, done.files_added) == (4, 1)
    # the scan's (the 14 commits, back to version 10's record), then the lookups of the
    # taking back's commit (the 4 since 10) and the compaction's (the 2 since 14)
    assert reads == [100, 4, 2]
    table = DeltaTable(path)
    assert table.version() == 16 and table.transaction_version(MARK) == 13
    assert _tags(path)[9:] == ["", "compaction", "", "", "", "take", "compactions", "compaction"]
    assert table.history(1)[0]["fanoutCompactionsChecked"] == "13"


def _unset_retention(path: str) -> None:
    """Commit the table's metadata without ``delta.setTransactionRetentionDuration``, as
    delta-spark's ``ALTER TABLE ... UNSET TBLPROPERTIES`` does (a ``metaData`` action of
    its own; delta-rs has no call for it, and delta-spark is not on the tests' class path)."""
    import json

    log = Path(path, "_delta_log")
    first = (log / f"{0:020d}.json").read_text().splitlines()
    metadata = next(json.loads(line)["metaData"] for line in first if '"metaData"' in line)
    metadata["configuration"].pop("delta.setTransactionRetentionDuration")
    version = DeltaTable(path).version() + 1
    info = {"timestamp": 0, "operation": "UNSET TBLPROPERTIES", "operationParameters": {}}
    text = "\n".join(json.dumps(a) for a in ({"commitInfo": info}, {"metaData": metadata}))
    (log / f"{version:020d}.json").write_text(text + "\n")


def test_a_compaction_takes_back_what_a_table_that_expired_the_mark_left_unchecked(
    tmp_path: Path,
) -> None:
    """``delta.setTransactionRetentionDuration`` set (1 s), fanout compacts (the mark at 3),
    a later fanout compaction is killed before its check; the mark expires, a checkpoint
    (delta-rs') drops it, then a person removes the property: the table
    holds no mark but fanout's compactions. The next compaction reads back to the newest
    checked record (version 9's: 7) and takes the killed one back (before: no mark meant
    never compacted, the rows stayed twice for good)."""
    import time

    retention = {"delta.setTransactionRetentionDuration": "interval 1 seconds"}
    path = _table(tmp_path / "t", range(4), configuration=retention)  # 0-3
    compact(DeltaTable(path), "test table", None)  # the mark at 4 (3), the compaction at 5
    _table(tmp_path / "t", range(4, 6))  # 6, 7
    _killed_after_an_optimize(path, checked=7)  # the OPTIMIZE at 8, the killed one at 9
    time.sleep(2)  # the mark expires
    DeltaTable(path).create_checkpoint()  # at 9, without the mark
    _unset_retention(path)  # 10
    table = DeltaTable(path)
    assert table.version() == 10 and table.transaction_version(MARK) is None
    assert table.metadata().configuration == {}
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]

    done = compact(DeltaTable(path), "test table", None)

    assert _ids(path) == list(range(6))  # in the OPTIMIZE's file alone: nothing to compact
    assert not done.taken_back and (done.files_removed, done.files_added) == (0, 0)
    table = DeltaTable(path)
    assert table.version() == 12 and table.transaction_version(MARK) == 10
    assert _tags(path)[8:] == ["", "compaction", "", "take", "compactions"]


def test_a_refused_compaction_found_before_the_mark_is_reported_again_after_it(
    tmp_path: Path,
) -> None:
    """A table compacted before the mark whose killed compaction (version 5) a later
    OPTIMIZE rewrote: it cannot be taken back. The first compaction reports it, and marks
    the table at 4, below it (not at its snapshot's version, 8): every later scan,
    a new process's too, reads it and reports it again until a person fixes it."""
    from fanout.delta_tables import compaction
    from fanout.errors import CompactionError

    path = _table(tmp_path / "t", range(4))  # 0-3
    _killed_after_an_optimize(path, checked=3)  # the OPTIMIZE at 4, the killed one at 5
    _table(tmp_path / "t", range(4, 5))  # 6
    DeltaTable(path).optimize.compact()  # 7: rewrites the killed one's file
    _table(tmp_path / "t", range(5, 6))  # 8

    with pytest.raises(CompactionError, match="the compaction committed at version 5 ") as first:
        compact(DeltaTable(path), "test table", None)  # the mark at 9, the compaction at 10
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 5]  # left for a person to fix

    scan._checked_through.clear()  # a new process
    with pytest.raises(CompactionError) as again:
        compaction.repair_unchecked(DeltaTable(path), "test table", None)
    assert str(again.value) == str(first.value)
    table = DeltaTable(path)
    assert table.version() == 10 and table.transaction_version(MARK) == 4
    assert table.history(1)[0]["fanoutCompactionsChecked"] == "4"
