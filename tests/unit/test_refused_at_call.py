"""A batch a ``FanOut`` refused before any sink wrote it leaves one ``refused`` ledger row
as the refusal leaves ``FanOut.__call__`` (``fanout.steps.refused``), and only then: not
for a batch a sink began writing, not for a replay (planned before the ``FanOut`` was born,
or an attempt of a batch that raised before in this process), not when the planning time
is unknown; never a row on a batch that passes. A failing record leaves the refusal as it
was; a row whose append lands late never exempts a replay after an attempt that wrote. The
checkpoint is a directory with Spark's ``offsets/N`` files, as Spark writes them;
the ledger is the memory one (the Delta ledger's rows: ``test_refusals.py``, and a real
``fanout run`` stopped: ``tests/integration/test_stop_records_refusal.py``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fanout import (
    BatchFailedError,
    CheckpointRollbackError,
    FanOut,
    SinkRecordsGoneError,
    StopRequestedError,
    TargetLostError,
)
from fanout.contract.batch import Batch
from fanout.contract.sink import Sink, SinkResult
from fanout.errors import LedgerError, SinkWriteError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc
from fanout.ledger.memory import MemoryLedger
from fanout.ledger.refusals import NO_SINK, REFUSED, refused_unwritten
from fanout.testing import RecordingSink
from fanout.testing.faults import MarkLost
from tests.unit.fakes import FakeFrame
from tests.unit.test_replay import GONE, LosesOneMark, Unsure


class Frame(FakeFrame):
    """A batch DataFrame with no Spark session: the context is read from the checkpoint
    directory given to the ``FanOut`` (as under Spark Connect, with pyarrow)."""

    sparkSession = None


class FailingSink(RecordingSink):
    """Fails the batches in ``fail_on``."""

    def __init__(self, name: str, fail_on: tuple[int, ...]) -> None:
        super().__init__(name)
        self.fail_on = fail_on

    def write(self, batch: Batch) -> SinkResult:
        if batch.batch_id in self.fail_on:
            raise SinkWriteError("refused by the test", sink=self.name, batch_id=batch.batch_id)
        return super().write(batch)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _planned(checkpoint: Path, batch: int, at_ms: int) -> int:
    """Spark's ``offsets/<batch>`` of a file source, planned at ``at_ms``."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(
        f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{at_ms},"conf":{{}}}}\n'
        f'{{"logOffset":{batch}}}'
    )
    return at_ms


def _fan(tmp_path: Path, ledger: Ledger, sink: Sink | None = None) -> FanOut:
    return FanOut("orders", ledger, [sink or RecordingSink("lake")], retries=0,
                  checkpoint_location=str(tmp_path / "cp"))  # fmt: skip


def _warned(caplog: pytest.LogCaptureFixture, part: str) -> str:
    """The one message logged that holds ``part``."""
    [warning] = [r.getMessage() for r in caplog.records if part in r.getMessage()]
    return warning


def _refusals(ledger: MemoryLedger) -> list[tuple[int, int, int | None]]:
    return [(e.epoch, e.batch_id, e.batch_timestamp_ms) for e in ledger.entries
            if e.status == REFUSED]  # fmt: skip


