"""Who owns a Sink: a ``FanOut(...)`` that fails closes what it opened, a ``FanOut`` closes
each sink it opened exactly once, and one Sink object serves one live ``FanOut``
(docs/architecture.md §8, the sink's lifecycle)."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError, FanOut, SinkUnreachableError
from fanout.contract.batch import BatchInfo
from fanout.ledger.entry import now_utc
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.lag_state import Reopening, SinkState
from tests.unit.fakes import SchemaFrame, ScriptedSink, rehook

WAIT_S = 30.0
"""The bound of every wait for another thread (never reached when the test passes)."""


class Counted(ScriptedSink):
    """A sink counting its opens and closes, ``closes`` set at each close."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.closes = threading.Event()

    def close(self) -> None:
        super().close()
        self.closes.set()


class Refuses(Counted):
    """A sink whose ``open()`` raises ``error``."""

    def __init__(self, name: str, error: Exception) -> None:
        super().__init__(name)
        self.error = error

    def open(self, context: Any) -> None:
        super().open(context)
        raise self.error


class Unreachable(Counted):
    """A sink whose target cannot be reached until ``reachable`` is set."""

    reachable = False

    def open(self, context: Any) -> None:
        if not self.reachable:
            raise SinkUnreachableError("connection refused", sink=self.name)
        super().open(context)


def _lags(sink: ScriptedSink, **options: Any) -> SinkSpec:
    return SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag", **options}))


# -- a FanOut(...) that fails releases what it acquired ------------------------------


