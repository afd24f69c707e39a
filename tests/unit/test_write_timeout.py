"""``write_timeout_s``: only a lag sink takes it; a write that does not return in time is
abandoned, the batch goes on, the sink lags; the abandoned write never marks, the catch-up
waits for it, and ``close()`` does not wait for it for ever (fakes, a memory ledger and a
real spool)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError, FanOut, SinkTimeoutError, SinkWriteError, hookimpl
from fanout.contract.batch import Batch, BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import LagPolicy, SinkSpec, lag_policy
from fanout.steps.timeout import WriteClaim
from tests.unit.fakes import SchemaFrame, ScriptedSink


def test_a_lag_sink_takes_a_write_timeout() -> None:
    options = {"on_failure": "lag", "write_timeout_s": 2}
    assert lag_policy("s", options) == LagPolicy("lag", write_timeout_s=2.0)


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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused with the entry's path when the file is read, before a Spark session starts
    (as a sink option of the wrong type is), by `fanout validate` and `fanout run` alike."""
    import fanout.hooks.registry as registry_module
    from fanout.app import runner
    from fanout.app.cli import main
    from tests.unit.test_validate_read_only import _Plugin

    load = registry_module.load_registry

    def with_test_sinks(extra: Any = (), **kwargs: Any) -> Any:
        return load([_Plugin(), *extra], **kwargs)

    monkeypatch.setattr(registry_module, "load_registry", with_test_sinks)
    monkeypatch.setattr(runner, "load_registry", with_test_sinks)
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

    fan.catchup._read = read  # type: ignore[method-assign]


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
    fan = _fan(tmp_path, slow, 0.3)
    _read_from(fan, {0: SchemaFrame([1, 2])})
    fan.catchup.stop()  # the test drives the catch-up
    try:
        fan.process(SchemaFrame([1, 2]), BatchInfo("timed", 0, "q"))  # fails at once: lags
        slow.always_fail, slow.on_write = None, lambda batch: time.sleep(0.45)  # back, slow
        assert fan.catch_up(timeout_s=10)["slow"].state == "lagging"  # 0.3 s: abandoned
        lags = fan.catch_up(timeout_s=10)  # waits for that write to end, then 0.6 s: written
        assert [lags["slow"].state, slow.calls] == ["live", [(0, 1), (0, 1), (0, 1)]]
        assert fan.ledger.last_committed("timed", ["slow"]) == {"slow": 0}
        errors = [e.error for e in fan.ledger.entries if e.status == "failed"]  # type: ignore[attr-defined]
        assert len(errors) == 2 and errors[1] is not None
        assert errors[1].startswith(
            "SinkTimeoutError: sink 'slow', batch 0: write did not return within its "
            "write_timeout_s=0.3 s (all attempts together; now at attempt 1)"
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
    monkeypatch.setattr("fanout.fan_out.CLOSE_WAIT_S", 0.2)
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
        fan.close()
