"""Several spool instances on one spool directory (an old ``FanOut`` not closed beside the
restarted query's, a zombie driver): a removal deletes only the index rows of the sinks it
knows held the batch, and a batch's rows only when no index row of it remains; a spooling
appends its index row before it looks for the rows. Also: the spool refuses a batch whose
id it holds from another query or plan, removes rows no index row names, and loads the
data table's log once per spooling (docs/architecture.md §14.3). Real spool (delta-rs) in
a tmp dir."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from fanout import (
    CheckpointResetError,
    CheckpointRollbackError,
    ConfigurationError,
    FanOut,
    SinkWriteError,
    SpoolError,
)
from fanout.contract.batch import BatchInfo
from fanout.delta_tables.io import read_arrow
from fanout.ledger.entry import now_utc
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.spool import data as spool_data
from fanout.spool import table as spool_table
from fanout.spool.data import with_partition_columns
from fanout.spool.refusals import spool_reset_message
from fanout.spool.table import Spool
from fanout.steps.lag import Lagging
from tests.unit.fakes import SchemaFrame, ScriptedSink, committed, spooled_ids


def _index_rows(spool: Spool) -> list[tuple[int, str, str | None, int | None]]:
    """The index table's rows of the pipeline: ``(batch id, sink, query id, planned at)``."""
    rows = read_arrow(DeltaTable(spool.index_path), filters=[("pipeline", "=", spool.pipeline)])
    return sorted(
        (r["batch_id"], r["sink"], r["query_id"], r["batch_timestamp_ms"]) for r in rows.to_pylist()
    )


def _reopened(spool: Spool) -> Spool:
    again = Spool(spool.path, spool.pipeline)
    again.open()
    return again


def _opened(tmp_path: Path) -> Spool:
    """Pipeline ``pipe``'s spool under ``tmp_path``, opened."""
    spool = Spool(str(tmp_path / "spool"), "pipe")
    spool.open()
    return spool


def _batch_7() -> tuple[SchemaFrame, BatchInfo]:
    """Batch 7 of query ``q1``: ids 1, 2, 3."""
    return SchemaFrame([1, 2, 3]), BatchInfo("pipe", 7, "q1")


def _specs(*names: str) -> dict[str, SinkSpec]:
    return {n: SinkSpec(ScriptedSink(n), lag=lag_policy(n, {"on_failure": "lag"})) for n in names}


# -- A: a removal in one instance, a spooling in another --------------------------------


def test_an_old_instance_releases_only_the_sinks_it_knew_and_keeps_the_rows(
    tmp_path: Path,
) -> None:
    # the old FanOut (not closed) spooled batch 7 for T; the restarted query's FanOut
    # replays 7 and spools it for S; the old catch-up writes 7 to T and releases it
    ledger, (frame, info) = MemoryLedger(), _batch_7()
    old = _opened(tmp_path)
    old.add(frame, info, {"T"}, now_utc())
    new = _reopened(old)
    new.add(frame, info, {"S"}, now_utc())
    ledger.mark_committed(committed("pipe", "T", 7, "q1"))

    assert Lagging("pipe", _specs("T", "S"), ledger, old).release_held() == 0
    assert _index_rows(new) == [(7, "S", "q1", None)]  # was []: T's removal took S's row
    assert spooled_ids(new, (0, 7)) == [1, 2, 3]  # was []: "its files are gone"
    assert [(b.batch_id, sorted(b.needed_by)) for b in old.batches()] == [(7, ["S"])]

    restarted = _reopened(new)
    assert Lagging("pipe", _specs("T", "S"), ledger, restarted).backlog("S").keys == [(0, 7)]

    ledger.mark_committed(committed("pipe", "S", 7, "q1"))  # S caught up: now it goes
    assert Lagging("pipe", _specs("T", "S"), ledger, restarted).release_held() == 1
    assert _index_rows(restarted) == [] and spooled_ids(restarted, (0, 7)) == []


