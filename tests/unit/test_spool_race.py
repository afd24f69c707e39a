"""A batch stays in the spool, with its rows, for every sink that has not written it
(docs/architecture.md §14), even when it was removed once (every sink then holding it) and
is needed again: the live batch the catch-up released while in flight, for a sink that
failed it after, or a replay of a released batch. Real spool (delta-rs) in a tmp dir."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fanout import FanOut, SinkWriteError
from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import Sink
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.spool.data import PIPELINE_COLUMN, with_partition_columns
from fanout.spool.index import BatchKey
from fanout.spool.table import Spool
from fanout.steps.lag import Lagging
from tests.unit.fakes import SchemaFrame, ScriptedSink, spooled_ids


def _now() -> Any:
    from fanout.ledger.entry import now_utc

    return now_utc()


def _index(spool: Spool) -> list[tuple[int, int, list[str]]]:
    return [(b.batch_id, b.rows, sorted(b.needed_by)) for b in spool.batches()]


def test_a_released_batch_spooled_again_for_a_sink_that_failed_it_keeps_its_rows(
    tmp_path: Path,
) -> None:
    # the review's sequence: batch 7 spooled for L1 (behind), the catch-up writes it to L1
    # and releases it while the live batch is still running, then L2 fails it and lags
    frame, info = SchemaFrame([1, 2, 3]), BatchInfo("pipe", 7, "q1", [{"o": 1}])
    spool = Spool(str(tmp_path / "spool"), "pipe")
    spool.open()
    spool.add(frame, info, {"L1"}, _now())  # start_spooling
    assert spooled_ids(spool, (0, 7)) == [1, 2, 3]
    assert spool.remove([(0, 7)]) == 1  # the catch-up's release_held
    assert spool.batches() == [] and spooled_ids(spool, (0, 7)) == []

    batch = spool.add(frame, info, {"L1", "L2"}, _now())  # spool_for_lagging
    assert (batch.rows, sorted(batch.needed_by)) == (3, ["L1", "L2"])
    assert spooled_ids(spool, (0, 7)) == [1, 2, 3]  # was []: "its files are gone"

    again = Spool(str(tmp_path / "spool"), "pipe")  # what the next run reads
    again.open()
    assert _index(again) == [(7, 3, ["L1", "L2"])]
    assert again.size()[:2] == (1, 3) and again.size()[2] > 0


def test_a_replay_after_a_restart_spools_a_released_batch_with_its_rows(tmp_path: Path) -> None:
    frame, info = SchemaFrame([4, 5]), BatchInfo("pipe", 3, "q1")
    first = Spool(str(tmp_path / "spool"), "pipe")
    first.open()
    first.add(frame, info, {"L1"}, _now())
    first.remove([(0, 3)])  # L1 caught up; the driver then died before Spark committed 3

    replay = Spool(str(tmp_path / "spool"), "pipe")
    replay.open()
    assert replay.batches() == []
    replay.add(frame, info, {"L2"}, _now())  # the replay: L2 fails batch 3 and lags
    assert _index(replay) == [(3, 2, ["L2"])]
    assert spooled_ids(replay, (0, 3)) == [4, 5]


def test_a_replayed_batch_whose_rows_are_spooled_is_not_spooled_twice(tmp_path: Path) -> None:
    frame, info = SchemaFrame([1, 2, 3]), BatchInfo("pipe", 5, "q1")
    spool = Spool(str(tmp_path / "spool"), "pipe")
    spool.open()
    # killed after the rows' commit and before the index's: the replay finds the rows
    spool._append_rows(with_partition_columns(frame.table, "pipe", info), info)
    replay = Spool(str(tmp_path / "spool"), "pipe")
    replay.open()
    assert replay.batches() == []
    replay.add(frame, info, {"L1"}, _now())
    replay.add(frame, info, {"L1", "L2"}, _now())  # and a later sink: a union, same rows
    assert _index(replay) == [(5, 3, ["L1", "L2"])]
    assert spooled_ids(replay, (0, 5)) == [1, 2, 3]  # once, not [1, 1, 2, 2, 3, 3]


def test_the_catchups_release_and_a_live_spooling_do_not_interleave(tmp_path: Path) -> None:
    # the catch-up chose batch 7 (every sink needing it then held it); the live path spools
    # it for L2 before the removal: L2 must still find it, with its rows
    frame, info = SchemaFrame([1, 2, 3]), BatchInfo("pipe", 7, "q1")
    spool = Spool(str(tmp_path / "spool"), "pipe")
    spool.open()
    spool.add(frame, info, {"L1"}, _now())
    live = threading.Thread(target=lambda: spool.add(frame, info, {"L2"}, _now()))

    def held_by_all() -> dict[BatchKey, frozenset[str]]:
        chosen = {(0, 7): frozenset({"L1"})}  # L1 holds it
        live.start()
        live.join(1.0)  # with the spool's lock held, the live add waits for the removal
        return chosen

    lagging = Lagging("pipe", {}, MemoryLedger(), spool)
    lagging.held_by_all = held_by_all  # type: ignore[method-assign]
    assert lagging.release_held() == 1
    live.join(30)
    assert not live.is_alive()
    assert _index(spool) == [(7, 3, ["L2"])]
    assert spooled_ids(spool, (0, 7)) == [1, 2, 3]


def test_the_catch_up_leaves_the_live_batch_in_flight_to_a_sink_that_fails_it_after(
    tmp_path: Path,
) -> None:
    # end to end through FanOut: L1 is behind, the live batch 1 is spooled for it; while
    # "good" writes batch 1 the catch-up writes 0 to L1 and releases it, but not batch 1:
    # Spark has not settled it (its foreachBatch has not returned). Before batches had to
    # be settled, the catch-up wrote and released 1 here, and L2, failing it after, found
    # it gone (Spool.add spools such a batch again in full). Batch 1 must be in the spool
    # for L1 and L2, with its row, and reach L1 once settled.
    frames = {b: SchemaFrame([b * 10]) for b in range(2)}
    ledger = MemoryLedger()
    spool_path = str(tmp_path / "spool")
    fan: FanOut | None = None

    def catch_up_l1(batch: Batch) -> None:
        assert fan is not None and fan.spool is not None
        if batch.info.batch_id != 1:
            return
        deadline = time.monotonic() + 30
        while fan.spool.get((0, 1)) is None:  # start_spooling, beside this write
            assert time.monotonic() < deadline, "batch 1 was never spooled for L1"
            time.sleep(0.01)
        l1.always_fail = None
        fan.catchup.drain("L1", until=lambda: False)
        assert [b for b, _ in l1.calls] == [0, 0]  # live (failed), then caught up
        assert fan.lagging.release_held() == 1  # 0; the live 1 is not settled

    good = ScriptedSink("good", on_write=catch_up_l1)
    l1 = ScriptedSink("L1", always_fail=SinkWriteError("refused", sink="L1"))
    l2 = ScriptedSink("L2")
    specs: list[Sink | SinkSpec] = [
        good,
        *(SinkSpec(s, lag=lag_policy(s.name, {"on_failure": "lag"})) for s in (l1, l2)),
    ]
    fan = FanOut("pipe", ledger, specs, backoff_s=0, spool=spool_path, probe_interval_s=3600)
    fan.catchup.stop()  # no background thread: this test drives the catch-up

    def read(sink: str, key: BatchKey) -> tuple[Any, BatchInfo]:
        assert fan is not None and fan.spool is not None
        spooled = fan.spool.get(key)
        assert spooled is not None, key
        return frames[key[1]], spooled.info()

    fan.catchup._reader.read = read  # type: ignore[method-assign]
    try:
        fan.process(frames[0], BatchInfo("pipe", 0, "q"))  # L1 fails and lags
        assert fan.spool is not None
        assert _index(fan.spool) == [(0, 1, ["L1"])]
        l2.always_fail = SinkWriteError("refused", sink="L2")
        fan.process(frames[1], BatchInfo("pipe", 1, "q"))  # L2 fails and lags
        assert ledger.last_committed("pipe", ["good", "L1", "L2"]) == {
            "good": 1,
            "L1": 0,
            "L2": 0,
        }
        assert _index(fan.spool) == [(1, 1, ["L1", "L2"])]
        assert spooled_ids(fan.spool, (0, 1)) == [10]
        l2.always_fail = None
        assert {n: lag.state for n, lag in fan.catch_up(timeout_s=10).items()} == {
            "L1": "live",
            "L2": "live",
        }
        assert ([b for b, _ in l1.calls], [b for b, _ in l2.calls]) == ([0, 0, 1], [0, 1, 1])
        assert fan.spool.batches() == []
    finally:
        fan.close()


def test_a_removal_leaves_the_files_another_pipeline_is_writing_into_a_shared_spool(
    tmp_path: Path,
) -> None:
    # two pipelines share one spool directory (the tables are partitioned by pipeline):
    # pipeline b's rows are written as files before its commit; a's removal must not
    # vacuum them away in between
    path = str(tmp_path / "spool")
    a, b = Spool(path, "a"), Spool(path, "b")
    a.open()
    b.open()
    a.add(SchemaFrame([1]), BatchInfo("a", 0, "qa"), {"L"}, _now())
    b.add(SchemaFrame([5]), BatchInfo("b", 0, "qb"), {"L"}, _now())  # creates b's partition
    b_files = tmp_path / "spool" / "batches" / f"{PIPELINE_COLUMN}=b"
    written = next(b_files.rglob("*.parquet"))
    in_flight = written.parent / "in-flight-part-0.parquet"  # not in the log yet
    in_flight.write_bytes(written.read_bytes())
    assert a.remove([(0, 0)]) == 1
    assert in_flight.exists()
    assert spooled_ids(b, (0, 0)) == [5]
    assert _index(a) == [] and _index(b) == [(0, 1, ["L"])]
