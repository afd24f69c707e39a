"""What a Delta sink's open reads of its table's history for fanout's compactions, on real
delta-rs tables (ARCHITECTURE §4, "Compactions that race";
:mod:`fanout.delta_tables.compaction.marker`): nothing on a table fanout never compacted
(before, the 20 newest commits at every open, and the whole history once per process with
``compact_every``), back to the mark at most on one it did."""

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
    assert compactions_after(DeltaTable(path)) == 30  # its version: nothing to check


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
