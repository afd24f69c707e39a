"""``write_timeout_s``: only a lag sink takes it; a write that does not return in time is
abandoned, the batch goes on, the sink lags; the abandoned write never marks, the catch-up
waits for it, and ``close()`` does not wait for it for ever (fakes, a memory ledger and a
real spool)."""

from __future__ import annotations

import gc
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fanout import (
    ConfigurationError,
    FanOut,
    LagLimitError,
    SinkTimeoutError,
    SinkWriteError,
    hookimpl,
)
from fanout.contract.batch import Batch, BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import LagPolicy, SinkSpec, lag_policy, write_timeouts
from fanout.steps.lag_state import Reopening
from fanout.steps.timeout import WriteClaim
from tests.unit.fakes import SchemaFrame, ScriptedSink


def test_a_lag_sink_takes_a_write_timeout() -> None:
    options = {"on_failure": "lag", "write_timeout_s": 2}
    assert lag_policy("s", options) == LagPolicy("lag", write_timeout_s=2.0)


def test_write_timeouts_are_those_of_the_named_lag_sinks_that_have_one() -> None:
    """The per-sink bounds the steps take (:func:`fanout.sink_spec.write_timeouts`): a lag
    sink's ``write_timeout_s``; a lag sink without one, a stopping sink, and a sink not
    named are left out."""
    specs = {
        "slow": SinkSpec(ScriptedSink("slow"), lag=LagPolicy("lag", write_timeout_s=2.5)),
        "other": SinkSpec(ScriptedSink("other"), lag=LagPolicy("lag", write_timeout_s=9.0)),
        "waited": SinkSpec(ScriptedSink("waited"), lag=LagPolicy("lag")),
        "stops": SinkSpec(ScriptedSink("stops")),
    }
    assert write_timeouts(specs, ["slow", "waited", "stops"]) == {"slow": 2.5}
    assert write_timeouts(specs, specs) == {"slow": 2.5, "other": 9.0}
    assert write_timeouts(specs, []) == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"write_timeout_s": 2},
            "sink 's': write_timeout_s=2 only applies with on_failure='lag', not 'stop': a "
            "write past its timeout is abandoned and the batch goes on without the sink",
        ),
        (
            {"on_failure": "stop", "write_timeout_s": 0.5, "backfill_from": "lake"},
            "sink 's': write_timeout_s=0.5 only applies with on_failure='lag', not 'stop'",
        ),
        ({"on_failure": "lag", "write_timeout_s": 0}, "sink 's': write_timeout_s must be a "),
        ({"on_failure": "lag", "write_timeout_s": "2s"}, "sink 's': write_timeout_s must be a "),
        (
            {"on_failure": "lag", "write_timeout_s": float("inf")},
            "sink 's': write_timeout_s must be finite",
        ),
    ],
)
def test_a_write_timeout_elsewhere_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        lag_policy("s", options)
    assert str(bad.value).startswith(message)


def test_a_sink_spec_with_a_write_timeout_and_no_lag_is_refused(tmp_path: Path) -> None:
    spec = SinkSpec(ScriptedSink("slow"), lag=LagPolicy("stop", write_timeout_s=2))
    with pytest.raises(ConfigurationError, match="^sink 'slow': write_timeout_s=2 only applies"):
        FanOut("p", MemoryLedger(), [ScriptedSink("good"), spec], spool=str(tmp_path / "s"))


