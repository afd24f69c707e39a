"""Two catch-up writes of one sink and batch at once, in one process (docs/architecture.md
§14.4, "One writer of a sink per process").

A catch-up write of a sink without ``write_timeout_s`` that outlasts ``CatchUp.stop()``'s
wait (at ``FanOut.close()``) runs on in the old catch-up thread; the next ``FanOut`` of the
pipeline in the same process (a restarted query, a notebook's re-run cell) then caught the
same sink up with the same batch beside it. A built-in sink refuses the second commit (an
app transaction, a progress row, a fenced producer), but a third-party sink that checks
"already written?" and then writes (the plugin contract's idempotence) wrote the batch
twice. Now every catch-up of the pipeline in the process writes a sink under one lock, so
the second waits (saying so) and then finds the batch marked. Delta ledger and spool
(delta-rs), no Spark: the catch-up's read of the spool is the frames the test kept."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError, FanOut, SinkResult, SinkWriteError
from fanout.contract.batch import Batch, BatchInfo
from fanout.ledger.delta import DeltaLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.catchup import CatchUp
from tests.unit.fakes import SchemaFrame, ScriptedSink


class Target:
    """What a third-party sink writes to (a remote store both Sink objects reach): every id
    it holds, as many times as written, and the batches it records as written."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.held: set[tuple[int, int]] = set()
        self.entered = threading.Semaphore(0)  # a write past its check
        self.go = threading.Event()


class CheckThenWriteSink(ScriptedSink):
    """A third-party sink's idempotence: it answers a batch its target holds already
    written, and otherwise writes it, with time between the check and the write (a slow
    network): a write waits for ``target.go`` after its check."""

    def __init__(self, name: str, target: Target, **options: Any) -> None:
        super().__init__(name, **options)
        self.target = target

    def write(self, batch: Batch) -> int | SinkResult:
        rows = super().write(batch)  # the scripted failures first
        key, target = (batch.info.epoch, batch.batch_id), self.target
        if key in target.held:
            return SinkResult(0 if isinstance(rows, SinkResult) else rows, already_written=True)
        target.entered.release()
        assert target.go.wait(60)
        target.rows += batch.df.table.column("id").to_pylist()  # type: ignore[attr-defined]
        target.held.add(key)
        return rows


def _reading(fan: FanOut, frames: dict[int, Any]) -> None:
    """The catch-up reads the spool with Spark; here, the frames the test kept."""

    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
        assert spooled is not None, key
        return frames[key[1]], spooled.info()

    fan.catchup._reader.read = read  # type: ignore[method-assign]


CLOSER = "fanout-twice-catchup-close-after-write"
"""The thread a closed FanOut leaves to close the sinks its catch-up thread still writes
(``SinkCloser.close_after_catch_up``)."""


class Left:
    """A first ``FanOut`` of pipeline ``twice`` closed while its catch-up thread writes batch
    0 to sink ``slow`` (without ``write_timeout_s``): the write waits for ``target.go``."""

    def __init__(self, tmp_path: Path) -> None:
        self.ledger, self.spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
        self.frames = {0: SchemaFrame([10, 11, 12])}
        self.good, self.target = ScriptedSink("good"), Target()
        self.down = SinkWriteError("down", sink="slow")
        self.slow = CheckThenWriteSink("slow", self.target, always_fail=self.down)
        first = self.fan_out(self.slow, 0.05)
        _reading(first, self.frames)
        first.process(self.frames[0], BatchInfo("twice", 0, "q"))  # slow fails: spooled
        self.slow.always_fail = None  # back: the catch-up thread's write waits after its check
        assert self.target.entered.acquire(timeout=20), self.slow.calls
        (self.thread,) = [t for t in threading.enumerate() if t.name == "fanout-twice-catchup"]
        # close()'s wait for the write in progress (30 s) passes: the thread runs on
        first.catchup.stop = lambda timeout_s=0.2: CatchUp.stop(first.catchup, 0.2)  # type: ignore[method-assign]
        running = set(threading.enumerate())
        first.close()
        assert self.thread.is_alive()
        # the thread close() leaves to close the sink once the write ended: it holds the
        # first FanOut (so its catch-up's writers) until it returns, after the close()
        (self.closer,) = [t for t in threading.enumerate() if t.name == CLOSER
                          and t not in running]  # fmt: skip
        self.first: FanOut | None = first

    def fan_out(
        self, sink: CheckThenWriteSink, probe_interval_s: float, at: str | None = None
    ) -> FanOut:
        spec = SinkSpec(sink, lag=lag_policy("slow", {"on_failure": "lag"}))
        return FanOut(
            "twice", at or self.ledger, [self.good, spec], backoff_s=0, retries=0,
            spool=self.spool, probe_interval_s=probe_interval_s,
        )  # fmt: skip


