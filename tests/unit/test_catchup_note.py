"""The catch-up's note before it writes a spooled batch (fanout.steps.catchup_notes
``ReplayNotes.note_write``, :meth:`fanout.spool.table.Spool.note_replayed`): a process
killed in that write leaves the next run no replay of Spark's to go by, so the note makes
that run's catch-up ask the sink (:mod:`fanout.steps.replay_lag`) before writing the batch
again; the run that wrote the note retries on without asking. And a doubted replay is recorded
only for the sinks its earlier attempt could have written (:func:`may_hold`). Fake sinks
and frames, a memory ledger, a real spool (delta-rs). The real Spark and Delta paths, a
driver SIGKILLed in its catch-up write: plugins/fanout-delta/tests/test_catchup_killed.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, SinkRecordsGoneError, SinkWriteError, SpoolError
from fanout.ledger.entry import LedgerEntry, now_utc
from fanout.ledger.gaps import skip_batches
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.spool.table import Spool
from fanout.steps.lag_steps import may_hold
from fanout.steps.state import BatchState
from tests.unit.fakes import SchemaFrame, ScriptedSink
from tests.unit.test_lag import _catch_up_from_memory
from tests.unit.test_replay import GONE, Unsure

FRAME = SchemaFrame([10, 11])


def _info(batch_id: int) -> BatchInfo:
    return BatchInfo("p", batch_id, "q-1", [{"src": {"0": batch_id + 1}}])  # not a replay


def _ledger() -> MemoryLedger:
    ledger = MemoryLedger()  # batch 0 marked with rows: the sinks' records existed
    for sink in ("k", "good"):
        ledger.mark_committed(LedgerEntry("p", sink, 0, "committed", rows=3))
    return ledger


def _fan(tmp_path: Path, ledger: MemoryLedger, k: ScriptedSink) -> FanOut:
    spec = SinkSpec(k, lag=lag_policy(k.name, {"on_failure": "lag"}))
    fan = FanOut("p", ledger, [ScriptedSink("good"), spec], retries=0, backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()  # the test drives the catch-up
    _catch_up_from_memory(fan, {1: FRAME})
    return fan


def _kept(fan: FanOut) -> list[tuple[int, list[str], list[str]]]:
    assert fan.spool is not None
    return [(b.batch_id, sorted(b.needed_by), sorted(b.replayed)) for b in fan.spool.batches()]


def _index(tmp_path: Path) -> list[tuple[int, str, bool]]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(tmp_path / "spool" / "index")).to_pyarrow_table().to_pylist()
    return sorted((r["batch_id"], r["sink"], r["replayed"]) for r in rows)


def _lagged_at_1(tmp_path: Path, ledger: MemoryLedger, k: ScriptedSink) -> FanOut:
    """Batch 1 failed by ``k`` (down), spooled for it, no replay; then one catch-up
    attempt, failed too."""
    fan = _fan(tmp_path, ledger, k)
    assert list(fan.process(FRAME, _info(1))) == ["good"]
    assert _kept(fan) == [(1, ["k"], [])]
    assert isinstance(fan.catchup.drain("k", until=lambda: False), SinkWriteError)
    return fan


def test_the_catch_up_notes_its_write_and_the_run_that_noted_it_retries_unasked(
    tmp_path: Path,
) -> None:
    ledger = _ledger()
    k = Unsure("k", always_fail=SinkWriteError("down", sink="k"))
    fan = _lagged_at_1(tmp_path, ledger, k)
    try:
        assert _kept(fan) == [(1, ["k"], ["k"])]  # noted before the write began
        assert _index(tmp_path) == [(1, "k", False), (1, "k", True)]
        assert k.calls == [(1, 1), (1, 1)]  # live, then the catch-up's attempt
        assert fan.catchup._notes._noted == {("k", (0, 1))}
        k.always_fail = None
        assert fan.catchup.drain("k", until=lambda: False) is None  # this process: retried
        assert fan.catchup._notes._noted == set()  # marked: forgotten, the set stays small
        assert k.calls == [(1, 1), (1, 1), (1, 1)]
        assert k.asked == [("holds", 0, 0)]  # the run's lost-target check; batch 1: not asked
        assert fan.lagging.release_held() == 1
        assert _index(tmp_path) == []  # the note goes with the batch's other row
    finally:
        fan.close()
    assert ledger.last_committed("p", ["k", "good"], 0) == {"k": 1, "good": 1}


def test_the_next_run_asks_before_writing_a_batch_an_earlier_catch_up_began(
    tmp_path: Path,
) -> None:
    ledger = _ledger()
    k = Unsure("k", always_fail=SinkWriteError("down", sink="k"))
    _lagged_at_1(tmp_path, ledger, k).close()  # the run ends in it (a kill: the same note)

    k.always_fail = None
    fan = _fan(tmp_path, ledger, k)
    try:
        refused = fan.catchup.drain("k", until=lambda: False)
        assert isinstance(refused, SinkRecordsGoneError)
        assert (refused.sink, refused.batch_id) == ("k", 1)
        assert "or an earlier run's catch-up began writing it" in str(refused)
        assert "--through 1 --epoch 0 --spool " in str(refused)
        assert k.calls == [(1, 1), (1, 1)]  # not written again
        assert k.asked == [("holds", 0, 0), ("holds", 0, 1), ("gone", 0, 0)]  # open; asked
    finally:
        fan.close()
    assert ledger.last_committed("p", ["k", "good"], 0) == {"k": 0, "good": 1}


@pytest.mark.parametrize(
    ("sink", "frame"),
    [(ScriptedSink("k"), FRAME), (Unsure("k"), SchemaFrame([]))],
    ids=["no-records-gone", "no-row"],
)
def test_no_note_where_no_question_could_refuse(
    tmp_path: Path, sink: ScriptedSink, frame: SchemaFrame
) -> None:
    """A sink that cannot answer ``records_gone`` is never refused; a batch without rows
    neither: no index write for them."""
    sink.always_fail = SinkWriteError("down", sink="k")
    fan = _fan(tmp_path, _ledger(), sink)
    _catch_up_from_memory(fan, {1: frame})
    try:
        fan.process(frame, _info(1))
        assert isinstance(fan.catchup.drain("k", until=lambda: False), SinkWriteError)
        assert sink.calls == [(1, 1), (1, 1)]  # live, then the catch-up's attempt
        assert _index(tmp_path) == [(1, "k", False)]  # spooled; no note
    finally:
        fan.close()


def test_a_note_that_cannot_be_written_fails_the_write_before_it_begins(
    tmp_path: Path, monkeypatch: Any
) -> None:
    k = Unsure("k", always_fail=SinkWriteError("down", sink="k"))
    fan = _fan(tmp_path, _ledger(), k)
    try:
        fan.process(FRAME, _info(1))
        k.always_fail = None
        assert fan.spool is not None

        def broken(key: Any, sink: str) -> Any:
            raise SpoolError("the index cannot be written")

        monkeypatch.setattr(fan.spool, "note_replayed", broken)
        error = fan.catchup.drain("k", until=lambda: False)
        assert isinstance(error, SpoolError) and str(error) == "the index cannot be written"
        assert k.calls == [(1, 1)]  # the live attempt only
        assert fan.lagging.lags()["k"].batches == 1
    finally:
        fan.close()


def test_a_spooled_note_is_kept_once_across_instances(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "spool"), "p")
    spool.open()
    spool.add(FRAME, _info(1), {"a", "b"}, now_utc())
    spool.note_replayed((0, 1), "a")
    spool.note_replayed((0, 1), "a")  # already noted: nothing appended
    again = Spool(str(tmp_path / "spool"), "p")
    again.open()
    assert [(sorted(b.needed_by), sorted(b.replayed)) for b in again.batches()] == [
        (["a", "b"], ["a"])
    ]
    assert _index(tmp_path) == [(1, "a", False), (1, "a", True), (1, "b", False)]
    with pytest.raises(SpoolError, match=r"batch 2 \(epoch 0\) is not spooled"):
        spool.note_replayed((0, 2), "a")


def test_a_note_after_a_skip_released_the_batch_appends_no_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``fanout ledger skip --release-spooled`` (another process: another Spool instance)
    releases batch 1 for ``k`` between the catch-up's read of it and its note: the note
    appended ``k``'s row again, its mark past the batch, so the index kept it and every
    start logged the release command. The note reads the index first and appends nothing;
    the write, failing (the files vacuumed), is dropped as the skip's."""
    ledger = _ledger()
    k = Unsure("k", always_fail=SinkWriteError("down", sink="k"))
    fan = _fan(tmp_path, ledger, k)
    try:
        assert list(fan.process(FRAME, _info(1))) == ["good"]
        assert _kept(fan) == [(1, ["k"], [])]
        k.always_fail = None
        read = fan.catchup._reader.read

        def read_then_skip(sink: str, key: Any) -> Any:
            got = read(sink, key)
            other = Spool(str(tmp_path / "spool"), "p")
            other.open()
            skipped = skip_batches(ledger, "p", "k", 1, spool=other, release_spooled=True)
            assert skipped.released == (1,)
            k.always_fail = SinkWriteError("its files are gone", sink="k")  # vacuumed
            return got

        fan.catchup._reader.read = read_then_skip  # type: ignore[method-assign]
        with caplog.at_level("INFO", logger="fanout"):
            assert fan.catchup.drain("k", until=lambda: False) is None  # dropped, as skipped
        assert _index(tmp_path) == []  # released, and no note appended after it
        assert k.calls == [(1, 1), (1, 1)]  # live, then the catch-up's (the files gone)
        noted = [r.getMessage() for r in caplog.records if "not noted" in r.getMessage()]
        assert noted == [
            "pipeline p, batch 1, sink k: not noted in the spool's index: another process "
            "released the batch for the sink meanwhile (a `fanout ledger skip "
            "--release-spooled`)"
        ]
    finally:
        fan.close()
    caplog.clear()
    with caplog.at_level("WARNING", logger="fanout"):
        _fan(tmp_path, ledger, Unsure("k")).close()  # the next start: nothing kept for k
    assert [r.getMessage() for r in caplog.records if "spool" in r.getMessage()] == []
    assert ledger.last_committed("p", ["k", "good"], 0) == {"k": 1, "good": 1}


