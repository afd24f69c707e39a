"""``FanOut``: plan, persist, parallel writes, retries, hooks, failures, the ledger marks.

Sinks are in-memory recording fakes, the ledger is ``MemoryLedger`` (or a ``DeltaLedger``
on a temp dir where the rows matter), the batch a ``FakeFrame``; no Spark anywhere.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

import fanout
from fanout import BatchInfo, FanOut, SinkResult
from fanout.errors import (
    BatchFailedError,
    ConfigurationError,
    LedgerError,
    SinkWriteError,
    TransientSinkError,
)
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, entries_from_arrow
from fanout.ledger.memory import MemoryLedger
from tests.unit.fakes import ConcurrencyProbe, FakeFrame, ScriptedSink, committed, same_error

PIPELINE = "orders"


def make_fan(ledger: Any, sinks: Sequence[Any], **kw: Any) -> FanOut:
    kw.setdefault("backoff_s", 0)
    return FanOut(PIPELINE, ledger, sinks, **kw)


def info(batch_id: int, query_id: str = "q-1", offsets: list[Any] | None = None) -> BatchInfo:
    return BatchInfo(PIPELINE, batch_id, query_id, offsets)


class Recorder:
    """An observer plugin recording every lifecycle hook, and whether the sink's mark
    exists when each sink hook runs."""

    def __init__(self, ledger: MemoryLedger) -> None:
        self.ledger = ledger
        self.events: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def _add(self, *event: Any) -> None:
        with self._lock:
            self.events.append(event)

    def _mark(self, sink: str) -> int | None:
        return self.ledger.last_committed(PIPELINE, [sink])[sink]

    @fanout.hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        self._add("batch_start", info.batch_id, list(pending), list(skipped))

    @fanout.hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        self._add("sink_start", sink, attempt, self._mark(sink))

    @fanout.hookimpl
    def fanout_sink_error(
        self, info: BatchInfo, sink: str, error: BaseException, attempt: int, will_retry: bool
    ) -> None:
        self._add("sink_error", sink, attempt, will_retry, str(error))

    @fanout.hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        assert duration_s >= 0
        self._add("sink_done", sink, result, self._mark(sink))

    @fanout.hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        self._add("batch_end", info.batch_id, dict(results), self._mark("a"))

    @fanout.hookimpl
    def fanout_batch_failed(
        self,
        info: BatchInfo,
        failures: Mapping[str, BaseException],
        results: Mapping[str, SinkResult],
    ) -> None:
        self._add("batch_failed", info.batch_id, sorted(failures), dict(results))


class Broken:
    """An observer whose every hook raises."""

    @fanout.hookimpl
    def fanout_batch_start(self, info: BatchInfo) -> None:
        raise RuntimeError("observer down")

    @fanout.hookimpl
    def fanout_sink_done(self, sink: str) -> None:
        raise RuntimeError("observer down")

    @fanout.hookimpl
    def fanout_batch_end(self, info: BatchInfo) -> None:
        raise RuntimeError("observer down")


# -- plan: partial replay ---------------------------------------------------------------


def test_plan_skips_marked_sinks(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    a, b, c = ScriptedSink("a"), ScriptedSink("b"), ScriptedSink("c")
    memory_ledger.mark_committed(committed(PIPELINE, "a", 3))
    memory_ledger.mark_committed(committed(PIPELINE, "c", 2))  # older mark: still pending
    recorder = Recorder(memory_ledger)
    fan = make_fan(memory_ledger, [a, b, c], plugins=[recorder])

    assert fan.plan(info(3)) == (["b", "c"], ["a"])
    results = fan.process(frame, info(3))

    assert a.calls == []
    assert b.calls == [(3, 1)]
    assert c.calls == [(3, 1)]
    assert results == {"b": SinkResult(rows=3), "c": SinkResult(rows=3)}
    assert memory_ledger.last_committed(PIPELINE, ["a", "b", "c"]) == {"a": 3, "b": 3, "c": 3}
    assert recorder.events[0] == ("batch_start", 3, ["b", "c"], ["a"])

    # the same batch again: everyone is marked, nobody is called, batch_start still says so
    recorder.events.clear()
    assert fan.process(frame, info(3)) == {}
    assert (a.calls, b.calls, c.calls) == ([], [(3, 1)], [(3, 1)])
    assert recorder.events == [
        ("batch_start", 3, [], ["a", "b", "c"]),
        ("batch_end", 3, {}, 3),
    ]
    assert frame.persist_calls == 1  # only the first call had two readers


def test_next_batch_writes_every_sink(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    a, b = ScriptedSink("a"), ScriptedSink("b")
    fan = make_fan(memory_ledger, [a, b])
    fan.process(frame, info(0))
    fan.process(frame, info(1))
    assert a.calls == [(0, 1), (1, 1)]
    assert b.calls == [(0, 1), (1, 1)]
    assert [
        (e.sink, e.batch_id, e.status)
        for e in sorted(memory_ledger.entries, key=lambda e: (e.batch_id, e.sink))
    ] == [
        ("*", 0, "epoch"),  # the first batch's query claims epoch 0
        ("a", 0, "committed"),
        ("b", 0, "committed"),
        ("a", 1, "committed"),
        ("b", 1, "committed"),
    ]


# -- failures ---------------------------------------------------------------------------


def test_every_failed_sink_is_named(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    ok = ScriptedSink("ok")
    bad_row = ValueError("bad row 7")
    disk = RuntimeError("disk full")
    b = ScriptedSink("b", always_fail=bad_row)
    c = ScriptedSink("c", always_fail=disk)
    fan = make_fan(memory_ledger, [ok, b, c])

    with pytest.raises(BatchFailedError) as raised:
        fan.process(frame, info(5))

    error = raised.value
    assert (error.pipeline, error.batch_id) == (PIPELINE, 5)
    assert sorted(error.failures) == ["b", "c"]
    assert isinstance(error.failures["b"], SinkWriteError)
    assert same_error(error.failures["b"].__cause__, bad_row)
    assert same_error(error.failures["c"].__cause__, disk)
    assert (error.failures["b"].sink, error.failures["b"].batch_id) == ("b", 5)
    assert str(error) == (
        "pipeline 'orders', batch 5: 2 sink(s) failed (b, c); ok committed the batch and will "
        "be skipped when the query restarts and Spark replays it:\n"
        "  - b: SinkWriteError: sink 'b', batch 5: ValueError: bad row 7\n"
        "  - c: SinkWriteError: sink 'c', batch 5: RuntimeError: disk full"
    )
    assert memory_ledger.last_committed(PIPELINE, ["ok", "b", "c"]) == {
        "ok": 5,
        "b": None,
        "c": None,
    }
    assert frame.unpersist_calls == frame.persist_calls == 1  # settled even on failure

    # the replay writes only the failed sinks
    b.always_fail = c.always_fail = None
    assert sorted(fan.process(frame, info(5))) == ["b", "c"]
    assert ok.calls == [(5, 1)]
    assert b.calls == [(5, 1), (5, 1)]


def test_the_failure_names_the_sinks_that_hold_the_batch(
    memory_ledger: MemoryLedger, frame: FakeFrame
) -> None:
    """Skipped sinks hold the batch as much as those written; when none does, the text
    says every one writes it on the replay (a single-sink pipeline has no "other sinks")."""
    ok, bad = ScriptedSink("ok"), ScriptedSink("bad", always_fail=RuntimeError("down"))
    with make_fan(memory_ledger, [ok, bad]) as fan, pytest.raises(BatchFailedError):
        fan.process(frame, info(5))
    with make_fan(memory_ledger, [ok, bad]) as fan:  # ok is skipped, bad fails again
        with pytest.raises(BatchFailedError) as replayed:
            fan.process(frame, info(5))
    assert replayed.value.committed == ["ok"]
    assert str(replayed.value).startswith(
        "pipeline 'orders', batch 5: 1 sink(s) failed (bad); ok committed the batch and will "
        "be skipped when the query restarts and Spark replays it:\n"
    )
    with pytest.raises(BatchFailedError) as alone:
        make_fan(memory_ledger, [bad]).process(frame, info(6))
    assert alone.value.committed == []
    assert str(alone.value) == (
        "pipeline 'orders', batch 6: 1 sink(s) failed (bad); no sink committed the batch: "
        "each one writes it when the query restarts and Spark replays it:\n"
        "  - bad: SinkWriteError: sink 'bad', batch 6: RuntimeError: down"
    )
    unknown = BatchFailedError("orders", 7, {"bad": RuntimeError("down")})
    assert str(unknown).startswith(
        "pipeline 'orders', batch 7: 1 sink(s) failed (bad); any other sink that committed "
        "the batch is skipped when the query restarts and Spark replays it:\n"
    )


def test_transient_errors_are_retried_then_fail(
    memory_ledger: MemoryLedger, frame: FakeFrame
) -> None:
    flaky = ScriptedSink(
        "flaky", always_fail=TransientSinkError("timeout", sink="flaky", batch_id=2)
    )
    fan = make_fan(memory_ledger, [flaky], retries=2)
    with pytest.raises(BatchFailedError) as raised:
        fan.process(frame, info(2))
    assert flaky.calls == [(2, 1), (2, 2), (2, 3)]
    assert str(raised.value.failures["flaky"]) == "sink 'flaky', batch 2: timeout"


def test_transient_error_then_success(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    flaky = ScriptedSink(
        "flaky",
        fail=[TransientSinkError("t1", sink="flaky"), TransientSinkError("t2", sink="flaky")],
    )
    fan = make_fan(memory_ledger, [flaky], retries=2)
    assert fan.process(frame, info(2)) == {"flaky": SinkResult(rows=3)}
    assert flaky.calls == [(2, 1), (2, 2), (2, 3)]
    assert memory_ledger.last_committed(PIPELINE, ["flaky"]) == {"flaky": 2}


def test_retries_zero_means_one_attempt(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    flaky = ScriptedSink("flaky", always_fail=TransientSinkError("timeout", sink="flaky"))
    with pytest.raises(BatchFailedError):
        make_fan(memory_ledger, [flaky], retries=0).process(frame, info(1))
    assert flaky.calls == [(1, 1)]


def test_non_transient_error_is_not_retried(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    sink = ScriptedSink("pg", always_fail=ValueError("null in key column 'id'"))
    with pytest.raises(BatchFailedError):
        make_fan(memory_ledger, [sink], retries=5).process(frame, info(1))
    assert sink.calls == [(1, 1)]


def test_is_transient_override_is_honoured(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    classified = ScriptedSink("classified", fail=[TimeoutError("slow")], transient=(TimeoutError,))
    default = ScriptedSink("default", fail=[TimeoutError("slow")])
    with pytest.raises(BatchFailedError) as raised:
        make_fan(memory_ledger, [classified, default], retries=3).process(frame, info(1))
    assert classified.calls == [(1, 1), (1, 2)]
    assert default.calls == [(1, 1)]
    assert sorted(raised.value.failures) == ["default"]
    assert memory_ledger.last_committed(PIPELINE, ["classified", "default"]) == {
        "classified": 1,
        "default": None,
    }


def test_is_transient_raising_counts_as_final(
    memory_ledger: MemoryLedger, frame: FakeFrame, caplog: pytest.LogCaptureFixture
) -> None:
    class Confused(ScriptedSink):
        def is_transient(self, error: BaseException) -> bool:
            raise KeyError("oops")

    sink = Confused("confused", always_fail=TransientSinkError("t", sink="confused"))
    with pytest.raises(BatchFailedError):
        make_fan(memory_ledger, [sink], retries=3).process(frame, info(1))
    assert sink.calls == [(1, 1)]
    assert "sink 'confused': is_transient() raised; treating the error as final" in caplog.text


def test_bad_return_type_fails_the_sink(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    bad = ScriptedSink("bad", returns="ok")
    boolean = ScriptedSink("boolean", returns=True)
    with pytest.raises(BatchFailedError) as raised:
        make_fan(memory_ledger, [bad, boolean], retries=3).process(frame, info(1))
    assert str(raised.value.failures["bad"]) == (
        "sink 'bad', batch 1: TypeError: sink 'bad': write() must return the number of rows "
        "written or a fanout.SinkResult, not 'ok'"
    )
    assert "not True" in str(raised.value.failures["boolean"])
    assert bad.calls == [(1, 1)]  # a TypeError is not transient
    assert memory_ledger.last_committed(PIPELINE, ["bad", "boolean"]) == {
        "bad": None,
        "boolean": None,
    }


def test_result_like_objects_are_accepted(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    class Written:
        rows = 9
        details = {"files": 2}

    sink = ScriptedSink("s", returns=Written())
    assert make_fan(memory_ledger, [sink]).process(frame, info(1)) == {
        "s": SinkResult(rows=9, details={"files": 2})
    }
    assert [(e.status, e.rows) for e in memory_ledger.entries] == [
        ("epoch", None),
        ("committed", 9),
    ]


def test_failed_ledger_mark_fails_the_sink(
    frame: FakeFrame, caplog: pytest.LogCaptureFixture
) -> None:
    class FlakyLedger(MemoryLedger):
        def mark_committed(self, entry: LedgerEntry) -> bool:
            if entry.sink == "b":
                raise OSError("ledger store unreachable")
            return super().mark_committed(entry)

    ledger = FlakyLedger()
    a, b = ScriptedSink("a"), ScriptedSink("b")
    with pytest.raises(BatchFailedError) as raised:
        make_fan(ledger, [a, b]).process(frame, info(4))
    assert sorted(raised.value.failures) == ["b"]
    assert isinstance(raised.value.failures["b"], LedgerError)
    assert str(raised.value.failures["b"]) == "ledger store unreachable"
    assert b.calls == [(4, 1)]  # written once; the mark is not retried as a write
    assert "sink b: written but the ledger mark failed (ledger store unreachable)" in caplog.text


def test_failed_attempts_are_recorded_with_attempt_numbers(
    memory_ledger: MemoryLedger, frame: FakeFrame
) -> None:
    flaky = ScriptedSink(
        "flaky",
        fail=[TransientSinkError("timeout", sink="flaky"), ConnectionError("reset")],
        transient=(TransientSinkError, ConnectionError),
    )
    offsets = [{"topic": {"0": 42}}, None]
    make_fan(memory_ledger, [flaky], retries=2).process(frame, info(6, "q-9", offsets))

    claim, *attempts = memory_ledger.entries
    assert (claim.status, claim.sink, claim.batch_id, claim.query_id) == ("epoch", "*", 6, "q-9")
    assert [(e.status, e.attempt, e.error, e.rows) for e in attempts] == [
        ("failed", 1, "TransientSinkError: sink 'flaky': timeout", None),
        ("failed", 2, "SinkWriteError: sink 'flaky', batch 6: ConnectionError: reset", None),
        ("committed", 3, None, 3),
    ]
    for entry in attempts:
        assert (entry.pipeline, entry.sink, entry.batch_id, entry.query_id) == (
            PIPELINE,
            "flaky",
            6,
            "q-9",
        )
        assert entry.source_offsets == '[{"topic": {"0": 42}}, null]'
        assert entry.started_at is not None and entry.finished_at >= entry.started_at


def test_failed_attempts_visible_in_delta_ledger(tmp_path: Path, frame: FakeFrame) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    a = ScriptedSink("a")
    b = ScriptedSink("b", always_fail=TransientSinkError("broker down", sink="b"))
    with pytest.raises(BatchFailedError):
        make_fan(ledger, [a, b], retries=1).process(frame, info(0))
    rows = sorted(entries_from_arrow(ledger.read(PIPELINE)), key=lambda e: (e.sink, e.attempt))
    assert [(e.sink, e.batch_id, e.status, e.attempt, e.error) for e in rows] == [
        ("*", 0, "epoch", 1, None),
        ("a", 0, "committed", 1, None),
        ("b", 0, "failed", 1, "TransientSinkError: sink 'b': broker down"),
        ("b", 0, "failed", 2, "TransientSinkError: sink 'b': broker down"),
    ]
    assert ledger.last_committed(PIPELINE, ["a", "b"]) == {"a": 0, "b": None}


# -- hooks ------------------------------------------------------------------------------


def test_hooks_in_documented_order(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    recorder = Recorder(memory_ledger)
    sink = ScriptedSink("a", fail=[TransientSinkError("t", sink="a")])
    fan = make_fan(memory_ledger, [sink], plugins=[recorder], retries=1)
    fan.process(frame, info(4))
    assert recorder.events == [
        ("batch_start", 4, ["a"], []),
        ("sink_start", "a", 1, None),
        ("sink_error", "a", 1, True, "sink 'a': t"),
        ("sink_start", "a", 2, None),
        ("sink_done", "a", SinkResult(rows=3), None),  # the mark is NOT there yet
        ("batch_end", 4, {"a": SinkResult(rows=3)}, 4),  # and it is by batch_end
    ]


def test_hooks_on_failure(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    recorder = Recorder(memory_ledger)
    sink = ScriptedSink("a", always_fail=ValueError("bad"))
    fan = make_fan(memory_ledger, [sink], plugins=[recorder], retries=1)
    with pytest.raises(BatchFailedError):
        fan.process(frame, info(4))
    assert recorder.events == [
        ("batch_start", 4, ["a"], []),
        ("sink_start", "a", 1, None),
        ("sink_error", "a", 1, False, "sink 'a', batch 4: ValueError: bad"),
        ("batch_failed", 4, ["a"], {}),
    ]


def test_hooks_with_parallel_sinks(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    recorder = Recorder(memory_ledger)
    ok, bad = ScriptedSink("a"), ScriptedSink("b", always_fail=ValueError("bad"))
    fan = make_fan(memory_ledger, [ok, bad], plugins=[recorder], retries=0)
    with pytest.raises(BatchFailedError):
        fan.process(frame, info(1))
    events = recorder.events
    assert events[0] == ("batch_start", 1, ["a", "b"], [])
    assert events[-1] == ("batch_failed", 1, ["b"], {"a": SinkResult(rows=3)})
    assert [e for e in events if e[1] == "a"] == [
        ("sink_start", "a", 1, None),
        ("sink_done", "a", SinkResult(rows=3), None),
    ]
    assert [e for e in events if e[1] == "b"] == [
        ("sink_start", "b", 1, None),
        ("sink_error", "b", 1, False, "sink 'b', batch 1: ValueError: bad"),
    ]
    assert len(events) == 6


class _GreenletExit(BaseException):
    """What gevent raises in a killed greenlet: a BaseException, not an Exception."""


@pytest.mark.parametrize(
    "stop", [KeyboardInterrupt("stop"), SystemExit(3), _GreenletExit("killed")], ids=repr
)
def test_a_sink_raising_an_interrupt_is_recorded_once_then_raised_unchanged(
    memory_ledger: MemoryLedger,
    frame: FakeFrame,
    stop: BaseException,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Recorded as the attempt's failure (ledger row, log line, hooks), never retried even
    when ``is_transient`` says so, and raised on as raised: Spark, or the user pressing
    Ctrl-C, gets the interrupt, not a BatchFailedError."""
    recorder = Recorder(memory_ledger)
    sink = ScriptedSink("a", always_fail=stop, transient=(BaseException,))
    fan = make_fan(memory_ledger, [sink], plugins=[recorder], retries=3)
    with caplog.at_level(logging.WARNING, "fanout"), pytest.raises(type(stop)) as raised:
        fan.process(frame, info(4))

    assert same_error(raised.value, stop)
    said = f"sink 'a', batch 4: {type(stop).__name__}: {stop}"
    assert sink.calls == [(4, 1)]
    assert [(e.status, e.sink, e.attempt, e.error) for e in memory_ledger.entries] == [
        ("epoch", "*", 1, None),
        ("failed", "a", 1, f"SinkWriteError: {said}"),
    ]
    assert recorder.events == [
        ("batch_start", 4, ["a"], []),
        ("sink_start", "a", 1, None),
        ("sink_error", "a", 1, False, said),
        ("batch_failed", 4, ["a"], {}),
    ]
    assert [r.getMessage() for r in caplog.records if r.name == "fanout"] == [
        f"pipeline orders, batch 4, sink a: attempt 1 failed: {said}"
    ]