@pytest.mark.parametrize("spelled", ["as-before", "file-url"])
def test_a_catch_up_write_left_running_at_close_is_not_doubled_by_the_next_fan_out(
    tmp_path: Path, spelled: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``spelled``: how the restarted query's FanOut names the same ledger (a ``file:`` URL
    with a trailing ``/`` is the same ledger, and the same one writer of the sink)."""
    left = Left(tmp_path)
    ledger, frames, good, target, slow = left.ledger, left.frames, left.good, left.target, left.slow
    old_thread, fan_out = left.thread, left.fan_out
    again = ledger if spelled == "as-before" else f"file://{ledger}/"
    said = "pipeline twice, batch 0, sink slow: its catch-up write of batch 0 (epoch 0) was"
    assert any(r.getMessage().startswith(said) for r in caplog.records), caplog.text
    assert slow.closed == 0  # left open under its write (before: closed under it)
    with pytest.raises(ConfigurationError, match="catch-up write of the sink"):
        fan_out(slow, 3600)  # still held by that write

    # the restarted query's FanOut, in the same process (its own Sink object, one target)
    second = fan_out(CheckThenWriteSink("slow", target), 3600, again)
    caught: list[Any] = []
    try:
        second.catchup.stop()  # the test drives its catch-up
        _reading(second, frames)
        # its bound holds while it waits for that write (a script's catch_up(timeout_s),
        # a final catch-up a signal stops): it returns, the sink still behind
        bounded: list[Any] = []
        waiting = threading.Thread(target=lambda: bounded.append(second.catch_up(0.3)))
        waiting.start()
        waiting.join(10)
        assert not waiting.is_alive(), "catch_up(timeout_s=0.3) waited past its bound"
        assert bounded[0]["slow"].state != "live" and target.rows == []
        catching = threading.Thread(target=lambda: caught.append(second.catch_up(30)))
        started = time.monotonic()
        catching.start()
        doubled = target.entered.acquire(timeout=1.0)  # a second write past its check
        target.go.set()
        catching.join(30)
        old_thread.join(30)
        assert not catching.is_alive() and not old_thread.is_alive()
    finally:
        target.go.set()
        second.close()
    assert target.rows == [10, 11, 12]  # the old code: [10, 11, 12, 10, 11, 12]
    assert not doubled, "a second write of batch 0 ran beside the first"
    assert time.monotonic() - started < 10
    assert caught and caught[0]["slow"].state == "live"
    assert good.calls == [(0, 1)]
    marks = [
        (e.sink, e.batch_id, e.rows)
        for e in DeltaLedger(ledger).committed_entries("twice")
        if e.sink == "slow"
    ]
    assert marks == [("slow", 0, 3)]
    deadline = time.monotonic() + 10
    while slow.closed == 0 and time.monotonic() < deadline:  # closed once its write ended
        time.sleep(0.02)
    assert slow.closed == 1


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is still writing batch" in r.getMessage()]


def test_the_next_fan_out_says_once_at_its_start_which_write_holds_the_sink_and_how_to_bound_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier FanOut's catch-up write of a sink without ``write_timeout_s`` may never
    return: the next FanOut of the pipeline says so when it is built (not only once its
    catch-up first waits for it), naming the sink, the batch and what it blocks, and how
    to free the sink and to bound such a write; its thread and a ``catch_up()`` waiting for
    the write then say nothing more."""
    left = Left(tmp_path)
    caplog.clear()
    second = left.fan_out(CheckThenWriteSink("slow", left.target), 0.05)
    try:
        (said,) = _said(caplog)  # before any catch-up of the new FanOut ran
        assert said.startswith(
            "pipeline twice, batch 0, sink slow: an earlier FanOut of the pipeline in this "
            "process (closed or replaced while its catch-up wrote) is still writing batch 0 "
            "(epoch 0) to the sink, for "
        ), said
        for words in (
            "a live batch that brings the sink to its max_lag waits for it",
            "the sink has no write_timeout_s, so a write that never returns holds it for "
            "the life of this process",
            "end this process (the next run catches the sink up)",
            "set write_timeout_s on sink 'slow'",
        ):
            assert words in said, words
        _reading(second, left.frames)
        second.catchup.start()  # its thread probes every 0.05 s, waiting for the write
        assert second.catch_up(0.3)["slow"].state != "live"
        time.sleep(0.3)
        assert len(_said(caplog)) == 1 and left.target.rows == []
    finally:
        left.target.go.set()
        left.thread.join(30)
    try:
        deadline = time.monotonic() + 20
        while second.behind() and time.monotonic() < deadline:  # its thread: batch 0 marked
            time.sleep(0.05)
        assert second.behind() == []
    finally:
        second.close()
    assert left.target.rows == [10, 11, 12]