def test_fanout_validate_reports_a_write_timeout_without_lag(
    tmp_path: Path, with_test_sinks: Callable[[object], None], capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused with the entry's path when the file is read, before a Spark session starts
    (as a sink option of the wrong type is), by `fanout validate` and `fanout run` alike."""
    from fanout.app.cli import main
    from tests.unit.test_validate_read_only import _Plugin

    with_test_sinks(_Plugin())
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = "{tmp_path}/c"\n'
        '[source]\nformat = "rate"\n[[sinks]]\ntype = "checks-dir"\nname = "slow"\n'
        f'directory = "{tmp_path}/d"\nwrite_timeout_s = 30\n'
    )
    assert main(["validate", str(file)]) == 2
    assert capsys.readouterr().err.strip() == (
        "fanout: configuration error: sinks[0]: sink 'slow': write_timeout_s=30 only applies "
        "with on_failure='lag', not 'stop': a write past its timeout is abandoned and the batch "
        "goes on without the sink, which then has nowhere to get the batch from but the "
        "spool and the catch-up of a lagging sink. Set on_failure='lag' (and a spool), or "
        "remove write_timeout_s"
    )


def test_the_mark_and_the_abandonment_exclude_each_other() -> None:
    marked = WriteClaim()
    assert marked.mark() and not marked.abandon() and marked.mark()
    abandoned = WriteClaim()
    assert abandoned.abandon() and not abandoned.mark() and abandoned.abandoned


class Gate:
    """Holds a sink's write of the batches it is told to until it is opened."""

    def __init__(self, *batches: int) -> None:
        self.batches = set(batches)
        self.opened = threading.Event()
        self.entered = threading.Event()

    def __call__(self, batch: Batch) -> None:
        if batch.batch_id in self.batches:
            self.entered.set()
            self.opened.wait(30)


def _fan(tmp: Path, slow: ScriptedSink, timeout_s: float) -> FanOut:
    spec = SinkSpec(slow, lag=LagPolicy("lag", write_timeout_s=timeout_s))
    return FanOut(
        "timed",
        MemoryLedger(),
        [ScriptedSink("good"), spec],
        backoff_s=0,
        spool=str(tmp / "spool"),
        probe_interval_s=3600,
    )


def _read_from(fan: FanOut, frames: dict[int, SchemaFrame]) -> None:
    """The catch-up reads the spool with Spark; here it reads the frames the test kept."""

    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
        assert spooled is not None, key
        return frames[key[1]], spooled.info()

    fan.catchup._reader.read = read  # type: ignore[method-assign]


def test_a_hung_write_is_abandoned_and_the_catch_up_waits_for_it(tmp_path: Path) -> None:
    gate = Gate(0)
    slow = ScriptedSink("slow", on_write=gate)
    fan = _fan(tmp_path, slow, 0.3)
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(3)}
    _read_from(fan, frames)
    fan.catchup.stop()  # the test drives the catch-up
    try:
        started = time.monotonic()
        assert list(fan.process(frames[0], BatchInfo("timed", 0, "q"))) == ["good"]
        assert time.monotonic() - started < 5
        lag = fan.lagging.lags()["slow"]
        assert (lag.state, lag.batches) == ("lagging", 1)
        assert lag.error is not None and lag.error.startswith(
            "SinkTimeoutError: sink 'slow', batch 0: write did not return within its "
            "write_timeout_s=0.3 s (all attempts together; now at attempt 1)"
        )
        failed = [e for e in fan.ledger.entries if e.status == "failed"]  # type: ignore[attr-defined]
        assert [(e.sink, e.batch_id, e.attempt) for e in failed] == [("slow", 0, 1)]

        # batch 1: held back (behind), spooled; the catch-up does not write batch 0 again
        # while the abandoned write runs
        fan.process(frames[1], BatchInfo("timed", 1, "q"))
        lags = fan.catch_up(timeout_s=1)
        assert slow.calls == [(0, 1)]
        assert lags["slow"].state == "lagging"
        assert fan.abandoned.running("slow") is not None

        gate.opened.set()  # the abandoned write returns: it does not mark
        deadline = time.monotonic() + 10
        while fan.abandoned.running("slow") is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": None}

        lags = fan.catch_up(timeout_s=10)  # now it writes 0, then 1, each marked once
        assert lags["slow"].state == "live"
        assert slow.calls == [(0, 1), (0, 1), (1, 1)]
        marks = [
            (e.sink, e.batch_id)
            for e in fan.ledger.entries  # type: ignore[attr-defined]
            if e.status == "committed"
        ]
        assert sorted(marks) == [("good", 0), ("good", 1), ("slow", 0), ("slow", 1)]

        fan.process(frames[2], BatchInfo("timed", 2, "q"))  # live again, in time
        assert slow.calls[-1] == (2, 1)
    finally:
        gate.opened.set()
        fan.close()


def test_a_hung_catch_up_write_is_abandoned_too(tmp_path: Path) -> None:
    gate = Gate(0)
    slow = ScriptedSink("slow", always_fail=SinkWriteError("refused", sink="slow"))
    fan = _fan(tmp_path, slow, 0.3)
    frames = {0: SchemaFrame([1, 2])}
    _read_from(fan, frames)
    fan.catchup.stop()  # the test drives the catch-up
    try:
        fan.process(frames[0], BatchInfo("timed", 0, "q"))  # fails at once: lags
        slow.always_fail, slow.on_write = None, gate  # back, but its catch-up write hangs
        started = time.monotonic()
        lags = fan.catch_up(timeout_s=1)
        assert time.monotonic() - started < 5
        assert gate.entered.is_set() and slow.calls == [(0, 1), (0, 1)]
        assert lags["slow"].state == "lagging"
        assert lags["slow"].error is not None and lags["slow"].error.startswith(
            "SinkTimeoutError: sink 'slow', batch 0: write did not return within its "
            "write_timeout_s=0.3 s"
        )
        running = fan.abandoned.running("slow")
        assert running is not None and running.key == (0, 0)

        gate.opened.set()  # it returns, unmarked; the next turn writes the batch, marked
        assert running.done.wait(10)
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": None}
        assert fan.catch_up(timeout_s=10)["slow"].state == "live"
        assert slow.calls == [(0, 1), (0, 1), (0, 1)]
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": 0}
    finally:
        gate.opened.set()
        fan.close()