def test_a_removal_between_a_spoolings_steps_leaves_its_index_row_with_rows(
    tmp_path: Path,
) -> None:
    # the old instance removes batch 7 (T holds it; it knows no other sink) just before
    # the new instance's spooling for S writes its index row. Rows first (the former
    # order), the new instance saw them present, then lost them to the removal.
    ledger, (frame, info) = MemoryLedger(), _batch_7()
    old = _opened(tmp_path)
    old.add(frame, info, {"T"}, now_utc())
    new = _reopened(old)
    ledger.mark_committed(committed("pipe", "T", 7, "q1"))
    removed: list[int] = []
    append_index = new._append_index

    def removal_first(*args: Any) -> None:
        removed.append(Lagging("pipe", _specs("T", "S"), ledger, old).release_held())
        append_index(*args)

    new._append_index = removal_first  # type: ignore[method-assign,assignment]
    batch = new.add(frame, info, {"S"}, now_utc())
    assert removed == [1]  # the old instance removed T's row and the rows (none was left)
    assert (batch.rows, sorted(batch.needed_by)) == (3, ["S", "T"])
    assert _index_rows(new) == [(7, "S", "q1", None)]
    assert spooled_ids(new, (0, 7)) == [1, 2, 3]  # was []: an index row without rows


def test_an_index_append_committed_but_reported_failed_then_spooled_again_counts_once(
    tmp_path: Path,
) -> None:
    # the index append carries no transaction of its own: a commit whose outcome was lost
    # (the store took the log entry, the client saw an error) fails the spooling, and the
    # replay appends the batch's index row again. Every reader merges a batch's rows, and a
    # removal deletes them all: the batch is counted, caught up and released once.
    from fanout.app.status import spool_backlogs

    ledger, (frame, info) = MemoryLedger(), _batch_7()
    spool = _opened(tmp_path)
    append_index = spool._append_index

    def committed_then_lost(*args: Any) -> None:
        append_index(*args)
        raise OSError("connection reset by peer")

    spool._append_index = committed_then_lost  # type: ignore[method-assign,assignment]
    with pytest.raises(SpoolError, match="connection reset by peer"):
        spool.add(frame, info, {"S"}, now_utc())
    spool._append_index = append_index  # type: ignore[method-assign]
    batch = spool.add(frame, info, {"S"}, now_utc())  # the replay spools it again

    assert _index_rows(spool) == [(7, "S", "q1", None), (7, "S", "q1", None)]
    assert (batch.rows, sorted(batch.needed_by)) == (3, ["S"])
    again = _reopened(spool)
    assert [(b.batch_id, b.rows, sorted(b.needed_by)) for b in again.batches()] == [(7, 3, ["S"])]
    assert again.size()[:2] == (1, 3)
    assert spooled_ids(again, (0, 7)) == [1, 2, 3]
    assert Lagging("pipe", _specs("S"), ledger, again).backlog("S").keys == [(0, 7)]
    entries = read_arrow(DeltaTable(spool.index_path)).to_pylist()
    backlogs, given_up = spool_backlogs(entries, [])
    assert (backlogs[("pipe", "S")][:2], given_up) == ((1, 3), {})  # fanout status: once

    ledger.mark_committed(committed("pipe", "S", 7, "q1"))  # S caught up: both rows go
    assert Lagging("pipe", _specs("S"), ledger, again).release_held() == 1
    assert _index_rows(again) == [] and spooled_ids(again, (0, 7)) == []
    assert again.remove_orphans(lambda key: True) == []


# -- B: a batch of the same id from another query or plan -------------------------------