def test_a_sink_writer_is_kept_while_a_catch_up_can_write_the_sink_and_dropped_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``catchup_writers._writers`` holds its entries weakly: one stays while the closed FanOut's
    thread writes the sink (its FanOut collected: the next FanOut shares its lock) and
    goes once no catch-up of the sink is left (the old dict kept every one for the
    process's life)."""
    from fanout.steps import catchup_writers

    def entries() -> list[tuple[str, str, str]]:
        gc.collect()
        found = catchup_writers._writers.keys()
        return [k for k in found if k[0] == "twice" and str(tmp_path) in k[1]]

    left = Left(tmp_path)
    left.first = None
    (key,) = entries()  # the thread's write holds it, its FanOut gone
    assert key[2] == "slow"
    second = left.fan_out(CheckThenWriteSink("slow", left.target), 3600)
    try:
        assert second.catchup._writers["slow"] is catchup_writers._writers[key]
    finally:
        second.close()
    del second
    assert entries() == [key]  # still the old thread's
    left.target.go.set()
    left.thread.join(30)
    # the sink closed once the write ended, and the closer, holding the first FanOut
    # until it returns, gone (waiting for ``closed`` alone raced the closer's last step)
    left.closer.join(30)
    assert not left.thread.is_alive() and not left.closer.is_alive()
    assert left.slow.closed == 1
    # pytest keeps the test's log records, and an "attempt 1 failed" record its error, whose
    # traceback holds the failed write's frames: a catch-up's, when its first try came
    # before the sink was back (a loaded machine), holds that catch-up and its writers
    for record in caplog.records:
        for arg in record.args if isinstance(record.args, tuple) else ():
            if isinstance(arg, BaseException):
                arg.__traceback__ = None
    assert entries() == []


def test_a_catch_up_is_never_told_its_own_write_is_an_earlier_fan_outs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain that finds the sink's lock taken asks whose write holds it (``writing``,
    ``last``) without the lock: read at the instant the catch-up's own write of batch 0 has
    set ``writing`` (here: by a writer that asks then, as a concurrent drain would), it
    must not take that write for an earlier FanOut's and tell the operator to end the
    process (before: ``last`` was set after ``writing``, still naming no catch-up)."""
    from fanout.steps import catchup_writers

    asked: list[str] = []
    fans: list[FanOut] = []

    class Watched(catchup_writers.SinkWriter):
        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if name == "writing" and value is not None and fans:
                asked.append(str(value))
                fans[0].catchup._tell_waiting("slow")  # a drain reading it now

    monkeypatch.setattr(catchup_writers, "SinkWriter", Watched)
    frames = {0: SchemaFrame([10, 11, 12])}
    slow = ScriptedSink("slow", always_fail=SinkWriteError("down", sink="slow"))
    fan = FanOut(
        "own", str(tmp_path / "ledger"),
        [ScriptedSink("good"), SinkSpec(slow, lag=lag_policy("slow", {"on_failure": "lag"}))],
        backoff_s=0, retries=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
    )  # fmt: skip
    try:
        _reading(fan, frames)
        fan.process(frames[0], BatchInfo("own", 0, "q"))  # slow fails: spooled
        slow.always_fail = None
        fans.append(fan)
        caplog.clear()
        assert fan.catch_up(20)["slow"].state == "live"
    finally:
        fan.close()
    assert asked == ["(0, 0)"]  # its write of batch 0 (epoch 0), read as it began
    assert _said(caplog) == [], _said(caplog)
