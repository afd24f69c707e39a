"""The ledger: idempotent marks, log-only lookups, failure rows, maintenance.

Semantics shared by both ledgers run against the real delta-rs ``DeltaLedger`` on a temp
dir and against ``MemoryLedger``; what only a Delta table has (log checkpoints, data files,
compaction, vacuum) runs against ``DeltaLedger`` alone.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from fanout.errors import LedgerError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LOST_MARK, LedgerEntry, LedgerView, entries_from_arrow
from fanout.ledger.memory import MemoryLedger
from tests.unit.fakes import committed


def failed(pipeline: str, sink: str, batch_id: int, attempt: int, error: str) -> LedgerEntry:
    return LedgerEntry(
        pipeline=pipeline,
        sink=sink,
        batch_id=batch_id,
        status="failed",
        query_id="q-1",
        attempt=attempt,
        error=error,
    )


def rows(ledger: DeltaLedger | MemoryLedger) -> list[LedgerEntry]:
    """Every row of the ledger, as entries, sorted for comparison."""
    entries = (
        entries_from_arrow(ledger.read()) if isinstance(ledger, DeltaLedger) else ledger.entries
    )
    return sorted(entries, key=lambda e: (e.pipeline, e.sink, e.batch_id, e.status, e.attempt))


def data_files(path: Path) -> list[Path]:
    """The table's parquet data files (not the log's checkpoint files)."""
    return sorted(p for p in path.rglob("*.parquet") if "_delta_log" not in p.parts)


@pytest.fixture(params=["delta", "memory"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> DeltaLedger | MemoryLedger:
    if request.param == "memory":
        return MemoryLedger()
    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    return led


# -- shared semantics -----------------------------------------------------------------


def test_mark_is_idempotent(ledger: DeltaLedger | MemoryLedger) -> None:
    assert ledger.mark_committed(committed("orders", "pg", 3, rows=10)) is True
    assert ledger.mark_committed(committed("orders", "pg", 3, rows=10)) is False
    # an older batch after a newer one is also "already there"
    assert ledger.mark_committed(committed("orders", "pg", 2, rows=10)) is False

    got = rows(ledger)
    assert [(e.pipeline, e.sink, e.batch_id, e.status, e.rows) for e in got] == [
        ("orders", "pg", 3, "committed", 10)
    ]
    assert ledger.last_committed("orders", ["pg"]) == {"pg": 3}


def test_a_write_s_own_mark_replaces_a_lost_mark_of_its_batch(
    ledger: DeltaLedger | MemoryLedger,
) -> None:
    """``fanout recover`` recorded a lost mark of batch 3 while it was in flight: the
    query's own mark of it, made after, is recorded with its counts, and readers see it
    alone; made again, or made by a skip, it changes nothing."""
    lost = committed("orders", "pg", 3, error=f"{LOST_MARK}: recorded by fanout recover: ...")
    assert ledger.mark_committed(lost) is True
    skip = committed("orders", "pg", 3, rows=0, error="skipped: batches 3-3 were never ...")
    assert ledger.mark_committed(skip) is False
    assert ledger.mark_committed(committed("orders", "pg", 3, rows=10)) is True
    assert ledger.mark_committed(committed("orders", "pg", 3, rows=10)) is False
    assert ledger.mark_committed(committed("orders", "pg", 2, rows=10)) is False

    seen = ledger.committed_entries("orders")
    assert [(e.sink, e.batch_id, e.rows, e.error) for e in seen] == [("pg", 3, 10, None)]
    assert {(e.batch_id, e.rows, e.lost) for e in rows(ledger)} == {(3, None, True), (3, 10, False)}
    assert ledger.last_committed("orders", ["pg"]) == {"pg": 3}


def test_last_committed_per_sink_and_high_water(ledger: DeltaLedger | MemoryLedger) -> None:
    assert ledger.last_committed("orders", ["pg", "kafka"]) == {"pg": None, "kafka": None}
    assert ledger.high_water("orders") is None

    for sink, batch in [("pg", 0), ("kafka", 0), ("pg", 1), ("pg", 2), ("kafka", 1)]:
        assert ledger.mark_committed(committed("orders", sink, batch)) is True

    assert ledger.last_committed("orders", ["pg", "kafka", "never"]) == {
        "pg": 2,
        "kafka": 1,
        "never": None,
    }
    assert ledger.high_water("orders") == 2

    # a sink catching up to an older batch does not lower the high-water mark
    assert ledger.mark_committed(committed("orders", "late", 0)) is True
    assert ledger.high_water("orders") == 2
    assert ledger.last_committed("orders", ["late"]) == {"late": 0}


def test_record_failure_rows_are_visible(ledger: DeltaLedger | MemoryLedger) -> None:
    ledger.record_failure(failed("orders", "pg", 4, 1, "TransientSinkError: timeout"))
    ledger.record_failure(failed("orders", "pg", 4, 2, "TransientSinkError: timeout again"))
    ledger.mark_committed(committed("orders", "pg", 4, attempt=3, rows=7))

    got = rows(ledger)
    assert [(e.sink, e.batch_id, e.status, e.attempt, e.error, e.rows) for e in got] == [
        ("pg", 4, "committed", 3, None, 7),
        ("pg", 4, "failed", 1, "TransientSinkError: timeout", None),
        ("pg", 4, "failed", 2, "TransientSinkError: timeout again", None),
    ]
    # failures are not marks
    assert ledger.committed_entries("orders") == [got[0]]


def test_failure_alone_is_not_a_mark(ledger: DeltaLedger | MemoryLedger) -> None:
    ledger.record_failure(failed("orders", "pg", 4, 1, "boom"))
    assert ledger.last_committed("orders", ["pg"]) == {"pg": None}
    assert ledger.high_water("orders") is None
    assert ledger.committed_entries("orders") == []


def test_failed_batches_names_the_batches_of_failed_rows_only(
    ledger: DeltaLedger | MemoryLedger,
) -> None:
    """``fanout ledger skip``'s evidence that Spark handed a batch (a failed attempt's row):
    of the pipeline and epoch asked, from the batch asked on, each batch once; marks,
    another pipeline's or epoch's failures are none."""
    from dataclasses import replace

    for batch, attempt in ((2, 1), (5, 1), (5, 2), (7, 1)):
        ledger.record_failure(failed("orders", "pg", batch, attempt, "boom"))
    ledger.record_failure(failed("orders", "kafka", 6, 1, "boom"))
    ledger.mark_committed(committed("orders", "pg", 8))
    ledger.record_failure(failed("payments", "pg", 9, 1, "boom"))
    ledger.record_failure(replace(failed("orders", "pg", 10, 1, "boom"), epoch=1))

    assert ledger.failed_batches("orders", 0, 0) == [2, 5, 6, 7]
    assert ledger.failed_batches("orders", 5, 0) == [5, 6, 7]
    assert ledger.failed_batches("orders", 8, 0) == []
    assert ledger.failed_batches("orders", 0, 1) == [10]
    assert ledger.failed_batches("payments", 0, 0) == [9]
    assert ledger.failed_batches("nobody", 0, 0) == []


def test_committed_entries_filters_pipeline_and_min_batch(
    ledger: DeltaLedger | MemoryLedger,
) -> None:
    for batch in range(5):
        ledger.mark_committed(
            committed("orders", "pg", batch, source_offsets=f'[{{"t": {batch}}}]')
        )
    ledger.mark_committed(committed("payments", "pg", 9))
    ledger.record_failure(failed("orders", "kafka", 4, 1, "boom"))

    got = ledger.committed_entries("orders", min_batch_id=3)
    assert sorted((e.pipeline, e.sink, e.batch_id, e.status) for e in got) == [
        ("orders", "pg", 3, "committed"),
        ("orders", "pg", 4, "committed"),
    ]
    assert sorted(e.offsets()[0]["t"] for e in got) == [3, 4]
    assert sorted(e.batch_id for e in ledger.committed_entries("orders")) == [0, 1, 2, 3, 4]
    assert [e.batch_id for e in ledger.committed_entries("payments", 9)] == [9]
    assert ledger.committed_entries("payments", 10) == []
    assert ledger.committed_entries("nobody") == []


def test_two_pipelines_do_not_interfere(ledger: DeltaLedger | MemoryLedger) -> None:
    assert ledger.mark_committed(committed("orders", "pg", 7)) is True
    # same sink name, other pipeline, lower batch: a mark of its own, not "already there"
    assert ledger.mark_committed(committed("payments", "pg", 2)) is True
    assert ledger.mark_committed(committed("payments", "pg", 2)) is False

    assert ledger.last_committed("orders", ["pg"]) == {"pg": 7}
    assert ledger.last_committed("payments", ["pg"]) == {"pg": 2}
    assert ledger.high_water("orders") == 7
    assert ledger.high_water("payments") == 2
    assert ledger.high_water("other") is None
    assert [e.batch_id for e in ledger.committed_entries("payments")] == [2]


def test_lookup_reads_the_current_epoch_and_its_marks(ledger: DeltaLedger | MemoryLedger) -> None:
    assert ledger.lookup("orders", ["pg", "kafka"]) == LedgerView(
        0, None, {"pg": None, "kafka": None}, owner_recorded=False
    )
    ledger.mark_committed(committed("orders", "pg", 4))
    ledger.mark_committed(committed("orders", "kafka", 3))
    assert ledger.lookup("orders", ["pg", "kafka"]) == LedgerView(
        0, 4, {"pg": 4, "kafka": 3}, owner_recorded=False
    )
    ledger.start_epoch(LedgerEntry("orders", "*", 0, "epoch", query_id="q1", epoch=0))
    # the claim of epoch 0 changes no mark
    assert ledger.lookup("orders", ["pg", "kafka"]) == LedgerView(0, 4, {"pg": 4, "kafka": 3})

    ledger.start_epoch(
        LedgerEntry(pipeline="orders", sink="*", batch_id=0, status="epoch", epoch=1)
    )
    ledger.mark_committed(committed("orders", "pg", 0, epoch=1))
    # epoch 1's marks only: epoch 0's batch 4 must not make batch 0 of epoch 1 a replay
    assert ledger.lookup("orders", ["pg", "kafka"]) == LedgerView(1, 0, {"pg": 0, "kafka": None})
    assert ledger.lookup("payments", ["pg"]) == LedgerView(
        0, None, {"pg": None}, owner_recorded=False
    )


def test_mark_committed_rejects_failed_entry_delta(tmp_path: Path) -> None:
    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    with pytest.raises(ValueError, match="mark_committed takes a committed entry"):
        led.mark_committed(failed("orders", "pg", 1, 1, "x"))


# -- Delta only -----------------------------------------------------------------------


def test_delta_ledger_row_round_trip(tmp_path: Path) -> None:
    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    entry = committed(
        "orders",
        "pg",
        5,
        rows=12,
        attempt=2,
        duration_ms=31,
        source_offsets='[{"orders": {"0": 42}}, null]',
    )
    led.mark_committed(entry)
    [back] = entries_from_arrow(led.read("orders"))
    assert back == entry
    assert back.offsets() == [{"orders": {"0": 42}}, None]
    assert led.read("payments").num_rows == 0


def test_delta_ledger_missing_table_is_a_ledger_error(tmp_path: Path) -> None:
    led = DeltaLedger(str(tmp_path / "nowhere"))
    with pytest.raises(LedgerError, match=r"no ledger at .*nowhere: a FanOut creates it"):
        led.high_water("orders")


def test_open_twice_keeps_the_marks(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger")
    first = DeltaLedger(path)
    first.open()
    first.mark_committed(committed("orders", "pg", 1))
    second = DeltaLedger(path)
    second.open()  # a restart: the table exists, nothing is recreated
    assert second.last_committed("orders", ["pg"]) == {"pg": 1}
    assert second.mark_committed(committed("orders", "pg", 1)) is False
    assert len(rows(second)) == 1


def test_lookups_read_the_log_not_the_data(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    led = DeltaLedger(str(path), checkpoint_interval=10, compact_after_files=None)
    led.open()
    sinks = ["delta", "pg", "kafka"]
    for batch in range(60):
        assert led.mark_committed(committed("orders", sinks[batch % 3], batch)) is True
    led.mark_committed(committed("payments", "pg", 5))

    checkpoints = sorted(p.name for p in (path / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints, "no log checkpoint written with checkpoint_interval=10"
    assert "00000000000000000059.checkpoint.parquet" in checkpoints

    deleted = data_files(path)
    assert len(deleted) == 61
    for file in deleted:
        file.unlink()
    assert data_files(path) == []

    fresh = DeltaLedger(str(path), checkpoint_interval=10)
    assert fresh.last_committed("orders", sinks + ["never"]) == {
        "delta": 57,
        "pg": 58,
        "kafka": 59,
        "never": None,
    }
    assert fresh.high_water("orders") == 59
    assert fresh.high_water("payments") == 5
    assert fresh.last_committed("payments", ["pg"]) == {"pg": 5}
    # the marks are idempotent from the log alone, too
    assert fresh.mark_committed(committed("orders", "kafka", 59)) is False
    # and the data really is gone: a scan fails
    with pytest.raises(Exception):  # noqa: B017 - delta-rs raises its own I/O error type
        fresh.read()


def test_lookup_refreshes_the_log_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    led.mark_committed(committed("orders", "pg", 2))
    refreshes: list[int] = []
    fresh = led._table.fresh
    monkeypatch.setattr(led._table, "fresh", lambda: refreshes.append(1) or fresh())
    assert led.lookup("orders", ["pg", "delta"]) == LedgerView(
        0, 2, {"pg": 2, "delta": None}, owner_recorded=False
    )
    assert len(refreshes) == 1


def queue_marks(led: DeltaLedger, entries: list[LedgerEntry]) -> list[bool | BaseException]:
    """Call ``mark_committed`` for every entry in its own thread while another commit holds
    the ledger's lock, so that all of them queue up; the results in entry order."""
    results: list[bool | BaseException] = [False] * len(entries)

    def mark(i: int) -> None:
        try:
            results[i] = led.mark_committed(entries[i])
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=mark, args=(i,)) for i in range(len(entries))]
    with led._table.lock:  # a commit in progress
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while len(led._marks.queued) < len(entries):
            assert time.monotonic() < deadline, "marks did not queue up"
            time.sleep(0.005)
    for thread in threads:
        thread.join(10)
    return results