def test_a_slow_catch_up_write_gets_twice_the_time_after_each_abandoned_one(
    tmp_path: Path,
) -> None:
    slow = ScriptedSink("slow", always_fail=SinkWriteError("refused", sink="slow"))
    fan = _fan(tmp_path, slow, 1.0)
    _read_from(fan, {0: SchemaFrame([1, 2])})
    fan.catchup.stop()  # the test drives the catch-up
    # the first catch-up write waits for ``first_ends`` (abandoned whatever the load); the
    # second takes 1.1 s: more than the 1 s it would get again, 0.9 s less than twice that
    first_ends = threading.Event()
    writes = iter([lambda: first_ends.wait(30), lambda: time.sleep(1.1)])
    try:
        fan.process(SchemaFrame([1, 2]), BatchInfo("timed", 0, "q"))  # fails at once: lags
        slow.always_fail, slow.on_write = None, lambda batch: next(writes)()  # back, slow
        assert fan.catch_up(timeout_s=10)["slow"].state == "lagging"  # 1 s: abandoned
        first_ends.set()
        lags = fan.catch_up(timeout_s=10)  # waits for that write to end, then 2 s: written
        assert [lags["slow"].state, slow.calls] == ["live", [(0, 1), (0, 1), (0, 1)]]
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": 0}
        errors = [e.error for e in fan.ledger.entries if e.status == "failed"]  # type: ignore[attr-defined]
        assert len(errors) == 2 and errors[1] is not None
        assert errors[1].startswith(
            "SinkTimeoutError: sink 'slow', batch 0: write did not return within its "
            "write_timeout_s=1 s (all attempts together; now at attempt 1)"
        )
        assert fan.catch_up(timeout_s=1)["slow"].state == "live"
    finally:
        fan.close()


def test_a_write_that_returns_in_time_is_marked_as_without_a_timeout(tmp_path: Path) -> None:
    slow = ScriptedSink("slow")
    fan = _fan(tmp_path, slow, 5)
    try:
        results = fan.process(SchemaFrame([1, 2]), BatchInfo("timed", 0, "q"))
        assert sorted(results) == ["good", "slow"]
        assert fan.ledger.last_committed("timed", ["good", "slow"]) == {"good": 0, "slow": 0}
        assert fan.abandoned.running("slow") is None
    finally:
        fan.close()


def test_close_does_not_wait_for_an_abandoned_write_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("fanout.dispatch.closing.CLOSE_WAIT_S", 0.2)
    gate = Gate(0)
    slow = ScriptedSink("slow", on_write=gate)
    fan = _fan(tmp_path, slow, 0.2)
    try:
        fan.process(SchemaFrame([1]), BatchInfo("timed", 0, "q"))
        assert gate.entered.is_set()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="fanout"):
            fan.close()
        assert time.monotonic() - started < 5
        said = [
            r.getMessage() for r in caplog.records if "still running at close" in r.getMessage()
        ]
        assert len(said) == 1 and said[0].startswith(
            "pipeline timed, batch 0, sink slow: its write, abandoned after 0.2 s "
            "(write_timeout_s), is still running at close"
        )
        assert slow.closed == 0  # left open under its running write
        assert isinstance(SinkTimeoutError("x", sink="slow"), Exception)
    finally:
        gate.opened.set()