def test_an_interrupted_sink_leaves_the_others_written_and_marked(
    memory_ledger: MemoryLedger, frame: FakeFrame
) -> None:
    recorder = Recorder(memory_ledger)
    stop = KeyboardInterrupt()
    ok, bad = ScriptedSink("a"), ScriptedSink("b", always_fail=stop)
    fan = make_fan(memory_ledger, [ok, bad], plugins=[recorder], retries=2)
    with pytest.raises(KeyboardInterrupt) as raised:
        fan.process(frame, info(1))

    assert same_error(raised.value, stop)
    assert (ok.calls, bad.calls) == ([(1, 1)], [(1, 1)])
    assert memory_ledger.last_committed(PIPELINE, ["a", "b"]) == {"a": 1, "b": None}
    assert [
        (e.sink, e.attempt, e.error) for e in memory_ledger.entries if e.status == "failed"
    ] == [("b", 1, "SinkWriteError: sink 'b', batch 1: KeyboardInterrupt: ")]
    assert recorder.events[-1] == ("batch_failed", 1, ["b"], {"a": SinkResult(rows=3)})
    assert ("sink_error", "b", 1, False, "sink 'b', batch 1: KeyboardInterrupt: ") in (
        recorder.events
    )
    bad.always_fail = None
    fan.process(frame, info(1))  # the replay writes only the sink that was interrupted
    assert (ok.calls, bad.calls) == ([(1, 1)], [(1, 1), (1, 1)])