def test_marks_queued_during_a_commit_share_the_next_commit(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    led = DeltaLedger(str(path))
    led.open()
    led.mark_committed(committed("orders", "delta", 6))
    before = DeltaTable(str(path)).version()

    results = queue_marks(
        led,
        [
            committed("orders", "delta", 7, rows=1),
            committed("orders", "pg", 7, rows=2),
            committed("orders", "kafka", 7, rows=3),
            committed("orders", "delta", 6),  # already there
            committed("payments", "pg", 1, rows=4),
        ],
    )
    assert results == [True, True, True, False, True]
    assert DeltaTable(str(path)).version() == before + 1  # one commit for all four rows
    assert led.last_committed("orders", ["delta", "pg", "kafka"]) == {
        "delta": 7,
        "pg": 7,
        "kafka": 7,
    }
    assert led.high_water("orders") == 7
    assert led.high_water("payments") == 1
    assert [(e.pipeline, e.sink, e.batch_id, e.rows) for e in rows(led)] == [
        ("orders", "delta", 6, None),
        ("orders", "delta", 7, 1),
        ("orders", "kafka", 7, 3),
        ("orders", "pg", 7, 2),
        ("payments", "pg", 1, 4),
    ]


def test_the_ledgers_collaborators_share_its_one_table_and_its_lock(tmp_path: Path) -> None:
    """The marks, the epochs and the maintenance commit under the lock of the ledger's one
    ``LedgerTable`` (the same object, never a copy, so a reload leaves none holding a stale
    table), and so does the copy unpickled where it lands, with its own table."""
    import pickle

    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    copy = pickle.loads(pickle.dumps(led))
    for ledger in (led, copy):
        assert ledger._marks._table is ledger._table
        assert ledger._epochs._table is ledger._table
        assert ledger._marks._epochs is ledger._epochs
    assert copy._table is not led._table and copy._table.lock is not led._table.lock
    done: list[str] = []
    calls = {
        "mark": lambda: led.mark_committed(committed("orders", "pg", 0)),
        "epoch": lambda: led.start_epoch(LedgerEntry("orders", "*", 0, "epoch", query_id="q")),
        "maintain": lambda: led.maintain(vacuum_retention_hours=None, checkpoint=False),
    }

    def run(name: str) -> None:
        calls[name]()
        done.append(name)

    threads = [threading.Thread(target=run, args=(name,)) for name in calls]
    with led._table.lock:  # a commit in progress: each waits for it
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        assert done == []
    for thread in threads:
        thread.join(20)
    assert sorted(done) == ["epoch", "maintain", "mark"]
    assert led.lookup("orders", ["pg"]) == LedgerView(0, 0, {"pg": 0}, owner_recorded=True)


def test_a_failed_group_commit_fails_every_mark_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()

    def broken(*args: object) -> None:
        raise LedgerError("cannot write to the ledger: disk full")

    monkeypatch.setattr(led._table, "append", broken)
    results = queue_marks(led, [committed("orders", s, 3) for s in ("delta", "pg")])
    assert [str(r) for r in results] == ["cannot write to the ledger: disk full"] * 2
    monkeypatch.undo()
    assert led.last_committed("orders", ["delta", "pg"]) == {"delta": None, "pg": None}
    assert led.mark_committed(committed("orders", "pg", 3)) is True  # nothing stuck queued


def test_maintain_compacts_vacuums_and_keeps_lookups(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    led = DeltaLedger(str(path))
    led.open()
    for batch in range(20):
        led.mark_committed(committed("orders", "pg", batch, rows=batch))
    led.record_failure(failed("orders", "kafka", 3, 1, "boom"))
    led.record_failure(failed("orders", "kafka", 3, 2, "boom"))
    before_rows = rows(led)

    assert len(DeltaTable(str(path)).file_uris()) == 22
    assert len(data_files(path)) == 22

    report = led.maintain(vacuum_retention_hours=0)

    assert report.files_compacted == 22
    assert len(DeltaTable(str(path)).file_uris()) == 1
    assert len(report.files_vacuumed) == 22
    assert len(data_files(path)) == 1  # the compacted-away files are gone from disk
    assert report.checkpoint_created is True
    assert report.version_after > report.version_before
    assert any((path / "_delta_log").glob(f"{report.version_after:020d}.checkpoint.parquet"))

    assert rows(led) == before_rows
    fresh = DeltaLedger(str(path))
    assert fresh.last_committed("orders", ["pg", "kafka"]) == {"pg": 19, "kafka": None}
    assert fresh.high_water("orders") == 19
    assert fresh.mark_committed(committed("orders", "pg", 19)) is False
    assert fresh.mark_committed(committed("orders", "pg", 20)) is True
    assert fresh.last_committed("orders", ["pg"]) == {"pg": 20}


def test_maintain_with_default_retention_keeps_files(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    led = DeltaLedger(str(path))
    led.open()
    for batch in range(5):
        led.mark_committed(committed("orders", "pg", batch))
    report = led.maintain()  # 168 h retention: the just-compacted files stay for readers
    assert report.files_compacted == 5
    assert report.files_vacuumed == []
    assert len(DeltaTable(str(path)).file_uris()) == 1
    assert len(data_files(path)) == 6
    assert led.last_committed("orders", ["pg"]) == {"pg": 4}


def test_ledger_of_an_older_version_gains_new_columns(tmp_path: Path) -> None:
    """A ledger written before the dead_lettered column existed keeps working."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from fanout.ledger.entry import entries_to_arrow

    old = entries_to_arrow([LedgerEntry("p", "s", 0, "committed", rows=1)]).drop_columns(
        ["dead_lettered"]
    )
    write_deltalake(str(tmp_path), old, mode="append", partition_by=["pipeline"])
    ledger = DeltaLedger(str(tmp_path))
    ledger.open()
    assert ledger.mark_committed(LedgerEntry("p", "s", 1, "committed", rows=5, dead_lettered=2))
    rows = sorted(ledger.read("p").to_pylist(), key=lambda r: r["batch_id"])
    assert [(r["batch_id"], r["rows"], r["dead_lettered"]) for r in rows] == [
        (0, 1, None),
        (1, 5, 2),
    ]
    assert isinstance(ledger.read("p").schema.field("dead_lettered").type, pa.DataType)


def test_a_mark_committed_by_another_writer_since_the_lookup_is_not_written_twice(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "ledger")
    ours = DeltaLedger(path)
    ours.open()
    ours.mark_committed(committed("orders", "pg", 4))
    assert ours.lookup("orders", ["pg", "delta"]) == LedgerView(
        0, 4, {"pg": 4, "delta": None}, owner_recorded=False
    )
    zombie = DeltaLedger(path)  # a driver still running the same query
    zombie.open()
    assert zombie.mark_committed(committed("orders", "pg", 5, rows=50)) is True

    # ours commits on the snapshot of its lookup: delta-rs refuses it (same transaction
    # ids), and the mark is checked again on the fresh snapshot
    assert ours.mark_committed(committed("orders", "pg", 5, rows=51)) is False
    assert ours.mark_committed(committed("orders", "delta", 5, rows=52)) is True
    assert zombie.lookup("orders", ["pg", "delta"]) == LedgerView(
        0, 5, {"pg": 5, "delta": 5}, owner_recorded=False
    )
    assert [(e.sink, e.batch_id, e.rows) for e in rows(ours)] == [
        ("delta", 5, 52),
        ("pg", 4, None),
        ("pg", 5, 50),
    ]


def test_lookups_after_the_ledgers_own_commit_read_no_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fanout.ledger.delta_table as delta_ledger

    path = str(tmp_path / "ledger")
    led = DeltaLedger(path)
    led.open()
    assert led.lookup("orders", ["pg", "delta"]) == LedgerView(
        0, None, {"pg": None, "delta": None}, owner_recorded=False
    )
    reads: list[str] = []
    real = delta_ledger.transaction_version
    monkeypatch.setattr(
        delta_ledger, "transaction_version", lambda t, app: reads.append(app) or real(t, app)
    )
    led.mark_committed(committed("orders", "pg", 0))
    led.mark_committed(committed("orders", "delta", 0))
    assert led.lookup("orders", ["pg", "delta"]) == LedgerView(
        0, 0, {"pg": 0, "delta": 0}, owner_recorded=False
    )
    assert reads == []  # every answer was read or written at the table's version

    other = DeltaLedger(path)
    other.open()
    other.mark_committed(committed("orders", "pg", 1))
    reads.clear()
    assert led.lookup("orders", ["pg", "delta"]) == LedgerView(
        0, 1, {"pg": 1, "delta": 0}, owner_recorded=False
    )
    assert sorted(reads) == sorted(
        ["fanout/orders#epoch", "fanout/orders", "fanout/orders/pg", "fanout/orders/delta"]
    )


def test_the_ledger_compacts_its_small_files_as_it_goes(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    led = DeltaLedger(str(path), compact_after_files=4)
    led.open()
    for batch in range(9):
        assert led.mark_committed(committed("orders", "pg", batch, rows=batch)) is True
        # the 4th and 8th commits compact: 4 files become 1
        expected = {3: 1, 7: 1}.get(batch, 1 + (batch + 1) % 4 if batch > 3 else batch + 1)
        assert len(DeltaTable(str(path)).file_uris()) == expected, batch
    assert led.mark_committed(committed("orders", "pg", 8)) is False
    assert led.lookup("orders", ["pg"]) == LedgerView(0, 8, {"pg": 8}, owner_recorded=False)
    assert [(e.batch_id, e.rows) for e in rows(led)] == [(b, b) for b in range(9)]

    reopened = DeltaLedger(str(path), compact_after_files=3)
    reopened.open()  # 2 files: the next commit reaches 3 and compacts
    reopened.mark_committed(committed("orders", "delta", 8))
    assert len(DeltaTable(str(path)).file_uris()) == 1
    assert reopened.last_committed("orders", ["pg", "delta"]) == {"pg": 8, "delta": 8}


# -- the ledger's log ---------------------------------------------------------------------


def log_files(path: Path) -> list[str]:
    """The names of the files in the table's log directory."""
    return sorted(p.name for p in (path / "_delta_log").iterdir() if p.is_file())


def age_log(path: Path, seconds: float) -> None:
    """Make every file of the table's log ``seconds`` older (what time does to them)."""
    for name in log_files(path):
        file = path / "_delta_log" / name
        then = file.stat().st_mtime - seconds
        os.utime(file, (then, then))


def test_a_new_ledger_keeps_minutes_of_log_and_its_marks(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    led = DeltaLedger(str(path), checkpoint_interval=5)
    led.open()
    config = DeltaTable(str(path)).metadata().configuration
    assert config["delta.logRetentionDuration"] == "interval 15 minutes"
    for batch in range(12):
        led.mark_committed(committed("orders", "pg", batch))
    assert len([n for n in log_files(path) if n.endswith(".json")]) == 13  # versions 0-12
    age_log(path, 20 * 60)  # 20 minutes pass

    assert led.mark_committed(committed("orders", "pg", 12)) is True  # version 13

    # the commit removed the log older than 15 minutes, up to the last checkpoint (10)
    assert [n for n in log_files(path) if n.endswith(".json")] == [
        f"{v:020d}.json" for v in (9, 10, 11, 12, 13)
    ]
    assert led.lookup("orders", ["pg"]) == LedgerView(0, 12, {"pg": 12}, owner_recorded=False)
    reopened = DeltaLedger(str(path))
    assert reopened.lookup("orders", ["pg"]) == LedgerView(0, 12, {"pg": 12}, owner_recorded=False)
    assert reopened.mark_committed(committed("orders", "pg", 7)) is False
    assert [e.batch_id for e in rows(reopened)] == list(range(13))


def test_a_ledger_without_a_log_retention_gets_one_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    old = DeltaLedger(str(path), log_retention=None)  # as fanout made them before
    old.open()
    old.mark_committed(committed("orders", "pg", 0))
    assert "delta.logRetentionDuration" not in DeltaTable(str(path)).metadata().configuration

    led = DeltaLedger(str(path))
    led.open()

    table = DeltaTable(str(path))
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 15 minutes"
    assert table.version() == 2  # one metadata commit
    assert led.lookup("orders", ["pg"]) == LedgerView(0, 0, {"pg": 0}, owner_recorded=False)
    assert led.mark_committed(committed("orders", "pg", 1)) is True

    DeltaTable(str(path)).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 2 days"}  # the user's own choice
    )
    DeltaLedger(str(path)).open()
    assert DeltaTable(str(path)).metadata().configuration["delta.logRetentionDuration"] == (
        "interval 2 days"
    )


def test_a_log_retention_that_is_no_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a Delta interval"):
        DeltaLedger(str(tmp_path / "ledger"), log_retention="15 minutes please")


def test_a_mark_on_a_snapshot_whose_log_was_removed_is_checked_again(tmp_path: Path) -> None:
    """Another writer's commits removed the log files after this ledger's snapshot:
    delta-rs cannot check them for conflicts and refuses the commit; the marks are
    checked again on the fresh snapshot, as after a commit race."""
    path = tmp_path / "ledger"
    ours = DeltaLedger(str(path), checkpoint_interval=5)
    ours.open()
    ours.mark_committed(committed("orders", "pg", 4))
    assert ours.lookup("orders", ["pg"]) == LedgerView(0, 4, {"pg": 4}, owner_recorded=False)
    zombie = DeltaLedger(str(path))  # a driver still running the same query
    zombie.open()
    zombie.mark_committed(committed("orders", "pg", 5, rows=50))
    for batch in range(8):
        zombie.mark_committed(committed("other", "x", batch))
    age_log(path, 20 * 60)
    zombie.mark_committed(committed("other", "x", 8))
    assert "00000000000000000002.json" not in log_files(path)  # ours is at version 1

    assert ours.mark_committed(committed("orders", "pg", 5, rows=51)) is False
    assert ours.mark_committed(committed("orders", "delta", 5, rows=52)) is True
    assert ours.lookup("orders", ["pg", "delta"]) == LedgerView(
        0, 5, {"pg": 5, "delta": 5}, owner_recorded=False
    )
    assert [(e.sink, e.batch_id, e.rows) for e in rows(ours) if e.pipeline == "orders"] == [
        ("delta", 5, 52),
        ("pg", 4, None),
        ("pg", 5, 50),
    ]


def test_a_ledger_that_cannot_take_the_log_retention_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from deltalake.table import TableAlterer

    path = tmp_path / "ledger"
    old = DeltaLedger(str(path), log_retention=None)
    old.open()
    old.mark_committed(committed("orders", "pg", 0))

    def refused(self: object, properties: object, *args: object, **kwargs: object) -> None:
        raise OSError("another writer's commit")

    monkeypatch.setattr(TableAlterer, "set_table_properties", refused)
    led = DeltaLedger(str(path))
    with caplog.at_level("WARNING", logger="fanout.ledger.delta"):
        led.open()

    assert "could not set delta.logRetentionDuration = 'interval 15 minutes'" in caplog.text
    assert "another writer's commit" in caplog.text
    assert "delta.logRetentionDuration" not in DeltaTable(str(path)).metadata().configuration
    assert led.mark_committed(committed("orders", "pg", 1)) is True
    assert led.lookup("orders", ["pg"]) == LedgerView(0, 1, {"pg": 1}, owner_recorded=False)


def test_a_ledger_whose_log_retention_another_opener_set_first_opens_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from deltalake.table import TableAlterer

    path = tmp_path / "ledger"
    DeltaLedger(str(path), log_retention=None).open()
    real = TableAlterer.set_table_properties

    def raced(self: TableAlterer, properties: dict[str, str], *args: object) -> None:
        real(DeltaTable(str(path)).alter, {"delta.logRetentionDuration": "interval 1 hours"})
        raise OSError("Failed to commit transaction: Concurrent transaction failed.")

    monkeypatch.setattr(TableAlterer, "set_table_properties", raced)
    led = DeltaLedger(str(path))
    with caplog.at_level("WARNING", logger="fanout.ledger.delta"):
        led.open()

    assert caplog.text == ""
    configuration = DeltaTable(str(path)).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == "interval 1 hours"
    assert led.mark_committed(committed("orders", "pg", 0)) is True