def test_close_says_a_returned_write_waits_for_its_cancelled_tasks_and_closes_its_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An abandoned write that has returned counts as running until its cancelled Spark
    tasks end (up to TASKS_END_S, longer than close waits): close() must not report its
    write as still running, nor leave its sink open for it."""
    tasks_end = threading.Event()
    monkeypatch.setattr("fanout.dispatch.closing.CLOSE_WAIT_S", 0.2)
    monkeypatch.setattr("fanout.steps.timeout.TASKS_END_S", 30.0)
    monkeypatch.setattr(
        "fanout.steps.timeout.running_tasks", lambda session, tag: 0 if tasks_end.is_set() else 1
    )
    gate, left = Gate(0), threading.Event()

    def on_write(batch: Batch) -> None:
        gate(batch)
        left.set()

    slow = ScriptedSink("slow", on_write=on_write)
    fan = _fan(tmp_path, slow, 0.2)
    try:
        fan.process(SchemaFrame([1]), BatchInfo("timed", 0, "q"))
        running = fan.abandoned.running("slow")
        gate.opened.set()  # the write returns; its tasks run on
        assert running is not None and left.wait(10)
        assert running.returned.wait(10)  # out of the sink's write, and of the runner's
        with caplog.at_level(logging.WARNING, logger="fanout"):
            fan.close()
        said = [r.getMessage() for r in caplog.records if "at close" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith(
            "pipeline timed, batch 0, sink slow: its write, abandoned after 0.2 s "
            "(write_timeout_s), has returned, but Spark tasks of its cancelled jobs were "
            "still running at close"
        )
        assert slow.closed == 1
        ledger = fan.ledger
        del fan
        gc.collect()  # the write's thread alone keeps the pipeline's abandoned writes
        spec = SinkSpec(ScriptedSink("slow"), lag=LagPolicy("lag", write_timeout_s=0.2))
        again = FanOut(
            "timed", ledger, [ScriptedSink("good"), spec], backoff_s=0,
            spool=str(tmp_path / "spool"), probe_interval_s=3600,
        )  # fmt: skip
        assert again.abandoned.running("slow") is running  # a next FanOut still waits for it
        tasks_end.set()
        assert running.done.wait(10)
        assert again.abandoned.running("slow") is None
        again.close()
    finally:
        gate.opened.set()
        tasks_end.set()


class Observer:
    """Records the sink hooks it hears: (hook, sink, batch id, attempt or error text)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str, int, object]] = []

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        self.heard.append(("start", sink, info.batch_id, attempt))

    @hookimpl
    def fanout_sink_error(
        self, info: BatchInfo, sink: str, error: BaseException, attempt: int, will_retry: bool
    ) -> None:
        self.heard.append(("error", sink, info.batch_id, type(error).__name__))

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        self.heard.append(("done", sink, info.batch_id, result.rows))