def test_a_batch_the_stop_gate_refuses_is_recorded_once_with_its_planning_time(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    fan = _fan(tmp_path, ledger)
    fan(Frame(), 0)  # written: no row
    planned = _planned(tmp_path / "cp", 1, _now_ms() + 5)
    fan.request_stop()
    with pytest.raises(StopRequestedError):
        fan(Frame(), 1)
    assert _refusals(ledger) == [(0, 1, planned)]
    [row] = [e for e in ledger.entries if e.status == REFUSED]
    assert (row.sink, row.attempt, row.query_id, row.error) == (NO_SINK, 1, None, None)
    assert refused_unwritten(ledger, "orders", 0, 1, planned)
    with pytest.raises(StopRequestedError):  # refused again in this process: a replay
        fan(Frame(), 1)
    assert _refusals(ledger) == [(0, 1, planned)]
    fan.close()


def test_a_batch_that_passes_reads_and_writes_no_refusal(tmp_path: Path) -> None:
    """Zero cost on the normal path: no refusal row read or written."""
    asked: list[int] = []

    class Counting(MemoryLedger):
        def refusal_rows(self, pipeline: str, epoch: int, batch_id: int) -> list[LedgerEntry]:
            asked.append(batch_id)
            return super().refusal_rows(pipeline, epoch, batch_id)

    ledger = Counting()
    fan = _fan(tmp_path, ledger)
    for batch in range(3):
        _planned(tmp_path / "cp", batch, _now_ms() + 5)
        fan(Frame(), batch)
    fan.close()
    assert asked == [] and _refusals(ledger) == []


def test_a_replay_refused_by_the_stop_gate_records_nothing(tmp_path: Path) -> None:
    """Planned before this FanOut was born: its earlier attempt may have written."""
    ledger = MemoryLedger()
    _planned(tmp_path / "cp", 0, _now_ms() - 60_000)
    fan = _fan(tmp_path, ledger)
    fan.request_stop()
    with pytest.raises(StopRequestedError):
        fan(Frame(), 0)
    fan.close()
    assert _refusals(ledger) == []


def test_a_batch_of_unknown_planning_time_records_nothing(tmp_path: Path) -> None:
    ledger = MemoryLedger()
    fan = _fan(tmp_path, ledger)  # no offsets/0: the planning time cannot be read
    fan.request_stop()
    with pytest.raises(StopRequestedError):
        fan(Frame(), 0)
    fan.close()
    assert _refusals(ledger) == []


def test_a_batch_a_sink_failed_and_then_refused_records_nothing(tmp_path: Path) -> None:
    """A sink's write began: no row; its next attempt in this process (the query restarted
    in-process on the same FanOut) is a replay, refused by the stop gate: no row either."""
    ledger = MemoryLedger()
    fan = _fan(tmp_path, ledger, FailingSink("lake", fail_on=(0,)))
    _planned(tmp_path / "cp", 0, _now_ms() + 5)
    with pytest.raises(BatchFailedError):
        fan(Frame(), 0)
    assert _refusals(ledger) == []
    fan.request_stop()
    with pytest.raises(StopRequestedError):
        fan(Frame(), 0)
    fan.close()
    assert _refusals(ledger) == []


def test_a_batch_that_raised_in_another_fan_out_of_this_process_is_a_replay(
    tmp_path: Path,
) -> None:
    """Two FanOuts of one pipeline and ledger built before the batch was planned (the
    first's write failed): the second's refusal of the replay records nothing."""
    ledger = MemoryLedger()
    first = _fan(tmp_path, ledger, FailingSink("lake", fail_on=(0,)))
    second = _fan(tmp_path, ledger, RecordingSink("lake"))
    _planned(tmp_path / "cp", 0, _now_ms() + 5)
    with pytest.raises(BatchFailedError):
        first(Frame(), 0)
    first.close()
    second.request_stop()
    with pytest.raises(StopRequestedError):
        second(Frame(), 0)
    second.close()
    assert _refusals(ledger) == []


def test_a_batch_the_guard_refuses_records_nothing(tmp_path: Path) -> None:
    """Refused by the guard step (a rolled-back checkpoint: the ledger holds batch 2,
    Spark hands batch 1 planned anew): its replay is refused again, and a refused reset
    leaves the ledger as it was: no row."""
    ledger = MemoryLedger()
    fan = _fan(tmp_path, ledger)
    for batch in range(3):
        _planned(tmp_path / "cp", batch, _now_ms() + 5)
        fan(Frame(), batch)
    _planned(tmp_path / "cp", 1, _now_ms() + 5)
    with pytest.raises(CheckpointRollbackError):
        fan(Frame(), 1)
    fan.close()
    assert _refusals(ledger) == []


class LostTarget(RecordingSink):
    """A target that holds no batch: its last marked batch is lost."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        return False


def test_a_batch_refused_after_the_guard_is_recorded_in_the_epoch_admitted(
    tmp_path: Path,
) -> None:
    """Refused in ``process`` after the guard admitted it, before any write (the run's
    first batch finds the sink's target lost; ``--accept-lost-target`` then replays it in
    the same epoch): one row, of the epoch admitted (1, after an accepted reset)."""
    ledger = MemoryLedger()
    ledger.start_epoch(LedgerEntry("orders", NO_SINK, 0, "epoch", epoch=1, query_id="q"))
    ledger.mark_committed(LedgerEntry("orders", "lake", 0, "committed", epoch=1, rows=3))
    fan = _fan(tmp_path, ledger, LostTarget("lake"))
    planned = _planned(tmp_path / "cp", 1, _now_ms() + 5)
    with pytest.raises(TargetLostError):
        fan(Frame(), 1)
    fan.close()
    assert _refusals(ledger) == [(1, 1, planned)]


def test_a_refusal_the_ledger_cannot_record_stays_the_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The row's append fails: the batch's own error goes on (a clean stop stays one),
    logged with what the cost is and the way on."""

    class Broken(MemoryLedger):
        def record_refusal_row(self, entry: LedgerEntry) -> None:
            raise LedgerError("cannot write to the ledger at /x: store unreachable")

    ledger = Broken()
    fan = _fan(tmp_path, ledger)
    _planned(tmp_path / "cp", 0, _now_ms() + 5)
    fan.request_stop()
    with caplog.at_level(logging.WARNING), pytest.raises(StopRequestedError):
        fan(Frame(), 0)
    fan.close()
    assert _refusals(ledger) == []
    assert _warned(caplog, "could not record").startswith(
        "pipeline orders, batch 0: refused before any sink wrote it, but the ledger could not "
        "record so (LedgerError: cannot write to the ledger at /x: store unreachable)"
    )
    assert "`--accept-lost-target <sink>`" in _warned(caplog, "<sink>")


def test_an_interrupt_records_nothing(tmp_path: Path) -> None:
    """Not an Exception (Ctrl-C inside the call, here in the guard's step): no row."""
    ledger = MemoryLedger()
    fan = _fan(tmp_path, ledger)
    _planned(tmp_path / "cp", 0, _now_ms() + 5)

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    fan._admission.admit = interrupt  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        fan(Frame(), 0)
    fan.close()
    assert _refusals(ledger) == []


def test_a_memory_ledgers_raised_batches_are_its_own(tmp_path: Path) -> None:
    """What raised is remembered per ledger location, or per ledger object for one in
    memory: by ``id()``, a new memory ledger given a gone one's id would take its batches
    for replays (no row: a test's refusal unrecorded, at random)."""
    from fanout.steps import refused

    ledger = MemoryLedger()
    fan = _fan(tmp_path, ledger, FailingSink("lake", fail_on=(0,)))
    _planned(tmp_path / "cp", 0, _now_ms() + 5)
    with pytest.raises(BatchFailedError):
        fan(Frame(), 0)
    fan.close()
    assert refused._seen_here[ledger]["orders"].raised == {0}  # held weakly, by the object
    assert refused.PreWrite(MemoryLedger(), "orders", _now_ms())._seen().raised == set()


class Restored(Unsure):
    """Its target reads lost (``holds_batch`` ``False``) until ``lost`` is cleared (the
    target restored); then it cannot tell whether it holds a batch, its own records gone
    (``holds_batch`` ``None``, ``records_gone`` a reason)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.lost = True

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        super().holds_batch(pipeline, epoch, batch_id)
        return False if self.lost else None


@pytest.mark.parametrize("built", ["before-start", "inside-a-batch-call"])
def test_an_attempt_after_a_refused_first_one_records_its_admission_though_not_a_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: str
) -> None:
    """Batch 1's first attempt is refused before writing (a lost target): its row. The
    FanOut is reused when the query restarts in-process (or it was built inside a
    foreachBatch call, its birth unknown): the run memory reads the second attempt as new
    (planned after its birth, never begun writing), which writes the sink and dies before
    its mark. It recorded ``admitted`` before writing, so the next process's replay, the
    sink's records gone, is refused instead of passing behind the old refusal: written
    once."""
    if built == "inside-a-batch-call":
        monkeypatch.setattr("fanout.fan_out.batch_call", lambda spark: "query q-1")
    ledger = LosesOneMark("lake", 1)
    ledger.mark_committed(LedgerEntry("orders", "lake", 0, "committed", rows=3))
    lake = Restored("lake")
    fan = _fan(tmp_path, ledger, lake)
    monkeypatch.undo()
    planned = _planned(tmp_path / "cp", 1, _now_ms() + 5)
    with pytest.raises(TargetLostError):
        fan(Frame(), 1)
    assert _refusals(ledger) == [(0, 1, planned)]
    lake.lost = False  # the target restored; the query starts again in this process
    with pytest.raises(BatchFailedError):
        fan(Frame(), 1)  # written, its mark lost
    fan.close()
    assert lake.calls == [(1, 1)]
    assert [(r.status, r.batch_timestamp_ms) for r in ledger.refusal_rows("orders", 0, 1)] == [
        ("refused", planned),
        ("admitted", planned),
    ]
    time.sleep(0.02)  # the next process's FanOut is born after the batch was planned
    again = _fan(tmp_path, ledger, lake)
    with pytest.raises(SinkRecordsGoneError):
        again(Frame(), 1)
    again.close()
    assert lake.calls == [(1, 1)]  # not written a second time
    assert _refusals(ledger) == [(0, 1, planned)]


def test_an_unpickled_fan_out_records_the_refusal_of_its_first_batch(tmp_path: Path) -> None:
    """Under Spark Connect the server's worker unpickles the FanOut at the query's setup
    (born then), the run plans batch 1, and the FanOut is built at that batch, which it
    refuses before writing (a lost target): the refusal is recorded. Its birth for the
    rows was the build, after the planning: no row, the replay falsely refused later."""
    from pyspark import cloudpickle

    path = str(tmp_path / "ledger")
    seed = DeltaLedger(path)
    seed.open()
    seed.mark_committed(
        LedgerEntry("orders", "lake", 0, "committed", rows=3, finished_at=now_utc())
    )
    fan = FanOut("orders", path, [LostTarget("lake")], retries=0,
                 checkpoint_location=str(tmp_path / "cp"))  # fmt: skip
    fan.close()
    copy: FanOut = cloudpickle.loads(cloudpickle.dumps(fan))
    time.sleep(0.01)
    planned = _planned(tmp_path / "cp", 1, _now_ms())
    time.sleep(0.01)
    with pytest.raises(TargetLostError):
        copy(Frame(), 1)  # built here, with this batch
    rows = DeltaLedger(path).refusal_rows("orders", 0, 1)
    assert [(r.status, r.sink, r.attempt, r.batch_timestamp_ms) for r in rows] == [
        (REFUSED, NO_SINK, 1, planned)
    ]


def test_a_refusal_the_ledger_does_not_record_in_time_goes_on_without_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The stop gate's refusal with a ledger store that hangs: the refusal leaves after
    ``RECORD_WAIT_S`` (``fanout run``'s stop is not held up), warned; the row is dropped,
    and not appended when the store answers later (a replay may have read the rows by
    then)."""
    from fanout.steps import refused

    release = threading.Event()
    timer = threading.Timer(10, release.set)  # no test waits for ever
    timer.daemon = True
    timer.start()

    class Hanging(MemoryLedger):
        hangs = False

        def refusal_rows(self, pipeline: str, epoch: int, batch_id: int) -> list[LedgerEntry]:
            if self.hangs:
                release.wait()
            return super().refusal_rows(pipeline, epoch, batch_id)

    monkeypatch.setattr(refused, "RECORD_WAIT_S", 0.3)
    ledger = Hanging()
    fan = _fan(tmp_path, ledger)
    _planned(tmp_path / "cp", 0, _now_ms() + 5)
    fan.request_stop()
    ledger.hangs = True
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(StopRequestedError):
        fan(Frame(), 0)
    took = time.monotonic() - started
    release.set()
    timer.cancel()
    for thread in threading.enumerate():
        if thread.name == "fanout-orders-refused":
            thread.join(5)
    fan.close()
    assert took < 3, took
    assert _refusals(ledger) == []
    # its append never began (given up in the read): no row can land late, none waited for
    assert refused._seen_here[ledger]["orders"].landing == {}
    assert refused.PreWrite(ledger, "orders", None).settled(0) is True
    assert _warned(caplog, "took more than").startswith(
        "pipeline orders, batch 0: refused, but recording so in the ledger took more than "
        "0.3 s (the ledger's or the checkpoint's store does not answer); not recorded"
    )
    assert "`--accept-lost-target <sink>`" in _warned(caplog, "<sink>")


class LandsLate(LosesOneMark):
    """A memory ledger whose append of a ``refused`` row waits for ``landing`` (a store
    that answers late), and whose first mark of ``lake`` at batch 1 fails."""

    def __init__(self, landing: threading.Event) -> None:
        super().__init__("lake", 1)
        self.landing = landing

    def record_refusal_row(self, entry: LedgerEntry) -> None:
        if entry.status == REFUSED:
            self.landing.wait(20)
        super().record_refusal_row(entry)


def _raised_by(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised (``None``: it returned)."""
    try:
        call()
    except BaseException as error:
        return error
    return None


def _join_refusal_threads() -> None:
    for thread in threading.enumerate():
        if thread.name == "fanout-orders-refused":
            thread.join(20)


@pytest.mark.parametrize("lands", ["after-the-write", "during-the-wait"])
def test_a_refusal_row_landing_late_never_exempts_a_replay_after_an_attempt_that_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    lands: str,
) -> None:  # fmt: skip
    """Batch 1's first attempt is refused before writing (a lost target); its ``refused``
    row's append outlasts ``RECORD_WAIT_S`` (given up, warned) and lands later. The query
    restarts in-process on the same FanOut: its second attempt writes the sink and dies
    before its mark. Landing after the write, the late row must not be the newest word:
    the second attempt found it under way and recorded itself ``admitted`` before
    writing, numbered at least as high. Landing while the second attempt waits for it,
    the rows are read with it (exempt, then admitted). Either way the next process's
    replay, the sink's records gone, is refused: written once."""
    from fanout.steps import refused

    # the second attempt waits for the row as long: room for the timer below on a busy host
    monkeypatch.setattr(refused, "RECORD_WAIT_S", 1.0 if lands == "after-the-write" else 3.0)
    landing = threading.Event()
    ledger = LandsLate(landing)
    ledger.mark_committed(LedgerEntry("orders", "lake", 0, "committed", rows=3))
    lake = Restored("lake")
    fan = _fan(tmp_path, ledger, lake)
    planned = _planned(tmp_path / "cp", 1, _now_ms() + 5)
    with caplog.at_level(logging.WARNING), pytest.raises(TargetLostError):
        fan(Frame(), 1)
    assert "its append is under way and may land later" in _warned(caplog, "took more than")
    assert ledger.refusal_rows("orders", 0, 1) == []  # not landed yet
    lake.lost = False  # the target restored; the query starts again in this process
    timer = threading.Timer(0.1, landing.set)  # lands 0.1 s into the second attempt's wait
    if lands == "during-the-wait":
        timer.start()
    with pytest.raises(BatchFailedError):
        fan(Frame(), 1)  # written, its mark lost
    landing.set()
    timer.cancel()
    _join_refusal_threads()
    fan.close()
    assert lake.calls == [(1, 1)]
    time.sleep(0.02)  # the next process's FanOut is born after the batch was planned
    again = _fan(tmp_path, ledger, lake)
    error = _raised_by(lambda: again(Frame(), 1))
    again.close()
    assert lake.calls == [(1, 1)]  # not written a second time
    assert isinstance(error, SinkRecordsGoneError), error
    rows = [(r.status, r.attempt, r.batch_timestamp_ms)
            for r in ledger.refusal_rows("orders", 0, 1)]  # fmt: skip
    if lands == "after-the-write":  # both numbered from a read that found no row
        assert rows == [("admitted", 1, planned), ("refused", 1, planned)]
    else:
        assert rows == [("refused", 1, planned), ("admitted", 2, planned)]
    assert refused_unwritten(ledger, "orders", 0, 1, planned) is False


class SlowRefusalDelta(DeltaLedger):
    """A Delta ledger whose commit of a ``refused`` row waits for ``landing``, under the
    ledger's lock, as a slow store's commit does."""

    landing = threading.Event()

    def __init__(self, path: str) -> None:
        super().__init__(path)
        append = self._table.append

        def slow_refusal(table: Any, entries: Any, txns: Any) -> None:
            if any(e.status == REFUSED for e in entries):
                self.landing.wait(20)
            append(table, entries, txns)

        self._table.append = slow_refusal  # type: ignore[method-assign]


def test_a_late_refusal_row_on_a_delta_ledger_is_outranked_by_the_next_writing_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same on a real Delta ledger, with two FanOuts of the pipeline in one process
    (each its own ledger object, so the slow commit holds no lock the second one waits
    for): the first refuses batch 1 (a lost target) and its row's commit lands only after
    the second's attempt wrote the batch and lost its mark. The second recorded
    ``admitted`` first; the next process's replay is refused, not exempted."""
    from fanout.steps import refused

    monkeypatch.setattr(refused, "RECORD_WAIT_S", 3.0)  # the row's read of the ledger first
    path = str(tmp_path / "ledger")
    seed = DeltaLedger(path)
    seed.open()
    seed.mark_committed(
        LedgerEntry("orders", "lake", 0, "committed", rows=3, finished_at=now_utc())
    )
    SlowRefusalDelta.landing = threading.Event()
    lake = Restored("lake")  # the second FanOut's: one Sink object serves one FanOut
    lake.lost = False
    first = _fan(tmp_path, SlowRefusalDelta(path), LostTarget("lake"))
    second = _fan(tmp_path, MarkLost(path, "lake"), lake)
    planned = _planned(tmp_path / "cp", 1, _now_ms() + 5)
    with caplog.at_level(logging.WARNING), pytest.raises(TargetLostError):
        first(Frame(), 1)
    assert "its append is under way and may land later" in _warned(caplog, "took more than")
    with pytest.raises(BatchFailedError):
        second(Frame(), 1)  # written, its mark lost
    SlowRefusalDelta.landing.set()
    _join_refusal_threads()
    first.close()
    second.close()
    assert lake.calls == [(1, 1)]
    time.sleep(0.02)  # the next process's FanOut is born after the batch was planned
    again = _fan(tmp_path, DeltaLedger(path), lake)
    error = _raised_by(lambda: again(Frame(), 1))
    again.close()
    assert lake.calls == [(1, 1)]  # not written a second time
    assert isinstance(error, SinkRecordsGoneError), error
    reader = DeltaLedger(path)
    rows = sorted(reader.refusal_rows("orders", 0, 1), key=lambda r: r.status)
    assert [(r.status, r.attempt, r.batch_timestamp_ms) for r in rows] == [
        ("admitted", 1, planned),
        ("refused", 1, planned),
    ]
    assert refused_unwritten(reader, "orders", 0, 1, planned) is False


def test_a_replay_that_writes_records_itself_admitted_though_it_read_no_refusal_row(
    tmp_path: Path,
) -> None:
    """Batch 1's first attempt, in a process still ending (a Connect worker in its exit
    grace), is refused before writing; its ``refused`` row's append is slow. Beside it,
    the next process replays the batch, reads no row (not landed), writes the sink and
    dies before its mark. It recorded ``admitted`` before writing, so the late row, read
    before the other process gave up and numbered so, lands at or below it: the next
    replay, the sink's records gone, is refused, not exempt. Written once."""
    ledger = LosesOneMark("lake", 1)
    ledger.mark_committed(LedgerEntry("orders", "lake", 0, "committed", rows=3))
    lake = Unsure("lake", gone=None)  # its records there: the replay check lets it pass
    planned = _planned(tmp_path / "cp", 1, _now_ms() - 60_000)  # planned before: a replay
    first_read = ledger.refusal_rows("orders", 0, 1)  # the ending process's read: nothing
    fan = _fan(tmp_path, ledger, lake)
    with pytest.raises(BatchFailedError):
        fan(Frame(), 1)  # no row read; written, its mark lost
    fan.close()
    assert lake.calls == [(1, 1)]
    rows = [(r.status, r.attempt) for r in ledger.refusal_rows("orders", 0, 1)]
    assert rows == [("admitted", 1)]
    at = now_utc()
    late = LedgerEntry(pipeline="orders", sink=NO_SINK, batch_id=1, status=REFUSED,
                       attempt=max((r.attempt for r in first_read), default=0) + 1,
                       started_at=at, finished_at=at, epoch=0,
                       batch_timestamp_ms=planned)  # fmt: skip
    ledger.record_refusal_row(late)  # the late row lands, numbered from its earlier read
    assert [(r.status, r.attempt) for r in ledger.refusal_rows("orders", 0, 1)] == [
        ("admitted", 1),
        ("refused", 1),
    ]
    assert refused_unwritten(ledger, "orders", 0, 1, planned) is False
    lake.gone = GONE  # the sink's records expire before the next replay
    again = _fan(tmp_path, ledger, lake)
    error = _raised_by(lambda: again(Frame(), 1))
    again.close()
    assert isinstance(error, SinkRecordsGoneError), error
    assert lake.calls == [(1, 1)]  # not written a second time