def _down_fanout(tmp_path: Path, ledger: MemoryLedger, sink: ScriptedSink) -> FanOut:
    fan = FanOut(
        "pipe",
        ledger,
        [SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag"}))],
        backoff_s=0,
        spool=str(tmp_path / "spool"),
        probe_interval_s=3600,
    )
    fan.catchup.stop()
    return fan


def _q1_spooled(tmp_path: Path, ledger: MemoryLedger) -> None:
    """Query q1: its only sink is down, batches 0 and 1 spooled for it, nothing marked."""
    down = ScriptedSink("L", always_fail=SinkWriteError("down", sink="L"))
    with _down_fanout(tmp_path, ledger, down) as first:
        for b in (0, 1):
            first.process(
                SchemaFrame([100 + b]),
                BatchInfo("pipe", b, "q1", [{"o": b}], batch_timestamp_ms=1000 + b),
            )


def test_a_replaced_checkpoints_batch_is_refused_when_the_spool_holds_the_id(
    tmp_path: Path,
) -> None:
    # the guard refuses this reset by itself from the epoch's failed attempts in the
    # ledger; here the ledger holds none of them (another ledger, or its rows lost), and
    # the spool still refuses
    _q1_spooled(tmp_path, MemoryLedger())
    sink = ScriptedSink("L", always_fail=SinkWriteError("down", sink="L"))
    with _down_fanout(tmp_path, MemoryLedger(), sink) as second:
        with pytest.raises(CheckpointResetError) as refused:
            second.process(
                SchemaFrame([200]), BatchInfo("pipe", 0, "q2", [{"o": 50}], batch_timestamp_ms=9000)
            )
        message = str(refused.value)
        assert message.startswith(
            "pipeline 'pipe': checkpoint reset detected. Spark handed batch 0 of query q2, but "
            f"the spool at {tmp_path / 'spool'} holds batch 0 of query q1 for sink(s) L"
        )
        assert '  spooled (query q1): source offsets [{"o": 0}], planned at 1000 (' in message
        assert '  handed now (query q2): source offsets [{"o": 50}], planned at 9000 (' in message
        assert "How to proceed:\n  1. Restore the original checkpoint directory" in message
        assert sink.calls == []  # refused before any write
        assert second.spool is not None
        assert _index_rows(second.spool) == [(0, "L", "q1", 1000), (1, "L", "q1", 1001)]
        assert spooled_ids(second.spool, (0, 0)) == [100]  # q1's rows, not replaced

        with pytest.raises(CheckpointResetError):  # the spool itself refuses, too
            second.spool.add(SchemaFrame([200]), BatchInfo("pipe", 1, "q2"), {"M"}, now_utc())
        assert _index_rows(second.spool) == [(0, "L", "q1", 1000), (1, "L", "q1", 1001)]


def test_a_rolled_back_checkpoints_batch_is_refused_when_the_spool_holds_the_id(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    _q1_spooled(tmp_path, ledger)
    sink = ScriptedSink("L", always_fail=SinkWriteError("down", sink="L"))
    with _down_fanout(tmp_path, ledger, sink) as again:
        with pytest.raises(CheckpointRollbackError) as refused:
            again.process(
                SchemaFrame([300]), BatchInfo("pipe", 1, "q1", [{"o": 7}], batch_timestamp_ms=5000)
            )
        message = str(refused.value)
        assert message.startswith(
            "pipeline 'pipe': checkpoint rolled back. Spark handed batch 1 of query q1 planned "
            "at 5000 (1970-01-01T00:00:05.000Z), but the spool at "
            f"{tmp_path / 'spool'} holds batch 1 of the same query planned at 1001 "
            "(1970-01-01T00:00:01.001Z) for sink(s) L"
        )
        assert "  1. Restore the newest checkpoint (the one whose offsets/1 holds planning " in (
            message
        )
        assert sink.calls == []
        assert again.spool is not None
        assert _index_rows(again.spool) == [(0, "L", "q1", 1000), (1, "L", "q1", 1001)]
        assert spooled_ids(again.spool, (0, 1)) == [101]

        # the same plan, or values unknown on one side: a replay, spooled for a new sink
        again.spool.add(SchemaFrame([101]), BatchInfo("pipe", 1, "q1"), {"M"}, now_utc())
        again.spool.add(
            SchemaFrame([101]),
            BatchInfo("pipe", 1, "q1", batch_timestamp_ms=1001),
            {"N"},
            now_utc(),
        )
        assert _index_rows(again.spool) == [
            (0, "L", "q1", 1000), (1, "L", "q1", 1001), (1, "M", "q1", None),
            (1, "N", "q1", 1001),
        ]  # fmt: skip
        assert spooled_ids(again.spool, (0, 1)) == [101]


# -- C: rows no index row names ---------------------------------------------------------


def test_rows_without_an_index_row_that_every_lag_sink_holds_are_removed_at_start(
    tmp_path: Path,
) -> None:
    # a removal cut short between the index rows' delete and the rows' (batch 3), an older
    # version's spooling cut short between the rows and the index (batch 4), and batch 6
    # whose rows have no index row yet but which L does not hold: only 3 and 4 go
    path, ledger = str(tmp_path / "spool"), MemoryLedger()
    spool = _opened(tmp_path)
    for b in (3, 4, 6):
        info = BatchInfo("pipe", b, "q1")
        spool._append_rows(
            with_partition_columns(SchemaFrame([b, b + 10]).table, "pipe", info), info
        )
    spool.add(SchemaFrame([5]), BatchInfo("pipe", 5, "q1"), {"L"}, now_utc())
    ledger.mark_committed(committed("pipe", "L", 4, "q1"))
    ledger.mark_committed(committed("pipe", "good", 6, "q1"))
    sink = ScriptedSink("L")
    fan = FanOut(
        "pipe",
        ledger,
        [ScriptedSink("good"), SinkSpec(sink, lag=lag_policy("L", {"on_failure": "lag"}))],
        spool=path,
        probe_interval_s=3600,
    )
    try:
        assert [spooled_ids(spool, (0, b)) for b in (3, 4, 5, 6)] == [[], [], [5], [6, 16]]
        assert _index_rows(spool) == [(5, "L", "q1", None)]  # was [3, 13] and [4, 14] left
    finally:
        fan.close()


# -- D: one load of the data table's log per spooling ------------------------------------


def test_a_spooling_loads_the_data_tables_log_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(str(tmp_path / "spool"), "pipe")
    spool.open()
    spool.add(SchemaFrame([1]), BatchInfo("pipe", 0, "q1"), {"L"}, now_utc())  # creates it
    loads: list[str] = []
    open_table = spool_table.open_table

    def counted(path: str, storage_options: Any = None) -> Any:
        loads.append(path)
        return open_table(path, storage_options)

    monkeypatch.setattr(spool_table, "open_table", counted)
    monkeypatch.setattr(spool_data, "open_table", counted)
    batch = spool.add(SchemaFrame([2, 3]), BatchInfo("pipe", 1, "q1"), {"L"}, now_utc())
    assert loads == [spool.data_path]  # was three: the rows' presence, the append, the size
    assert batch.size_bytes > 0 and batch.size_bytes == spool._sizes([(0, 1)])[(0, 1)]
    loads.clear()
    again = spool.add(SchemaFrame([2, 3]), BatchInfo("pipe", 1, "q1"), {"L", "M"}, now_utc())
    assert loads == [spool.data_path] and again.size_bytes == batch.size_bytes
    assert spooled_ids(spool, (0, 1)) == [2, 3]
    assert _index_rows(spool) == [(0, "L", "q1", None), (1, "L", "q1", None), (1, "M", "q1", None)]


# -- A(3): a new FanOut of the pipeline stops the catch-up of one not closed -----------


def test_a_new_fanout_stops_the_catch_up_of_one_not_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = MemoryLedger()

    def fanout(pipeline: str) -> FanOut:
        sink = ScriptedSink("L")
        return FanOut(
            pipeline,
            ledger,
            [SinkSpec(sink, lag=lag_policy("L", {"on_failure": "lag"}))],
            spool=str(tmp_path / pipeline),
            probe_interval_s=3600,
        )

    old, other = fanout("pipe"), fanout("other")
    old.catchup.start()
    other.catchup.start()
    thread = old.catchup._thread
    assert thread is not None and thread.is_alive()
    with caplog.at_level(logging.WARNING, logger="fanout"):
        new = fanout("pipe")
    try:
        assert not thread.is_alive()  # was alive: two catch-ups on one spool
        assert old.catchup._thread is None
        assert other.catchup._thread is not None and other.catchup._thread.is_alive()
        said = [r.getMessage() for r in caplog.records if "was not closed" in r.getMessage()]
        assert said == [
            f"pipeline pipe: a FanOut of this pipeline (ledger MemoryLedger@{id(ledger):x}) was "
            "not closed; stopping its catch-up: the new FanOut's catch-up takes over"
        ]
        old.catchup.start()  # a stopped catch-up never starts again
        assert old.catchup._thread is None
        new.catchup.start()
        assert new.catchup._thread is not None and new.catchup._thread.is_alive()
        assert threading.active_count() >= 2
    finally:
        for fan in (new, old, other):
            fan.close()


def test_a_new_fanout_refused_at_setup_leaves_the_catch_up_before_it_running(
    tmp_path: Path,
) -> None:
    """The new FanOut's setup refuses (the spool holds a batch for M, which no longer
    lags): it never runs, so the catch-up of the FanOut before it goes on."""
    ledger, path = MemoryLedger(), str(tmp_path / "spool")
    old = FanOut(
        "pipe",
        ledger,
        [SinkSpec(ScriptedSink("L"), lag=lag_policy("L", {"on_failure": "lag"}))],
        spool=path,
        probe_interval_s=3600,
    )
    old.spool.add(SchemaFrame([1]), BatchInfo("pipe", 1, "q1"), {"M"}, now_utc())  # type: ignore[union-attr]
    old.catchup.start()
    thread = old.catchup._thread
    try:
        with pytest.raises(ConfigurationError, match="sink 'M' still needs batches"):
            FanOut(
                "pipe",
                ledger,
                [
                    SinkSpec(ScriptedSink("L"), lag=lag_policy("L", {"on_failure": "lag"})),
                    ScriptedSink("M"),
                ],
                spool=path,
                probe_interval_s=3600,
            )
        assert thread is not None and thread.is_alive()
        assert old.catchup._thread is thread
    finally:
        old.close()


def test_a_replay_appends_the_rows_of_a_batch_whose_index_row_a_killed_driver_wrote(
    tmp_path: Path,
) -> None:
    # the driver was killed between the index row of batch 7 (for L, which failed it) and
    # its rows: Spark replays 7, L is behind and held back, nothing else writes
    path, ledger = str(tmp_path / "spool"), MemoryLedger()
    spool = _opened(tmp_path)
    frame, info = SchemaFrame([7, 8]), BatchInfo("pipe", 7, "q1")
    killed = spool._append_rows
    spool._append_rows = lambda *args: (_ for _ in ()).throw(SystemExit)  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        spool.add(frame, info, {"L"}, now_utc())
    spool._append_rows = killed  # type: ignore[method-assign]
    ledger.mark_committed(committed("pipe", "good", 7, "q1"))
    sink = ScriptedSink("L", always_fail=SinkWriteError("down", sink="L"))
    fan = FanOut(
        "pipe",
        ledger,
        [ScriptedSink("good"), SinkSpec(sink, lag=lag_policy("L", {"on_failure": "lag"}))],
        spool=path,
        probe_interval_s=3600,
    )
    fan.catchup.stop()
    try:
        assert fan.spool is not None
        assert _index_rows(fan.spool) == [(7, "L", "q1", None)]
        assert spooled_ids(fan.spool, (0, 7)) == []
        assert list(fan.process(frame, info)) == []  # good holds 7, L is behind
        assert sink.calls == []
        assert _index_rows(fan.spool) == [(7, "L", "q1", None)]
        assert spooled_ids(fan.spool, (0, 7)) == [7, 8]  # was []: "its files are gone"
        assert [(b.batch_id, b.rows, sorted(b.needed_by)) for b in fan.spool.batches()] == [
            (7, 2, ["L"])
        ]
    finally:
        fan.close()


def test_the_reset_refusals_status_command_names_the_spool_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spooled, handed = BatchInfo("pipe", 0, "q1"), BatchInfo("pipe", 0, "q2")
    message = spool_reset_message(handed, spooled, {"L"}, "spool")
    assert (
        "  2. Or let the sinks catch up on the old query's batches first (run the original "
        "checkpoint until `fanout status --ledger <path> --pipeline pipe --spool "
        f"{tmp_path}/spool` shows L live), then start the new checkpoint."
    ) in message.splitlines()


def test_the_reset_refusals_status_command_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spool's reset refusal names `fanout status` with the pipeline's own ledger
    (absolute), not a `<path>` placeholder: the command runs as printed, from any
    directory, and shows the lagging sink."""
    from fanout.app.cli import main
    from fanout.ledger.delta import DeltaLedger

    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(run_dir)
    _q1_spooled(run_dir, MemoryLedger())
    sink = ScriptedSink("L", always_fail=SinkWriteError("down", sink="L"))
    fan = FanOut(
        "pipe", DeltaLedger("ledger"),
        [SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag"}))],
        backoff_s=0, spool="spool", probe_interval_s=3600,
    )  # fmt: skip
    try:
        fan.catchup.stop()
        with pytest.raises(CheckpointResetError) as refused:
            fan.process(SchemaFrame([200]), BatchInfo("pipe", 0, "q2", [{"o": 50}]))
    finally:
        fan.close()
    status = str(refused.value).split("`")[1]
    assert status == (
        f"fanout status --ledger {run_dir}/ledger --pipeline pipe --spool {run_dir}/spool"
    )
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(status.split()[1:]) == 0  # the ledger q2 runs with; q1's spooled batches
    out = capsys.readouterr().out
    assert out.startswith(
        f"the ledger holds no marks yet\n\nspool {run_dir}/spool (pipe): 2 batch(es), 2 row(s), "
    )
    assert out.endswith(" bytes\n") and not (elsewhere / "ledger").exists()