def test_an_abandoned_write_calls_no_sink_hook_after_its_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The batch reported the sink's timeout (``fanout_sink_error``); the abandoned write's
    thread failing later called ``fanout_sink_error`` again, for a batch that had ended:
    now it logs at debug. (One returning late was already kept from ``fanout_sink_done``.)"""
    gate = Gate(0)
    failure = SinkWriteError("late failure", sink="slow")
    slow = ScriptedSink("slow", on_write=gate, fail=[failure], transient=(SinkWriteError,))
    observer = Observer()
    spec = SinkSpec(slow, lag=LagPolicy("lag", write_timeout_s=0.3))
    fan = FanOut("timed", MemoryLedger(), [ScriptedSink("good"), spec], backoff_s=0,
                 retries=2, spool=str(tmp_path / "spool"), probe_interval_s=3600,
                 plugins=[observer])  # fmt: skip
    fan.catchup.stop()
    try:
        with caplog.at_level(logging.DEBUG, logger="fanout"):
            assert list(fan.process(SchemaFrame([1, 2]), BatchInfo("timed", 0, "q"))) == ["good"]
            reported = sorted(h for h in observer.heard if h[1] == "slow")
            assert reported == [("error", "slow", 0, "SinkTimeoutError"),
                                ("start", "slow", 0, 1)]  # fmt: skip
            gate.opened.set()
            deadline = time.monotonic() + 10
            while fan.abandoned.running("slow") is not None and time.monotonic() < deadline:
                time.sleep(0.02)
        assert fan.abandoned.running("slow") is None
        assert sorted(h for h in observer.heard if h[1] == "slow") == reported
        assert slow.calls == [(0, 1)]
        late = [
            r.getMessage() for r in caplog.records if "of its abandoned write" in r.getMessage()
        ]
        assert late == [
            "pipeline timed, batch 0, sink slow: attempt 1 of its abandoned write failed: "
            "sink 'slow': late failure"
        ]
        assert all(r.levelno == logging.DEBUG for r in caplog.records if r.getMessage() in late)
    finally:
        gate.opened.set()


def test_an_abandoned_write_waiting_to_retry_does_not_retry(tmp_path: Path) -> None:
    """Abandoned during its backoff, a write makes no further attempt: one started after
    the cancel runs its Spark jobs uncancelled, and only keeps the sink from its catch-up."""
    slow = ScriptedSink(
        "slow", fail=[SinkWriteError("reset", sink="slow")], transient=(SinkWriteError,)
    )
    spec = SinkSpec(slow, lag=LagPolicy("lag", write_timeout_s=0.2))
    fan = FanOut(
        "timed",
        MemoryLedger(),
        [ScriptedSink("good"), spec],
        retries=1,
        backoff_s=1.0,
        spool=str(tmp_path / "spool"),
        probe_interval_s=3600,
    )
    fan.catchup.stop()
    try:
        assert list(fan.process(SchemaFrame([1]), BatchInfo("timed", 0, "q"))) == ["good"]
        running = fan.abandoned.running("slow")
        assert running is not None and running.done.wait(10)
        assert slow.calls == [(0, 1)]
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": None}
        # one failed row per attempt: the timeout came between attempts, during the backoff
        failed = [e for e in fan.ledger.entries if e.status == "failed"]  # type: ignore[attr-defined]
        assert [(e.sink, e.batch_id, e.attempt, e.error) for e in failed] == [
            ("slow", 0, 1, "SinkWriteError: sink 'slow': reset")
        ]
        lag = fan.lagging.lags()["slow"]
        assert lag.error is not None and lag.error.startswith(
            "SinkTimeoutError: sink 'slow', batch 0: write did not return within"
        )
    finally:
        fan.close()


def test_close_gives_up_a_catch_up_write_still_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up write's bound (write_timeout_s, doubled after each abandoned one) may
    exceed what close() waits for the catch-up thread: close() must then treat it as
    abandoned (kept until it ends, its sink left open), not close the sink under it and
    forget it (a next FanOut of the pipeline would write its batch beside it)."""
    from fanout.steps.catchup import CatchUp

    stop = CatchUp.stop
    monkeypatch.setattr(CatchUp, "stop", lambda self, timeout_s=0.3: stop(self, timeout_s))
    monkeypatch.setattr("fanout.dispatch.closing.CLOSE_WAIT_S", 0.2)
    gate = Gate(0)
    slow = ScriptedSink("slow", always_fail=SinkWriteError("refused", sink="slow"))
    spec = SinkSpec(slow, lag=LagPolicy("lag", write_timeout_s=60))
    fan = FanOut(
        "timed",
        MemoryLedger(),
        [ScriptedSink("good"), spec],
        retries=0,
        spool=str(tmp_path / "spool"),
        probe_interval_s=0.05,
    )
    _read_from(fan, {0: SchemaFrame([1, 2])})
    try:
        fan.process(SchemaFrame([1, 2]), BatchInfo("timed", 0, "q"))  # fails: lags
        slow.on_write = gate  # its catch-up write (in the catch-up thread) hangs
        slow.always_fail = None
        assert gate.entered.wait(10)
        started = time.monotonic()
        fan.close()
        assert time.monotonic() - started < 5
        running = fan.abandoned.running("slow")
        assert running is not None and running.key == (0, 0)
        assert slow.closed == 0  # left open under its running write
        gate.opened.set()
        assert running.done.wait(10)
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": None}  # not marked
    finally:
        gate.opened.set()
        for thread in threading.enumerate():  # the stopped catch-up ends (it logs on the way)
            if thread.name == "fanout-timed-catchup":
                thread.join(10)


class ReopenHangs(ScriptedSink):
    """Unreachable when the pipeline starts; its next open() hangs (a server that accepts
    the connection and never answers) until ``gate`` opens."""

    def __init__(self, name: str, gate: threading.Event) -> None:
        super().__init__(name)
        self.gate = gate

    def open(self, context: Any) -> None:
        self.opened += 1
        if self.opened == 1:
            from fanout import SinkUnreachableError

            raise SinkUnreachableError("connection refused", sink=self.name)
        self.gate.wait(30)


def test_a_hung_reopen_of_a_timed_sink_does_not_stall_the_batch(tmp_path: Path) -> None:
    gate = threading.Event()
    slow = ReopenHangs("slow", gate)
    fan = _fan(tmp_path, slow, 0.3)
    _read_from(fan, {0: SchemaFrame([1])})
    fan.catchup.stop()  # the test drives the catch-up
    done: list[dict[str, Any]] = []
    thread = threading.Thread(
        target=lambda: done.append(fan.process(SchemaFrame([1]), BatchInfo("timed", 0, "q"))),
        daemon=True,
    )
    try:
        thread.start()
        thread.join(5)
        assert [sorted(d) for d in done] == [["good"]]  # the batch went on without it
        lag = fan.lagging.lags()["slow"]
        assert lag.error is not None and lag.error.startswith(
            "SinkTimeoutError: sink 'slow': open() did not return within its write_timeout_s=0.3 s"
        )
        held = fan.lagging.held("slow")
        assert isinstance(held, Reopening)
        gate.set()  # the open returns: the sink is open, its batch written from the spool
        assert held.opening.done.wait(10)
        caught = fan.catch_up(timeout_s=10)["slow"]
        assert caught.state == "live", caught
        assert slow.opened == 2 and slow.calls == [(0, 1)]
    finally:
        gate.set()
        thread.join(10)
        fan.close()