def test_a_sink_failing_to_open_closes_those_opened_before_it_and_its_error_is_raised_unchanged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first two sinks were opened; the third's open raises: both are closed once,
    the last opened first; the failing one, never opened, is not closed; its error is
    raised as it was (the very object). A close failing meanwhile is logged, naming the
    sink, and does not replace it."""
    order: list[str] = []

    class Ordered(Counted):
        def close(self) -> None:
            order.append(self.name)
            super().close()
            if self.name == "b":
                raise OSError("disk gone")

    original = ConfigurationError("sink 'c': option 'url' is required")
    a, b, c = Ordered("a"), Ordered("b"), Refuses("c", original)
    with pytest.raises(ConfigurationError) as raised:
        FanOut("orders", MemoryLedger(), [a, b, c])
    assert raised.value is original
    assert (a.opened, a.closed, b.opened, b.closed, c.opened, c.closed) == (1, 1, 1, 1, 1, 0)
    assert order == ["b", "a"]
    failed = [
        r for r in caplog.records if r.getMessage() == "pipeline orders: closing sink 'b' failed"
    ]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert str(failed[0].exc_info[1]) == "disk gone"


def test_an_open_raising_a_plain_error_is_still_reported_as_before_once_the_others_are_closed() -> (
    None
):
    """The ``ConfigurationError`` naming the sink, chained from the open's own error, as
    a start without cleanup raised it."""
    boom = RuntimeError("no route to host")
    a, c = Counted("a"), Refuses("c", boom)
    with pytest.raises(ConfigurationError) as raised:
        FanOut("orders", MemoryLedger(), [a, c])
    assert str(raised.value) == (
        "sink 'c': cannot open: RuntimeError: no route to host (raised by Refuses.open(): "
        "check the sink's options, which `fanout plugins --options TYPE` lists, and its target)"
    )
    assert raised.value.__cause__ is boom
    assert (a.opened, a.closed) == (1, 1)


def test_a_refusal_after_every_sink_opened_closes_each_once_backfill_from(tmp_path: Path) -> None:
    """``backfill_from`` naming no sink is refused once every sink is open (before the lag
    state is built): each opened sink is closed once; the unopened lag sink is not."""
    a, down = Counted("a"), Unreachable("down")
    with pytest.raises(ConfigurationError, match="backfill_from='nope' must name another sink"):
        FanOut(
            "orders", MemoryLedger(), [a, _lags(down), _lags(Counted("b"), backfill_from="nope")],
            spool=str(tmp_path / "spool"), probe_interval_s=3600,
        )  # fmt: skip
    assert (a.opened, a.closed, down.opened, down.closed) == (1, 1, 0, 0)


def test_a_refusal_by_the_spool_closes_each_opened_sink_once_and_frees_them(
    tmp_path: Path,
) -> None:
    """The spool holds a batch sink M still needs, and M no longer lags: refused at the
    spool's check, after the lag state and the catch-up were built and the spool opened.
    Each sink opened is closed once, and may serve the next FanOut."""
    ledger, path = MemoryLedger(), str(tmp_path / "spool")
    with FanOut("pipe", ledger, [_lags(ScriptedSink("L"))], spool=path,
                probe_interval_s=3600) as before:  # fmt: skip
        assert before.spool is not None
        before.spool.add(SchemaFrame([1]), BatchInfo("pipe", 1, "q1"), {"M"}, now_utc())
    lagging, m = Counted("L"), Counted("M")
    with pytest.raises(ConfigurationError, match="sink 'M' still needs batches from the spool"):
        FanOut("pipe", ledger, [_lags(lagging), m], spool=path, probe_interval_s=3600)
    assert (lagging.opened, lagging.closed, m.opened, m.closed) == (1, 1, 1, 1)
    FanOut("pipe", ledger, [_lags(lagging)], spool=path, probe_interval_s=3600).close()
    assert (lagging.opened, lagging.closed) == (2, 2)


def test_a_first_open_still_running_when_the_start_fails_is_closed_once_it_returns(
    tmp_path: Path,
) -> None:
    """The first sink's open is past its ``write_timeout_s`` (still running, the pipeline
    would start without it) when a later sink's open fails: once that open returns, the
    sink is closed, by the thread that waited for it."""
    release = threading.Event()

    class Slow(Counted):
        def open(self, context: Any) -> None:
            assert release.wait(WAIT_S)
            super().open(context)

    slow = Slow("slow")
    try:
        with pytest.raises(ConfigurationError, match="option 'url' is required"):
            FanOut(
                "orders", MemoryLedger(),
                [_lags(slow, write_timeout_s=0.05),
                 Refuses("c", ConfigurationError("option 'url' is required"))],
                spool=str(tmp_path / "spool"),
            )  # fmt: skip
        assert (slow.opened, slow.closed) == (0, 0)  # still in its open()
    finally:
        release.set()
    assert slow.closes.wait(WAIT_S)
    assert (slow.opened, slow.closed) == (1, 1)


@pytest.mark.parametrize("catch_up_stops", [True, False], ids=["stops", "stop-raises"])
def test_a_first_open_still_running_at_a_refusal_by_the_spool_is_closed_once_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, catch_up_stops: bool
) -> None:
    """As above, the refusal coming after the running open was handed to the lag state
    (the spool's check): the reopen's thread closes the sink once its open returns; the
    sinks opened are closed once. Also when stopping the catch-up raises (which skipped
    telling the reopen's thread to close, and the sink stayed open)."""
    ledger, path = MemoryLedger(), str(tmp_path / "spool")
    with FanOut("pipe", ledger, [_lags(ScriptedSink("L"))], spool=path,
                probe_interval_s=3600) as before:  # fmt: skip
        assert before.spool is not None
        before.spool.add(SchemaFrame([1]), BatchInfo("pipe", 1, "q1"), {"M"}, now_utc())
    release = threading.Event()

    class Slow(Counted):
        def open(self, context: Any) -> None:
            assert release.wait(WAIT_S)
            super().open(context)

    def stop(self: Any) -> None:
        raise RuntimeError("catch-up thread wedged")

    if not catch_up_stops:
        monkeypatch.setattr("fanout.steps.catchup.CatchUp.stop", stop)
    slow, m = Slow("L"), Counted("M")
    try:
        with pytest.raises(ConfigurationError, match="sink 'M' still needs batches"):
            FanOut("pipe", ledger, [_lags(slow, write_timeout_s=0.05), m], spool=path,
                   probe_interval_s=3600)  # fmt: skip
        assert (slow.opened, slow.closed, m.opened, m.closed) == (0, 0, 1, 1)
    finally:
        release.set()
    assert slow.closes.wait(WAIT_S)
    assert (slow.opened, slow.closed) == (1, 1)


def test_a_first_open_that_returned_before_the_start_failed_is_closed_with_the_others(
    tmp_path: Path,
) -> None:
    """The open past its ``write_timeout_s`` returned, and its reopen's thread moved the
    sink to open, before the start failed (here its end, called as the constructor calls
    it when what follows the lag state refuses): it is closed once, first (opened last)."""
    release, order = threading.Event(), []

    class Ordered(Counted):
        def close(self) -> None:
            order.append(self.name)
            super().close()

    class Slow(Ordered):
        def open(self, context: Any) -> None:
            assert release.wait(WAIT_S)
            super().open(context)

    a, slow, b = Ordered("a"), Slow("slow"), Ordered("b")
    fan = FanOut("orders", MemoryLedger(), [a, _lags(slow, write_timeout_s=0.05), b],
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    held = fan.lagging.held("slow")
    assert isinstance(held, Reopening)
    release.set()
    assert held.opening.done.wait(WAIT_S)
    assert fan.lagging.held("slow").state is SinkState.OPEN
    fan._release_start()
    assert order == ["slow", "b", "a"]
    assert [(s.opened, s.closed) for s in (a, slow, b)] == [(1, 1)] * 3
    fan.close()  # closed already: nothing more
    assert [(s.opened, s.closed) for s in (a, slow, b)] == [(1, 1)] * 3


# -- a FanOut closes each sink it opened, once -------------------------------------


def test_close_twice_closes_each_sink_once() -> None:
    a, b = Counted("a"), Counted("b")
    with FanOut("orders", MemoryLedger(), [a, b]) as fan:
        fan.close()
    fan.close()
    assert (a.opened, a.closed, b.opened, b.closed) == (1, 1, 1, 1)


def test_a_lag_sink_never_opened_is_not_closed(tmp_path: Path) -> None:
    down = Unreachable("down")
    fan = FanOut("orders", MemoryLedger(), [Counted("a"), _lags(down)],
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    assert fan.unopened == ("down",)
    fan.close()
    assert (down.opened, down.closed) == (0, 0)


def test_a_sink_its_reopen_closed_after_a_failed_check_is_not_closed_again(
    tmp_path: Path,
) -> None:
    """The reopen opened the sink, its lost-target check raised: the reopen's thread
    closed it. ``FanOut.close()`` then does not close it a second time."""
    down = Unreachable("down")
    fan = FanOut("orders", MemoryLedger(), [Counted("a"), _lags(down)],
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()

    def unreadable(sink: str) -> Any:
        raise OSError("the ledger cannot be read")

    rehook(fan.lagging, ask_target=unreadable)
    down.reachable = True
    try:
        fan.lagging.reopen("down", wait=False)
        held = fan.lagging.held("down")
        if isinstance(held, Reopening):
            assert held.opening.done.wait(WAIT_S)
        assert fan.lagging.held("down").state is SinkState.UNOPENED
        assert (down.opened, down.closed) == (1, 1)
    finally:
        fan.close()
    assert (down.opened, down.closed) == (1, 1)


# -- one Sink object, one live FanOut ----------------------------------------------


def test_a_sink_open_in_a_live_fanout_is_refused_by_another_until_that_one_closes() -> None:
    shared, own = Counted("a"), Counted("b")
    first = FanOut("orders", MemoryLedger(), [shared])
    with pytest.raises(ConfigurationError) as refused:
        FanOut("billing", MemoryLedger(), [own, shared])
    assert str(refused.value) == (
        "pipeline 'billing': sink 'a' (Counted object) is open in another FanOut (pipeline "
        "'orders') that has not been closed: one Sink object serves one FanOut at a time "
        "(opened again here, what the other one writes with would be replaced under it). "
        "Close the other FanOut first (fo.close(), or build it in a `with FanOut(...) as "
        "fo:` block), or give this FanOut a sink of its own (a dict configuration, or a new "
        "Sink object)"
    )
    # refused before anything was opened: the first FanOut's sink untouched
    assert (shared.opened, shared.closed, own.opened, own.closed) == (1, 0, 0, 0)
    first.close()
    with FanOut("billing", MemoryLedger(), [own, shared]):
        assert (shared.opened, shared.closed) == (2, 1)
    assert (shared.opened, shared.closed) == (2, 2)


def test_a_garbage_collected_fanout_holds_its_sinks_no_more(tmp_path: Path) -> None:
    """Also a pipeline with a lag sink, whose catch-up refers back to its FanOut (a
    reference cycle: collected by ``gc``, not by reference counting)."""
    shared, lagging = Counted("a"), Counted("l")
    first = FanOut("orders", MemoryLedger(), [shared, _lags(lagging)],
                   spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    with pytest.raises(ConfigurationError, match="pipeline 'orders'\\) that has not been closed"):
        FanOut("orders", MemoryLedger(), [_lags(lagging)], spool=str(tmp_path / "spool"))
    del first
    gc.collect()
    with FanOut("orders", MemoryLedger(), [shared, _lags(lagging)],
                spool=str(tmp_path / "spool"), probe_interval_s=3600):  # fmt: skip
        assert (shared.opened, lagging.opened) == (2, 2)


def test_a_fanout_that_failed_to_start_holds_its_sinks_no_more() -> None:
    """Its error (and so the failed FanOut, in its traceback) may be kept, a notebook's
    last error: its sinks, closed, may serve the next FanOut."""
    a = Counted("a")
    with pytest.raises(ConfigurationError) as kept:
        FanOut("orders", MemoryLedger(), [a, Refuses("c", ConfigurationError("bad"))])
    with FanOut("orders", MemoryLedger(), [a]):
        assert (a.opened, a.closed) == (2, 1)
    assert kept.value is not None


class SlowOnce(Counted):
    """A sink whose first ``open()`` waits for ``release``; later ones return at once."""

    def __init__(self, name: str, release: threading.Event) -> None:
        super().__init__(name)
        self.release = release
        self.entered = 0

    def open(self, context: Any) -> None:
        self.entered += 1
        if self.entered == 1:
            assert self.release.wait(WAIT_S)
        super().open(context)


def test_a_sink_whose_open_still_runs_at_close_is_refused_until_its_thread_closed_it(
    tmp_path: Path,
) -> None:
    """The thread of an ``open()`` still running when the FanOut closes owns the sink
    until it has closed it: released at ``close()``, another FanOut would open it again
    under that thread, whose close once the open returns would close it under the other."""
    release = threading.Event()
    slow = SlowOnce("slow", release)
    first = FanOut("orders", MemoryLedger(), [_lags(slow, write_timeout_s=0.05)],
                   spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    held = first.lagging.held("slow")
    assert isinstance(held, Reopening)
    try:
        first.close()
        with pytest.raises(ConfigurationError) as refused:
            FanOut("billing", MemoryLedger(), [_lags(slow)], spool=str(tmp_path / "spool2"))
        assert str(refused.value) == (
            "pipeline 'billing': sink 'slow' (SlowOnce object) is still held by a FanOut "
            "(pipeline 'orders') that was closed, or failed to start, while the sink's open() "
            "ran on past its write_timeout_s: that open's thread closes the sink once it "
            "returns, which opened again here would close it under this FanOut. Wait for that "
            "open() to return (find what holds the sink's target), or give this FanOut a sink "
            "of its own (a dict configuration, or a new Sink object)"
        )
        assert (slow.entered, slow.opened, slow.closed) == (1, 0, 0)  # the first still runs
    finally:
        release.set()
    assert held.opening.done.wait(WAIT_S)  # the thread closed the sink, then released it
    assert (slow.opened, slow.closed) == (1, 1)
    assert first.lagging.held("slow").state is SinkState.UNOPENED
    with FanOut("billing", MemoryLedger(), [_lags(slow)], spool=str(tmp_path / "spool2"),
                probe_interval_s=3600):  # fmt: skip
        assert (slow.opened, slow.closed) == (2, 1)
    assert (slow.opened, slow.closed) == (2, 2)


def test_a_sink_whose_open_still_runs_when_the_start_fails_is_refused_until_closed(
    tmp_path: Path,
) -> None:
    """As above, the FanOut failing to start (a later sink's open refused)."""
    release = threading.Event()
    slow = SlowOnce("slow", release)
    try:
        with pytest.raises(ConfigurationError, match="option 'url' is required"):
            FanOut("orders", MemoryLedger(),
                   [_lags(slow, write_timeout_s=0.05),
                    Refuses("c", ConfigurationError("option 'url' is required"))],
                   spool=str(tmp_path / "spool"))  # fmt: skip
        (thread,) = [t for t in threading.enumerate() if t.name == "fanout-orders-slow-reopen"]
        gc.collect()  # the failed FanOut, dropped: its thread still holds the sink
        with pytest.raises(ConfigurationError, match="still held by a FanOut \\(pipeline 'orders'"):
            FanOut("billing", MemoryLedger(), [_lags(slow)], spool=str(tmp_path / "spool2"))
        assert (slow.entered, slow.opened, slow.closed) == (1, 0, 0)
    finally:
        release.set()
    thread.join(WAIT_S)  # it closed the sink, then released it
    assert not thread.is_alive()
    assert (slow.opened, slow.closed) == (1, 1)
    with FanOut("billing", MemoryLedger(), [_lags(slow)], spool=str(tmp_path / "spool2"),
                probe_interval_s=3600):  # fmt: skip
        assert (slow.opened, slow.closed) == (2, 1)
    assert (slow.opened, slow.closed) == (2, 2)


class HeldWrite(Counted):
    """A sink whose first write waits until ``go`` is set."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.go, self.writing = threading.Event(), threading.Event()

    def write(self, batch: Any) -> Any:
        if not self.writing.is_set():
            self.writing.set()
            assert self.go.wait(WAIT_S)
        return super().write(batch)


def test_a_sink_whose_abandoned_write_runs_at_close_stays_owned_until_it_ends_then_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write abandoned at its ``write_timeout_s`` and still running when the FanOut
    closes keeps its sink open: released then, another FanOut would open the object again
    under the running write (replacing what it writes with); and once it ended nothing
    closed the sink. Now refused until the write ends, which closes the sink and frees it."""
    monkeypatch.setattr("fanout.dispatch.closing.CLOSE_WAIT_S", 0.2)
    slow = HeldWrite("slow")
    first = FanOut("orders", MemoryLedger(), [Counted("good"), _lags(slow, write_timeout_s=0.2)],
                   backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        first.process(SchemaFrame([1]), BatchInfo("orders", 0, "q"))
        assert slow.writing.is_set()
        first.close()
        assert (slow.opened, slow.closed) == (1, 0)  # left open under its write
        with pytest.raises(ConfigurationError) as refused:
            FanOut("billing", MemoryLedger(), [_lags(slow)], spool=str(tmp_path / "spool2"))
        assert str(refused.value) == (
            "pipeline 'billing': sink 'slow' (HeldWrite object) is still held by a FanOut "
            "(pipeline 'orders') that was closed, or failed to start, while a write of the "
            "sink, abandoned at its write_timeout_s, was still running: the sink was left "
            "open under it, and opened again here, what that write uses would be replaced "
            "under it. Wait for that write to end (find what holds the sink's target), or "
            "give this FanOut a sink of its own (a dict configuration, or a new Sink object)"
        )
        assert (slow.opened, slow.closed) == (1, 0)
        (waiter,) = [t for t in threading.enumerate()
                     if t.name == "fanout-orders-slow-close-after-write"]  # fmt: skip
    finally:
        slow.go.set()
    waiter.join(WAIT_S)  # the write ended: its sink closed, then released
    assert not waiter.is_alive()
    assert (slow.opened, slow.closed) == (1, 1)
    with FanOut("billing", MemoryLedger(), [_lags(slow)], spool=str(tmp_path / "spool2"),
                probe_interval_s=3600):  # fmt: skip
        assert (slow.opened, slow.closed) == (2, 1)
    assert (slow.opened, slow.closed) == (2, 2)