# -- which sinks a doubted replay is recorded for ----------------------------------------


class _Marks:
    """What :func:`may_hold` reads of :class:`fanout.steps.lag.Lagging`: each sink's mark."""

    def __init__(self, marks: dict[str, int | None]) -> None:
        self.marks = marks

    def mark(self, sink: str, epoch: int) -> int | None:
        assert epoch == 0
        return self.marks[sink]


def test_a_doubted_replay_is_recorded_only_for_sinks_its_earlier_attempt_could_write() -> None:
    state = BatchState(FRAME, _info(5), {}, pending=[])
    marks = _Marks({"at": 4, "behind": 3, "far": 0, "none": None})
    sinks = ["at", "behind", "far", "none"]
    assert may_hold(state, marks, sinks) == frozenset()  # type: ignore[arg-type]  # no doubt
    state.doubted = True
    assert may_hold(state, marks, sinks) == {"at", "none"}  # type: ignore[arg-type]


def test_the_spool_records_a_replay_for_the_sinks_named(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "spool"), "p")
    spool.open()
    spool.add(FRAME, _info(1), {"a", "b"}, now_utc(), replayed=["b", "c"])  # c: not spooled
    spool.add(FRAME, _info(2), {"a", "b"}, now_utc(), replayed=True)
    assert [(b.batch_id, sorted(b.replayed)) for b in spool.batches()] == [
        (1, ["b"]), (2, ["a", "b"]),
    ]  # fmt: skip


def test_a_replay_is_not_asked_of_a_sink_behind_it_at_step_3c() -> None:
    """The replay of batch 5: ``k`` marked at 3 (behind: it gets batch 4 first) is not
    asked; marked at 4 it could have been written by the earlier attempt: refused."""
    from fanout.steps.replay import unproven_sinks

    refused = {"k": GONE.replace("s3cr3t", "***")}
    for mark, expected, asked in [(3, {}, []), (4, refused, [("holds", 0, 5), ("gone", 0, 4)])]:
        ledger = MemoryLedger()
        ledger.mark_committed(LedgerEntry("p", "k", mark, "committed", rows=3))
        k = Unsure("k")
        state = BatchState(FRAME, BatchInfo("p", 5, "q-1", replayed=True), {"k": mark}, ["k"])
        assert unproven_sinks(state, {"k": k}, {}, ledger=ledger) == expected
        assert k.asked == asked