def _process_in_thread(fan: FanOut, batch: int) -> tuple[threading.Thread, list[object]]:
    """Process ``batch`` in a thread of its own; what it returned or raised is appended."""
    done: list[object] = []

    def run() -> None:
        try:
            done.append(fan.process(SchemaFrame([batch]), BatchInfo("timed", batch, "q")))
        except Exception as exc:
            done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def _max_lag_fan(tmp: Path, slow: ScriptedSink, probe_interval_s: float) -> FanOut:
    spec = SinkSpec(slow, lag=LagPolicy("lag", max_lag_batches=1, write_timeout_s=0.3))
    return FanOut("timed", MemoryLedger(), [ScriptedSink("good"), spec], retries=0,
                  spool=str(tmp / "spool"), probe_interval_s=probe_interval_s)  # fmt: skip


def test_a_max_lag_drain_waits_write_timeout_s_for_a_hung_catch_up_write(tmp_path: Path) -> None:
    """The catch-up thread writes the hung sink under its lock, with a bound of 64 times
    its write_timeout_s (after abandoned writes in a row): the live batch's drain at
    max_lag waited that whole bound for the lock. Now it gives that write up after the
    sink's write_timeout_s, waits as long for it to end, and stops the query."""
    gate = Gate(0)
    writes: list[int] = []

    def hang_after_the_first(batch: Batch) -> None:
        writes.append(batch.batch_id)
        if len(writes) > 1:  # the catch-up's write (thread) hangs
            gate(batch)

    # the live write fails, the first catch-up write hangs: set up before the catch-up's
    # thread can write (switching the script after process() raced it: a third failure)
    slow = ScriptedSink("slow", fail=[SinkWriteError("refused", sink="slow")],
                        on_write=hang_after_the_first)  # fmt: skip
    fan = _max_lag_fan(tmp_path, slow, 0.05)
    _read_from(fan, {0: SchemaFrame([0])})
    fan.catchup._timed_out["slow"] = 6  # its catch-up writes get 0.3 s x 64
    try:
        fan.process(SchemaFrame([0]), BatchInfo("timed", 0, "q"))  # fails: lags, 1 behind
        assert gate.entered.wait(10)
        thread, done = _process_in_thread(fan, 1)  # 2 behind: past max_lag, drained
        thread.join(5)
        assert len(done) == 1 and isinstance(done[0], LagLimitError), done
        assert str(done[0]).startswith(
            "pipeline 'timed': sink 'slow' is 1 batch(es) / 1 row(s) behind"
        )
        assert re.search(
            r"past its max_lag \(1 batches; now 2 batches > 1\), and it is still failing: "
            r"SinkTimeoutError: sink 'slow', batch 0: its write of batch 0 \(epoch 0\), "
            r"abandoned after (0\.[3-9]|1\.\d) s \(write_timeout_s\), is still running",
            str(done[0]),
        )
        failed = [e for e in fan.ledger.entries if e.status == "failed"]  # type: ignore[attr-defined]
        assert [(e.batch_id, e.attempt) for e in failed] == [(0, 1), (0, 1)]
        assert failed[1].error is not None and failed[1].error.startswith(
            "SinkTimeoutError: sink 'slow', batch 0: write did not return before a max_lag "
            "drain had waited its write_timeout_s for it (bound 19.2 s (its "
            "write_timeout_s=0.3 s, doubled for each of its catch-up writes abandoned in a row)"
        )
    finally:
        gate.opened.set()
        fan.close()


def test_a_max_lag_drain_bounds_its_own_write_by_write_timeout_s(tmp_path: Path) -> None:
    """The drain's own write of a hung sink got the catch-up's doubled bound (64 times
    write_timeout_s): the live batch waits for it, so it gets write_timeout_s."""
    gate = Gate(0)
    slow = ScriptedSink("slow", always_fail=SinkWriteError("refused", sink="slow"))
    fan = _max_lag_fan(tmp_path, slow, 3600)
    _read_from(fan, {0: SchemaFrame([0])})
    fan.catchup.stop()  # the drain writes it
    fan.catchup._timed_out["slow"] = 6
    try:
        fan.process(SchemaFrame([0]), BatchInfo("timed", 0, "q"))  # fails: lags, 1 behind
        slow.always_fail, slow.on_write = None, gate  # its next write hangs
        thread, done = _process_in_thread(fan, 1)
        thread.join(5)
        assert len(done) == 1 and isinstance(done[0], LagLimitError), done
        assert (
            "and it is still failing: SinkTimeoutError: sink 'slow', batch 0: write did not "
            "return within its write_timeout_s=0.3 s (all attempts together; now at attempt 1)"
        ) in str(done[0])
        assert slow.calls == [(0, 1), (0, 1)]
    finally:
        gate.opened.set()
        fan.close()