def test_raising_observer_does_not_fail_the_batch(
    memory_ledger: MemoryLedger, frame: FakeFrame, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken()
    recorder = Recorder(memory_ledger)
    sink = ScriptedSink("a")
    fan = make_fan(memory_ledger, [sink], plugins=[broken, recorder])
    assert fan.process(frame, info(2)) == {"a": SinkResult(rows=3)}
    assert memory_ledger.last_committed(PIPELINE, ["a"]) == {"a": 2}
    assert [e[0] for e in recorder.events] == [
        "batch_start",
        "sink_start",
        "sink_done",
        "batch_end",
    ]
    name = f"Broken@{id(broken):x}"
    for hook in ("fanout_batch_start", "fanout_sink_done", "fanout_batch_end"):
        assert f"plugin {name!r} failed in hook {hook}; ignored" in caplog.text
    assert caplog.text.count("RuntimeError: observer down") == 3


# -- persist and the shared Arrow conversion --------------------------------------------


def test_persist_once_for_several_dataframe_readers(
    memory_ledger: MemoryLedger, frame: FakeFrame
) -> None:
    make_fan(memory_ledger, [ScriptedSink("a"), ScriptedSink("b"), ScriptedSink("c")]).process(
        frame, info(0)
    )
    assert (frame.persist_calls, frame.unpersist_calls) == (1, 1)


def test_no_persist_for_a_single_sink(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    make_fan(memory_ledger, [ScriptedSink("a")]).process(frame, info(0))
    assert (frame.persist_calls, frame.unpersist_calls) == (0, 0)


def test_no_persist_when_one_sink_is_pending(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    memory_ledger.mark_committed(committed(PIPELINE, "a", 0))
    make_fan(memory_ledger, [ScriptedSink("a"), ScriptedSink("b")]).process(frame, info(0))
    assert (frame.persist_calls, frame.unpersist_calls) == (0, 0)


def test_arrow_readers_share_one_conversion(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    sinks = [ScriptedSink(n, reads="arrow") for n in ("x", "y", "z")]
    results = make_fan(memory_ledger, sinks).process(frame, info(0))
    assert results == {n: SinkResult(rows=3) for n in ("x", "y", "z")}
    assert frame.to_arrow_calls == 1
    assert (frame.persist_calls, frame.unpersist_calls) == (0, 0)
    assert all(s.arrow_tables == [frame.table] for s in sinks)
    assert sinks[0].arrow_tables[0] is sinks[1].arrow_tables[0] is sinks[2].arrow_tables[0]


def test_arrow_and_dataframe_readers_persist(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    sinks = [
        ScriptedSink("x", reads="arrow"),
        ScriptedSink("y", reads="arrow"),
        ScriptedSink("df"),
    ]
    make_fan(memory_ledger, sinks).process(frame, info(0))
    assert (frame.persist_calls, frame.unpersist_calls, frame.to_arrow_calls) == (1, 1, 1)


def test_each_batch_converts_anew(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    fan = make_fan(
        memory_ledger, [ScriptedSink("x", reads="arrow"), ScriptedSink("y", reads="arrow")]
    )
    fan.process(frame, info(0))
    fan.process(frame, info(1))
    assert frame.to_arrow_calls == 2


# -- parallelism ------------------------------------------------------------------------


def test_parallelism_bound_is_respected(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    probe = ConcurrencyProbe(hold_s=0.1)
    sinks = [ScriptedSink(f"s{i}", on_write=probe) for i in range(6)]
    make_fan(memory_ledger, sinks, parallelism=2).process(frame, info(0))
    assert probe.max_seen == 2
    assert all(s.calls == [(0, 1)] for s in sinks)


def test_unbounded_parallelism_writes_all_at_once(
    memory_ledger: MemoryLedger, frame: FakeFrame
) -> None:
    barrier = threading.Barrier(5, timeout=10)  # passes only when all five write at once
    sinks = [ScriptedSink(f"s{i}", on_write=lambda batch: barrier.wait()) for i in range(5)]
    results = make_fan(memory_ledger, sinks).process(frame, info(0))
    assert sorted(results) == ["s0", "s1", "s2", "s3", "s4"]


def test_parallelism_one_is_sequential(memory_ledger: MemoryLedger, frame: FakeFrame) -> None:
    probe = ConcurrencyProbe(hold_s=0.02)
    sinks = [ScriptedSink(f"s{i}", on_write=probe) for i in range(4)]
    make_fan(memory_ledger, sinks, parallelism=1).process(frame, info(0))
    assert probe.max_seen == 1


# -- construction -----------------------------------------------------------------------


class AtLeastOnceSink(ScriptedSink):
    guarantees: ClassVar = ("at_least_once",)


class Refused(ScriptedSink):
    """A sink holding the secret ``Op3n-S3cret`` whose ``open()`` raises ``error``."""

    def __init__(self, name: str, error: Exception) -> None:
        super().__init__(name)
        self.error = error

    def secret_values(self) -> list[str]:
        return ["Op3n-S3cret"]

    def open(self, context: Any) -> None:
        raise self.error


def _caused(error: Exception, cause: Exception) -> Exception:
    """``error`` as ``raise error from cause`` leaves it."""
    error.__cause__ = cause
    return error


def test_at_least_once_sink_warns_at_construction(
    memory_ledger: MemoryLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fanout")
    make_fan(memory_ledger, [ScriptedSink("safe"), AtLeastOnceSink("webhook")])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "fanout"]
    assert [r.getMessage() for r in warnings] == [
        "pipeline orders: sink 'webhook' is at-least-once: if the driver dies between its "
        "write and its ledger mark, the replay can write duplicates"
    ]


def test_open_raising_with_the_sinks_secret_masks_it_and_cuts_the_chain(
    memory_ledger: MemoryLedger,
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        make_fan(memory_ledger, [Refused("pg", RuntimeError("login app:Op3n-S3cret refused"))])
    assert str(raised.value) == (
        "sink 'pg': cannot open: RuntimeError: login app:*** refused (raised by Refused.open(): "
        "check the sink's options, which `fanout plugins --options TYPE` lists, and its target)"
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_open_raising_with_the_secret_only_in_its_cause_cuts_the_chain(
    memory_ledger: MemoryLedger,
) -> None:
    error = _caused(RuntimeError("login refused"), OSError("password Op3n-S3cret rejected"))
    with pytest.raises(ConfigurationError) as raised:
        make_fan(memory_ledger, [Refused("pg", error)])
    assert str(raised.value) == (
        "sink 'pg': cannot open: RuntimeError: login refused (raised by Refused.open(): "
        "check the sink's options, which `fanout plugins --options TYPE` lists, and its target)"
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_open_raising_a_configuration_error_with_the_sinks_secret_masks_it(
    memory_ledger: MemoryLedger,
) -> None:
    error = _caused(
        ConfigurationError("sink 'pg': token Op3n-S3cret refused"), OSError("401 for Op3n-S3cret")
    )
    with pytest.raises(ConfigurationError) as raised:
        make_fan(memory_ledger, [Refused("pg", error)])
    assert str(raised.value) == "sink 'pg': token *** refused"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_open_raising_a_subclass_keeps_its_type_and_fields_and_masks_every_secret(
    memory_ledger: MemoryLedger,
) -> None:
    """Callers catch a masked open error by its type: a ``PartitioningError`` stays one,
    with its sink; the checkpoint location's password it quotes is masked too."""
    from fanout.errors import PartitioningError

    error = PartitioningError(
        "token Op3n-S3cret, checkpoint s3://ck:Ckpt-Passw0rd-77@b/c", sink="pg"
    )
    with pytest.raises(PartitioningError) as raised:
        make_fan(
            memory_ledger,
            [Refused("pg", error)],
            checkpoint_location="s3://ck:Ckpt-Passw0rd-77@b/c",
        )
    assert str(raised.value) == "sink 'pg': token ***, checkpoint s3://ck:***@b/c"
    assert raised.value.sink == "pg" and raised.value.batch_id is None
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_duplicate_sink_names(memory_ledger: MemoryLedger) -> None:
    with pytest.raises(ConfigurationError) as raised:
        make_fan(memory_ledger, [ScriptedSink("a"), ScriptedSink("b"), ScriptedSink("a")])
    assert str(raised.value) == (
        "pipeline 'orders': two sinks are named 'a'; sink names must be unique "
        "(they key the ledger)"
    )


def test_two_sinks_claiming_one_exclusive_resource_are_refused_before_open(
    memory_ledger: MemoryLedger,
) -> None:
    class Claiming(ScriptedSink):
        def __init__(self, name: str, resource: str) -> None:
            super().__init__(name)
            self.resource = resource

        def exclusive_resources(self, pipeline: str) -> tuple[str, ...]:
            return (f"the ids {pipeline}/{self.resource}",)

        def open(self, context: Any) -> None:
            opened.append(self.name)

    opened: list[str] = []
    sinks = [Claiming("a", "x"), Claiming("b", "y"), Claiming("c", "x")]
    with pytest.raises(ConfigurationError) as raised:
        make_fan(memory_ledger, sinks)
    assert str(raised.value) == (
        "pipeline 'orders': sinks 'a' and 'c' both use the ids orders/x, which a sink must "
        "have to itself (they would fence or overwrite each other in every batch): give "
        "each its own"
    )
    assert opened == []
    make_fan(memory_ledger, sinks[:2]).close()
    assert opened == ["a", "b"]


def test_open_raising_names_the_sink_before_any_batch(memory_ledger: MemoryLedger) -> None:
    class Unreachable(ScriptedSink):
        def open(self, context: Any) -> None:
            raise OSError("connection refused")

    good, bad = ScriptedSink("good"), Unreachable("pg")
    with pytest.raises(ConfigurationError) as raised:
        make_fan(memory_ledger, [good, bad])
    assert str(raised.value) == (
        "sink 'pg': cannot open: OSError: connection refused (raised by Unreachable.open(): "
        "check the sink's options, which `fanout plugins --options TYPE` lists, and its target)"
    )
    assert isinstance(raised.value.__cause__, OSError)
    assert good.calls == bad.calls == []
    assert memory_ledger.entries == []


def test_open_configuration_error_passes_unchanged(memory_ledger: MemoryLedger) -> None:
    original = ConfigurationError("sink 'pg': option 'url' is required")

    class Misconfigured(ScriptedSink):
        def open(self, context: Any) -> None:
            raise original

    with pytest.raises(ConfigurationError) as raised:
        make_fan(memory_ledger, [Misconfigured("pg")])
    assert raised.value is original


def test_open_receives_the_context_and_close_closes(memory_ledger: MemoryLedger) -> None:
    seen: list[Any] = []

    class Opening(ScriptedSink):
        def open(self, context: Any) -> None:
            seen.append(context)

    sink = Opening("a")
    with make_fan(memory_ledger, [sink], spark="SPARK"):
        assert [(c.pipeline, c.spark) for c in seen] == [(PIPELINE, "SPARK")]
        assert sink.closed == 0
    assert sink.closed == 1


@pytest.mark.parametrize("name", ["bad/name", "", " orders", "-x", None, "orders\n"])
def test_invalid_pipeline_name(memory_ledger: MemoryLedger, name: Any) -> None:
    with pytest.raises(ConfigurationError) as raised:
        FanOut(name, memory_ledger, [ScriptedSink("a")])
    assert str(raised.value) == (
        f"pipeline: name {name!r} is not valid; use 1-128 letters, digits, '_', '.' or '-', "
        "starting with a letter or digit"
    )


def test_no_sinks_and_bad_parallelism(memory_ledger: MemoryLedger) -> None:
    with pytest.raises(ConfigurationError, match=r"^pipeline 'orders': no sinks configured$"):
        make_fan(memory_ledger, [])
    with pytest.raises(
        ConfigurationError, match=r"^pipeline 'orders': parallelism must be an integer >= 1, got 0$"
    ):
        make_fan(memory_ledger, [ScriptedSink("a")], parallelism=0)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"retries": "3"}, "retries must be an integer >= 0, got '3'"),
        ({"retries": -1}, "retries must be an integer >= 0, got -1"),
        ({"retries": True}, "retries must be an integer >= 0, got True"),
        ({"backoff_s": "1s"}, "backoff_s must be a number >= 0, got '1s'"),
        ({"backoff_s": float("nan")}, "backoff_s must be a number >= 0, got nan"),
        ({"parallelism": "2"}, "parallelism must be an integer >= 1, got '2'"),
        ({"probe_interval_s": 0}, "probe_interval_s must be a number > 0, got 0"),
        ({"share_tasks": "false"}, "share_tasks must be True or False, got 'false'"),
        ({"ledger": ""}, "ledger must not be empty: give the ledger's path"),
        ({"ledger": None}, "ledger must be the ledger's path or a fanout Ledger, got None"),
    ],
)
def test_fanout_arguments_of_a_wrong_type_or_range_are_named(
    memory_ledger: MemoryLedger, arguments: dict[str, Any], message: str
) -> None:
    """A string where a number belongs raised a bare TypeError ("'<' not supported between
    instances of 'str' and 'int'"), a negative retries a ValueError naming no option, a
    ledger of None an AttributeError; share_tasks="false" was taken as True."""
    ledger = arguments.pop("ledger", memory_ledger)
    with pytest.raises(ConfigurationError) as raised:
        FanOut("orders", ledger, [ScriptedSink("a")], **arguments)
    assert str(raised.value) == f"pipeline 'orders': {message}"


def test_the_ledger_and_the_spool_may_be_paths(tmp_path: Path) -> None:
    """A ``pathlib.Path`` is what a data engineer has at hand: it was kept as the ledger
    object itself and failed at the first batch (no ``mark_committed``)."""
    fan = FanOut("orders", tmp_path / "ledger", [ScriptedSink("a")], spool=tmp_path / "spool")
    try:
        assert isinstance(fan.ledger, DeltaLedger)
        assert fan.ledger.path == str(tmp_path / "ledger")
        assert fan.spool is None or fan.spool.path == str(tmp_path / "spool")
        fan.process(FakeFrame(), BatchInfo("orders", 0, "q"))
        assert fan.ledger.last_committed("orders", ["a"]) == {"a": 0}
    finally:
        fan.close()


@pytest.mark.parametrize("one", [{"type": "delta", "name": "b", "path": "/x"}, "delta"])
def test_one_sink_where_a_list_belongs_is_named(memory_ledger: MemoryLedger, one: Any) -> None:
    """A dict was iterated as its keys: "a sink must be a dict ... got str"."""
    with pytest.raises(ConfigurationError) as raised:
        FanOut("orders", memory_ledger, one)
    assert str(raised.value) == (
        "pipeline 'orders': sinks must be a list of sinks (dicts or Sink instances), got one "
        f"{type(one).__name__}: write sinks=[...]"
    )


def test_sink_dict_with_unknown_type(memory_ledger: MemoryLedger) -> None:
    with pytest.raises(
        ConfigurationError, match=r"^sink 'x': unknown sink type 'no-such-type'; known types: "
    ):
        make_fan(memory_ledger, [{"type": "no-such-type", "name": "x"}])


def test_ledger_path_builds_a_delta_ledger(tmp_path: Path, frame: FakeFrame) -> None:
    path = tmp_path / "ledger"
    fan = make_fan(str(path), [ScriptedSink("a")])
    assert isinstance(fan.ledger, DeltaLedger)
    assert (path / "_delta_log").is_dir()  # created at construction, before any batch
    fan.process(frame, info(0))
    assert DeltaLedger(str(path)).last_committed(PIPELINE, ["a"]) == {"a": 0}


def test_ledger_mark_is_retried_without_rewriting_the_sink(frame: FakeFrame) -> None:
    class OnceFlakyLedger(MemoryLedger):
        failures = 0

        def mark_committed(self, entry: LedgerEntry) -> bool:
            if self.failures == 0:
                self.failures += 1
                raise OSError("commit conflict")
            return super().mark_committed(entry)

    ledger = OnceFlakyLedger()
    sink = ScriptedSink("s")
    assert make_fan(ledger, [sink]).process(frame, info(2)) == {"s": SinkResult(rows=3)}
    assert sink.calls == [(2, 1)]
    assert ledger.last_committed(PIPELINE, ["s"]) == {"s": 2}


# -- marks of sinks finishing together share one ledger commit ---------------------------


def _sleeping(name: str, seconds: float) -> ScriptedSink:
    import time

    return ScriptedSink(name, on_write=lambda batch: time.sleep(seconds))


def _commits(ledger: DeltaLedger) -> list[list[str]]:
    """The marks (``sink@batch``) each commit of the ledger added, oldest first; commits
    adding none (failed attempts) are left out."""
    from deltalake import DeltaTable

    commits = []
    for version in range(1, DeltaTable(ledger.path).version() + 1):
        now, then = _marks_at(ledger.path, version), _marks_at(ledger.path, version - 1)
        if now - then:
            commits.append(sorted(now - then))
    return commits


def _marks_at(path: str, version: int) -> set[str]:
    from deltalake import DeltaTable

    from fanout.delta_tables.io import read_arrow

    rows = entries_from_arrow(read_arrow(DeltaTable(path, version=version)))
    return {f"{e.sink}@{e.batch_id}" for e in rows if e.status == "committed"}


def test_sinks_finishing_within_the_linger_share_one_ledger_commit(
    tmp_path: Path, frame: FakeFrame
) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"), mark_linger_s=5.0)
    sinks = [_sleeping("a", 0.0), _sleeping("b", 0.2), _sleeping("c", 0.4)]
    fan = make_fan(ledger, sinks)
    fan.process(frame, info(0))
    fan.process(frame, info(1))
    assert _commits(ledger) == [["a@0", "b@0", "c@0"], ["a@1", "b@1", "c@1"]]
    assert ledger.last_committed(PIPELINE, ["a", "b", "c"]) == {"a": 1, "b": 1, "c": 1}


def test_a_mark_waits_no_longer_than_the_linger_for_a_slow_sink(
    tmp_path: Path, frame: FakeFrame
) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"), mark_linger_s=0.3)
    marked_while_c_wrote: list[dict[str, int | None]] = []

    def slow(batch: Any) -> None:
        import time

        time.sleep(2.0)
        marked_while_c_wrote.append(DeltaLedger(ledger.path).last_committed(PIPELINE, ["a", "b"]))

    sinks = [_sleeping("a", 0.0), _sleeping("b", 0.0), ScriptedSink("c", on_write=slow)]
    make_fan(ledger, sinks).process(frame, info(0))
    assert marked_while_c_wrote == [{"a": 0, "b": 0}]  # durable before c finished
    assert _commits(ledger) == [["a@0", "b@0"], ["c@0"]]


def test_a_failing_sink_does_not_hold_the_others_marks(tmp_path: Path, frame: FakeFrame) -> None:
    import time

    ledger = DeltaLedger(str(tmp_path / "ledger"), mark_linger_s=5.0)
    failing = ScriptedSink("b", always_fail=SinkWriteError("bad row", sink="b"))
    started = time.monotonic()
    with pytest.raises(BatchFailedError):
        make_fan(ledger, [_sleeping("a", 0.0), failing, _sleeping("c", 0.2)]).process(
            frame, info(0)
        )
    assert time.monotonic() - started < 4  # the marks did not wait out the linger for b
    assert _commits(ledger) == [["a@0", "c@0"]]  # one commit, made once c was written


def test_sinks_written_one_after_another_mark_at_once(tmp_path: Path, frame: FakeFrame) -> None:
    import time

    ledger = DeltaLedger(str(tmp_path / "ledger"), mark_linger_s=5.0)
    sinks = [_sleeping("a", 0.0), _sleeping("b", 0.0)]
    started = time.monotonic()
    make_fan(ledger, sinks, parallelism=1).process(frame, info(0))
    assert time.monotonic() - started < 4  # no mark waited for a sink not yet started
    assert _commits(ledger) == [["a@0"], ["b@0"]]


def test_a_sink_error_that_is_its_own_cause_is_reported_without_the_loop(
    memory_ledger: MemoryLedger, frame: FakeFrame
) -> None:
    """A sink (a third party's, or fanout-delta's before 5c6694c) that raises its own
    ``SinkError`` with ``raise error from error`` makes it its own ``__cause__``; the
    ``BatchFailedError`` fanout raises is chained to it, so the usual root-cause loop
    (``while e.__cause__: e = e.__cause__``) over what the user catches never ended. The
    self-link is cut where fanout names a sink's error; the error keeps its class and text.
    """
    looped = SinkWriteError("disk full", sink="b", batch_id=5)
    looped.__cause__ = looped  # what `raise looped from looped` leaves
    fan = make_fan(memory_ledger, [ScriptedSink("ok"), ScriptedSink("b", always_fail=looped)])

    with pytest.raises(BatchFailedError) as raised:
        fan.process(frame, info(5))

    failure = raised.value.failures["b"]
    assert same_error(failure, looped) and str(failure) == "sink 'b', batch 5: disk full"
    chain, cause = [], raised.value.__cause__
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__
    assert chain == [failure], f"a loop in the __cause__ chain: {chain}"
    assert memory_ledger.last_committed(PIPELINE, ["ok", "b"]) == {"ok": 5, "b": None}
