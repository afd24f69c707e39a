"""``DeltaSink.holds_batch`` and ``remove_batch_hint`` find the batch's commit without
loading a snapshot per version on the way (a search by halves over the app transaction,
which only grows) and read only the commits after it from the history (real delta-rs
tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fanout_delta.held import HeldBatches
from fanout_delta.sink import DeltaSink

from fanout.contract.batch import txn_app_id


def _commit(path: Path, app_id: str, batch_id: int) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    txn = Transaction(app_id=app_id, version=batch_id)
    rows = pa.table({"id": pa.array([batch_id], pa.int64())})
    write_deltalake(str(path), rows, mode="append",
                    commit_properties=CommitProperties(app_transactions=[txn]))  # fmt: skip


class Loads:
    """Counts the snapshots of the table loaded at a given version, and the history's
    limits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import deltalake

        self.versions: list[int] = []
        self.limits: list[int | None] = []
        table, history = deltalake.DeltaTable.__init__, deltalake.DeltaTable.history

        def init(inner: Any, *args: Any, version: int | None = None, **kwargs: Any) -> None:
            if version is not None:
                self.versions.append(version)
            table(inner, *args, version=version, **kwargs)

        def limited(inner: Any, limit: int | None = None) -> list[dict[str, Any]]:
            self.limits.append(limit)
            return history(inner, limit)

        monkeypatch.setattr(deltalake.DeltaTable, "__init__", init)
        monkeypatch.setattr(deltalake.DeltaTable, "history", limited)


def test_the_batch_commit_is_found_in_a_few_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t"
    app_id = txn_app_id("p", "s", 0)
    for batch_id in range(60):  # version v commits batch v
        _commit(path, app_id, batch_id)
    sink = DeltaSink("s", path=str(path))
    held = HeldBatches("s", str(path))
    loads = Loads(monkeypatch)

    assert held.batch_version(app_id, 10, 59) == 10
    assert len(loads.versions) <= 7, loads.versions  # walking back: 49 snapshots
    assert held.batch_version(app_id, 59, 59) == 59
    assert held.batch_version(app_id, 0, 59) == 0
    assert held.batch_version(app_id, 60, 59) == 59  # not in the table: as the walk said

    loads.versions.clear()
    assert sink.holds_batch("p", 0, 55) is True
    assert len(loads.versions) <= 7, loads.versions
    assert loads.limits == [4]  # the commits 56-59 after the batch's, not all 60
    assert sink.holds_batch("p", 0, 60) is False

    hint = sink.remove_batch_hint("p", 0, 59)
    assert hint is not None and hint.startswith(
        f"Its rows are version 59 of the Delta table at {path}, the table's last commit: to "
        "remove them, restore the table to version 58"
    )


def test_a_batch_past_the_100_versions_searched_is_not_found(tmp_path: Path) -> None:
    path = tmp_path / "t"
    app_id = txn_app_id("p", "s", 0)
    for batch_id in range(103):
        _commit(path, app_id, batch_id)
    sink = DeltaSink("s", path=str(path))
    held = HeldBatches("s", str(path))
    assert held.batch_version(app_id, 2, 102) is None  # version 2: beyond 100 back
    assert held.batch_version(app_id, 3, 102) == 3
    assert sink.remove_batch_hint("p", 0, 2) is None
    assert sink.holds_batch("p", 0, 2) is True  # not found: held, as before


def test_the_remove_hint_offers_no_restore_past_a_commit_made_after_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint reads the table's newest version in storage, not the snapshot's: another
    writer's commit after the snapshot was loaded (row 900, version 3) would go with a
    restore to the version before the batch's commit."""
    from deltalake import DeltaTable, write_deltalake

    from fanout.delta_tables import io

    path = tmp_path / "t"
    app_id = txn_app_id("p", "s", 0)
    for batch_id in range(3):  # version v commits batch v
        _commit(path, app_id, batch_id)
    stale = DeltaTable(str(path))  # at version 2, the batch's commit the newest
    write_deltalake(str(path), pa.table({"id": pa.array([900], pa.int64())}), mode="append")
    monkeypatch.setattr(io, "open_table", lambda *_args, **_kwargs: stale)
    sink = DeltaSink("s", path=str(path))

    assert sink.remove_batch_hint("p", 0, 2) == (
        f"Its rows are version 2 of the Delta table at {path}; versions 3-3 came after it, "
        "so a restore to version 1 would remove those too: delete the rows version 2 added "
        "instead."
    )
    assert sorted(DeltaTable(str(path)).to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 900]