class SlowArrow(SchemaFrame):
    """A batch whose Arrow conversion takes ``seconds`` (a large batch, a busy cluster)."""

    def __init__(self, ids: list[int], seconds: float) -> None:
        super().__init__(ids)
        self.seconds = seconds

    def toArrow(self) -> Any:
        time.sleep(self.seconds)
        return super().toArrow()


def test_the_shared_arrow_conversion_does_not_count_against_a_timed_sink(
    tmp_path: Path,
) -> None:
    """Both sinks read the batch's one Arrow conversion; whoever converts first, the
    other waits for it. A timed sink's clock ran meanwhile: a conversion slower than its
    write_timeout_s made a sink with nothing wrong lag. Its clock now stops while its
    input is converted."""
    slow = ScriptedSink("slow", reads="arrow")
    spec = SinkSpec(slow, lag=LagPolicy("lag", write_timeout_s=0.3))
    fan = FanOut("timed", MemoryLedger(), [ScriptedSink("good", reads="arrow"), spec],
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    try:
        frame = SlowArrow([1, 2, 3], 0.6)
        results = fan.process(frame, BatchInfo("timed", 0, "q"))
        assert sorted(results) == ["good", "slow"]
        assert frame.to_arrow_calls == 1
        assert fan.ledger.last_committed("timed", ["good", "slow"]) == {"good": 0, "slow": 0}
        assert [e for e in fan.ledger.entries if e.status == "failed"] == []  # type: ignore[attr-defined]
        assert [t.num_rows for t in slow.arrow_tables] == [3]
        assert fan.lagging.lags()["slow"].state == "live"
    finally:
        fan.close()


def test_a_timed_sink_still_times_out_after_its_input_is_ready(tmp_path: Path) -> None:
    gate = Gate(0)

    def hang_after_arrow(batch: Batch) -> None:
        batch.arrow()  # 0.6 s, not counted
        gate(batch)  # then its own write hangs: counted

    slow = ScriptedSink("slow", reads="arrow", on_write=hang_after_arrow)
    spec = SinkSpec(slow, lag=LagPolicy("lag", write_timeout_s=0.3))
    fan = FanOut("timed", MemoryLedger(), [ScriptedSink("good"), spec],
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    try:
        started = time.monotonic()
        assert list(fan.process(SlowArrow([1], 0.6), BatchInfo("timed", 0, "q"))) == ["good"]
        assert 0.9 <= time.monotonic() - started < 5
        lag = fan.lagging.lags()["slow"]
        assert lag.error is not None and lag.error.startswith(
            "SinkTimeoutError: sink 'slow', batch 0: write did not return within its "
            "write_timeout_s=0.3 s"
        )
    finally:
        gate.opened.set()
        fan.close()


class Hangs(ScriptedSink):
    """A timed sink whose ``open()`` (the first), ``holds_batch()`` or ``close()`` hangs
    until ``gate`` opens (a server that accepts connections and never answers)."""

    def __init__(self, name: str, gate: threading.Event, *calls: str) -> None:
        super().__init__(name)
        self.gate, self.hangs = gate, set(calls)

    def open(self, context: Any) -> None:
        self.opened += 1
        if "open" in self.hangs and self.opened == 1:
            self.gate.wait(30)

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        if "holds_batch" in self.hangs:
            self.gate.wait(30)
        return False

    def close(self) -> None:
        if "close" in self.hangs:
            self.gate.wait(30)
        self.closed += 1


def _in_thread(call: Any) -> tuple[threading.Thread, list[object]]:
    """Run ``call`` in a thread of its own; what it returned or raised is appended."""
    done: list[object] = []

    def run() -> None:
        try:
            done.append(call())
        except Exception as exc:
            done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_a_hung_first_open_of_a_timed_sink_starts_it_lagging(tmp_path: Path) -> None:
    """FanOut(...) waited for ever for a sink's open(); a timed sink now starts unopened
    after its write_timeout_s, as one that cannot be reached, and that open, once it
    returns, opens it (no second open() meanwhile)."""
    gate = threading.Event()
    slow = Hangs("slow", gate, "open")
    thread, done = _in_thread(lambda: _fan(tmp_path, slow, 0.3))
    try:
        thread.join(5)
        assert len(done) == 1 and isinstance(done[0], FanOut), done
        fan = done[0]
        _read_from(fan, {0: SchemaFrame([1])})
        fan.catchup.stop()  # the test drives the catch-up
        assert fan.unopened == ("slow",)
        assert list(fan.process(SchemaFrame([1]), BatchInfo("timed", 0, "q"))) == ["good"]
        lag = fan.lagging.lags()["slow"]
        assert lag.state == "lagging" and lag.error is not None
        assert lag.error.startswith(
            "SinkTimeoutError: sink 'slow': open() did not return within its write_timeout_s"
        )
        assert slow.opened == 1  # the first open still runs: not opened again
        held = fan.lagging.held("slow")
        assert isinstance(held, Reopening)
        gate.set()  # it returns: the sink is open, its batch written from the spool
        assert held.opening.done.wait(10)
        caught = fan.catch_up(timeout_s=10)["slow"]
        assert caught.state == "live", caught
        assert slow.opened == 1 and slow.calls == [(0, 1)]
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": 0}
        fan.close()
    finally:
        gate.set()


def test_a_timed_sink_that_cannot_answer_holds_batch_refuses_the_new_epoch(
    tmp_path: Path,
) -> None:
    """Asked at a new epoch's start whether it holds the batch after its mark, a hung
    sink held the start for ever; counted as "cannot tell" it would admit a start that may
    write the batch twice: it refuses the start after its write_timeout_s."""
    gate = threading.Event()
    slow = Hangs("slow", gate, "holds_batch")
    fan = _fan(tmp_path, slow, 0.3)
    fan.catchup.stop()
    try:
        fan.process(SchemaFrame([1]), BatchInfo("timed", 0, "old"))
        thread, done = _in_thread(lambda: fan._refuse_unmarked(BatchInfo("timed", 1, "new")))
        thread.join(5)
        assert len(done) == 1 and isinstance(done[0], SinkTimeoutError), done
        assert str(done[0]) == (
            "sink 'slow', batch 1: cannot tell within its write_timeout_s=0.3 s whether it "
            "holds batch 1 of epoch 0 (written but never marked: its holds_batch() did not "
            "return): epoch 1 does not start, since it could write that batch to the sink a "
            "second time. Find what holds the sink's target (a stalled connection, a server "
            "that does not answer) and restart the query, or raise write_timeout_s"
        )
        gate.set()  # it answers: the start passes
        fan._refuse_unmarked(BatchInfo("timed", 1, "new"))
    finally:
        gate.set()
        fan.close()


def test_a_hung_close_of_a_timed_sink_is_bounded_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()
    slow = Hangs("slow", gate, "close")
    fan = _fan(tmp_path, slow, 0.3)
    try:
        with caplog.at_level(logging.WARNING, logger="fanout"):
            thread, done = _in_thread(fan.close)
            thread.join(5)
        assert done == [None]
        said = [r.getMessage() for r in caplog.records if "close()" in r.getMessage()]
        assert said == [
            "pipeline timed: sink 'slow': close() did not return within its "
            "write_timeout_s=0.3 s; left running, not waited for (find what holds the "
            "sink's target)"
        ]
        assert slow.closed == 0
        gate.set()
        deadline = time.monotonic() + 10
        while slow.closed == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert slow.closed == 1
    finally:
        gate.set()


def test_a_write_ended_before_it_is_given_up_keeps_its_own_outcome() -> None:
    """A catch-up write that failed (never marking) was still given up when a max_lag
    drain or the stop asked after it ended (or the watch's deadline came as it ended): its
    failure became a SinkTimeoutError, recorded again as timed out, and an abandoned write
    that had already ended was kept."""
    from types import SimpleNamespace

    from fanout.steps.timeout import AbandonedWrites, TimedWrite

    failed = SinkWriteError("refused", sink="pg")
    reported: list[Exception] = []

    class Runner:
        sink = SimpleNamespace(name="pg")
        batch = SimpleNamespace(
            pipeline="p", batch_id=4, info=SimpleNamespace(epoch=0), df=None, _arrow=None
        )
        claim: WriteClaim | None = None
        attempt = 1

        def run(self) -> Any:
            return failed

        def timed_out(self, error: Exception) -> None:
            reported.append(error)

    abandoned = AbandonedWrites("p")
    timed = TimedWrite.start(Runner(), 30.0, abandoned, lambda fn: fn)  # type: ignore[arg-type]
    assert timed.done.wait(5)
    assert timed.give_up(reason="draining") is None
    assert timed.outcome() is failed
    assert reported == []
    assert abandoned._writes == {}
