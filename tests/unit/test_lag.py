"""Sinks that fail alone (``on_failure="lag"``), with the dispatcher's logic under a memory
ledger and a real spool (delta-rs): which batches a lagging sink misses, what is spooled
for whom, the catch-up's order, the bounds, and the options' validation."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError, FanOut, LagLimitError, SinkWriteError, hookimpl
from fanout.contract.batch import BatchInfo
from fanout.ledger.entry import Ledger
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import LagPolicy, lag_policy
from fanout.steps.lag_state import Lost, Open, Reopening, SinkState, Unopened
from tests.newest_lines import status_only
from tests.unit.fakes import SchemaFrame, ScriptedSink, rehook, same_error


def _fan(tmp: Path, sinks: list[Any], **kw: Any) -> FanOut:
    return FanOut("lagged", MemoryLedger(), sinks, backoff_s=0, spool=str(tmp / "spool"), **kw)


def _spec(sink: ScriptedSink, **options: Any) -> Any:
    from fanout.sink_spec import SinkSpec

    return SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag", **options}))


def _lagged_two_batches(ledger: Any, spool: str, **kw: Any) -> FanOut:
    """Batches 0 and 1 (ids ``b``, ``b + 10``) through sink ``good`` and sink ``down``
    (``on_failure="lag"``), whose every write fails: it lags both, spooled; the
    ``FanOut`` closed after."""
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = FanOut(
        "lagged", ledger, [ScriptedSink("good"), _spec(down)], backoff_s=0, spool=spool,
        probe_interval_s=3600, **kw,
    )  # fmt: skip
    try:
        for batch in range(2):
            fan.process(SchemaFrame([batch, batch + 10]), BatchInfo("lagged", batch, "q"))
    finally:
        fan.close()
    return fan


def _catch_up_from_memory(fan: FanOut, frames: dict[int, SchemaFrame]) -> None:
    """The catch-up reads the spool with Spark; here it reads the frames the test kept."""

    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
        assert spooled is not None, key
        assert spooled.rows == frames[key[1]].table.num_rows
        return frames[key[1]], spooled.info()

    fan.catchup._reader.read = read  # type: ignore[method-assign]


def test_a_lag_sink_fails_alone_is_spooled_for_and_catches_up_in_order(tmp_path: Path) -> None:
    good = ScriptedSink("good")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _fan(tmp_path, [good, _spec(down)], probe_interval_s=3600)
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(4)}
    try:
        for batch in range(3):  # no raise: the batch completes for "good"
            results = fan.process(frames[batch], BatchInfo("lagged", batch, "q"))
            assert list(results) == ["good"]
        assert good.calls == [(0, 1), (1, 1), (2, 1)]
        assert down.calls == [(0, 1)]  # batches 1 and 2 were held back, not tried live
        spool = fan.lagging.spool
        assert spool is not None
        assert [(b.batch_id, b.rows, sorted(b.needed_by)) for b in spool.batches()] == [
            (0, 2, ["down"]), (1, 2, ["down"]), (2, 2, ["down"]),
        ]  # fmt: skip
        lag = fan.lagging.lags()["down"]
        assert (lag.state, lag.batches, lag.rows) == ("lagging", 3, 6)

        down.always_fail = None  # the sink is back: the catch-up writes 0, 1, 2 in order
        _catch_up_from_memory(fan, frames)
        fan.catchup.stop()
        lags = fan.catch_up(timeout_s=10)
        assert lags["down"].state == "live"
        assert down.calls[1:] == [(0, 1), (1, 1), (2, 1)]
        assert fan.ledger.last_committed("lagged", ["down", "good"]) == {"down": 2, "good": 2}
        assert spool.size() == (0, 0, 0)  # every sink holds every batch: removed

        fan.process(frames[3], BatchInfo("lagged", 3, "q"))  # live again
        assert down.calls[-1] == (3, 1) and good.calls[-1] == (3, 1)
        assert spool.batches() == []  # nothing spooled while every sink is current
    finally:
        fan.close()


def test_the_spools_tables_keep_minutes_of_delta_log(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _fan(tmp_path, [ScriptedSink("good"), _spec(down)], probe_interval_s=3600)
    try:
        fan.process(SchemaFrame([1, 2]), BatchInfo("lagged", 0, "q"))
        spool = fan.lagging.spool
        assert spool is not None and [b.batch_id for b in spool.batches()] == [0]
        for table in (spool.index_path, spool.data_path):
            configuration = DeltaTable(table).metadata().configuration
            assert configuration["delta.logRetentionDuration"] == "interval 15 minutes", table
    finally:
        fan.close()


def test_a_stop_sink_still_fails_the_batch(tmp_path: Path) -> None:
    from fanout import BatchFailedError

    bad = ScriptedSink("bad", always_fail=SinkWriteError("no", sink="bad"))
    fan = _fan(tmp_path, [ScriptedSink("good"), bad])
    try:
        with pytest.raises(BatchFailedError, match=r"1 sink\(s\) failed \(bad\)"):
            fan.process(SchemaFrame([1]), BatchInfo("lagged", 0, "q"))
        assert fan.spool is not None and fan.spool.batches() == []
    finally:
        fan.close()


def test_past_max_lag_the_batch_drains_first_and_stops_when_the_sink_still_fails(
    tmp_path: Path,
) -> None:
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _fan(tmp_path, [ScriptedSink("good"), _spec(down, max_lag=2)], probe_interval_s=3600)
    frames = {b: SchemaFrame([b]) for b in range(4)}
    _catch_up_from_memory(fan, frames)
    try:
        fan.process(frames[0], BatchInfo("lagged", 0, "q"))
        fan.process(frames[1], BatchInfo("lagged", 1, "q"))
        with pytest.raises(LagLimitError) as stopped:
            fan.process(frames[2], BatchInfo("lagged", 2, "q"))
        message = str(stopped.value)
        assert "sink 'down' is 2 batch(es) / 2 row(s) behind" in message
        assert "past its max_lag (2 batches; now 3 batches > 2)" in message
        assert "SinkWriteError: sink 'down'" in message  # the drain's own attempt failed
        assert fan.ledger.last_committed("lagged", ["good"]) == {"good": 1}  # 2 not written

        down.always_fail = None  # back: the same batch drains to within the bound, goes on
        tried = len(down.calls)
        fan.catchup.stop()
        fan.process(frames[2], BatchInfo("lagged", 2, "q"))
        assert [batch for batch, _ in down.calls[tried:]] == [0]  # 2 behind again: within
        assert fan.ledger.last_committed("lagged", ["down", "good"]) == {"down": 0, "good": 2}
        fan.catch_up(timeout_s=10)
        assert [batch for batch, _ in down.calls[tried:]] == [0, 1, 2]
        assert fan.ledger.last_committed("lagged", ["down", "good"]) == {"down": 2, "good": 2}
    finally:
        fan.close()


def test_lag_needs_a_spool_and_backfill_a_delta_sink(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="pass FanOut\\(spool=<path>\\)"):
        FanOut("p", MemoryLedger(), [ScriptedSink("a"), _spec(ScriptedSink("b"))])
    with pytest.raises(ConfigurationError) as unknown:
        _fan(tmp_path, [ScriptedSink("a"), _spec(ScriptedSink("b"), backfill_from="c")])
    assert str(unknown.value) == (
        "pipeline 'lagged', sink 'b': backfill_from='c' must name another sink of the pipeline "
        "(its other sinks: a)"
    )
    with pytest.raises(ConfigurationError) as alone:  # listed none: "(sinks: )"
        _fan(tmp_path, [_spec(ScriptedSink("b"), backfill_from="a")])
    assert str(alone.value) == (
        "pipeline 'lagged', sink 'b': backfill_from='a' must name another sink of the pipeline "
        "(it has no other sink)"
    )
    with pytest.raises(ConfigurationError, match="a ScriptedSink cannot give back its batches"):
        _fan(tmp_path, [ScriptedSink("a"), _spec(ScriptedSink("b"), backfill_from="a")])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, LagPolicy()),
        ({"on_failure": "lag"}, LagPolicy("lag", 1000, None)),
        ({"on_failure": "lag", "max_lag": 5}, LagPolicy("lag", 5, None)),
        ({"on_failure": "lag", "max_lag": {"age_s": 60}}, LagPolicy("lag", None, 60.0)),
        ({"on_failure": "lag", "max_lag": {"batches": 3, "age_s": 9}}, LagPolicy("lag", 3, 9.0)),
        ({"backfill_from": "lake"}, LagPolicy("stop", 1000, None, "lake")),
    ],
)
def test_lag_options(options: dict[str, Any], expected: LagPolicy) -> None:
    assert lag_policy("s", options) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_failure": "skip"}, "sink 's': on_failure must be 'stop' or 'lag', not 'skip'"),
        ({"on_failure": "lag", "max_lag": 0}, "sink 's': max_lag must be a positive int"),
        ({"on_failure": "lag", "max_lag": "lots"}, "sink 's': max_lag must be a number"),
        ({"on_failure": "lag", "max_lag": {"rows": 3}}, "sink 's': max_lag takes 'batches'"),
        ({"on_failure": "lag", "max_lag": {}}, "sink 's': max_lag needs 'batches' or 'age_s'"),
        ({"max_lag": 3}, "sink 's': max_lag only applies with on_failure='lag'"),
        ({"backfill_from": ""}, "sink 's': backfill_from must name another sink"),
    ],
)
def test_bad_lag_options_are_configuration_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        lag_policy("s", options)
    assert str(bad.value).startswith(message)


def test_status_shows_the_lagging_sink_and_the_spool(tmp_path: Path) -> None:
    from fanout.app.status import report
    from fanout.ledger.delta import DeltaLedger

    ledger = DeltaLedger(str(tmp_path / "ledger"))
    fan = _lagged_two_batches(ledger, str(tmp_path / "spool"))
    text = report(ledger, "lagged", spool=str(tmp_path / "spool"))
    lines = {line.split()[1]: line for line in text.splitlines()[2:4]}
    assert lines["down"].split()[2:5] == ["lagging", "2", "batches"]
    assert lines["good"].split()[2] == "live"
    assert text.splitlines()[-1] == (
        f"spool {tmp_path / 'spool'} (lagged): 2 batch(es), 4 row(s), {fan.spool.size()[2]} bytes"  # type: ignore[union-attr]
    )
    status = {s["sink"]: s for s in json.loads(report(ledger, "lagged", as_json=True,
                                                      spool=str(tmp_path / "spool")))}  # fmt: skip
    assert (status["down"]["state"], status["down"]["lag_batches"]) == ("lagging", 2)
    assert status["down"]["lag_rows"] == 4 and status["down"]["lagging_since"] is not None
    assert (status["good"]["state"], status["good"]["lag_batches"]) == ("live", 0)


def test_status_watch_opens_the_spool_index_once_per_draw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlogs, the batches kept after a skip and the footer each opened (and read)
    the index again: three opens a draw, four at the first (its existence check)."""
    import fanout.spool.index as spool_index
    from fanout.app.cli import main
    from fanout.app.status import report
    from fanout.ledger.delta import DeltaLedger

    ledger, spool = DeltaLedger(str(tmp_path / "ledger")), str(tmp_path / "spool")
    _lagged_two_batches(ledger, spool)
    opened: list[str] = []
    open_index = spool_index.open_index

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(path)
        return open_index(path, *args, **kwargs)

    for pipeline in (["--pipeline", "lagged"], []):
        expected = report(ledger, pipeline[1] if pipeline else None, spool=spool)
        assert "lagging 2 batches" in expected and "(lagged): 2 batch(es)" in expected
        monkeypatch.setattr(spool_index, "open_index", counted)
        argv = ["status", "--ledger", ledger.path, "--spool", spool, *pipeline, "--watch"]
        assert main([*argv, "--count", "3", "--interval", "0"]) == 0
        monkeypatch.setattr(spool_index, "open_index", open_index)
        assert opened == [spool] * 3, pipeline
        opened.clear()
        blocks = capsys.readouterr().out.split("\n\nfanout status --ledger ")
        drawn = [status_only(b.split("\n\n", 1)[1]).rstrip("\n") for b in blocks]
        assert drawn == [expected] * 3


def test_status_watch_reads_the_spool_index_once_per_draw_footer_included(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The footer opened and read the index again (``Spool.open``, creating it if gone):
    two reads a draw. Every Delta open of the index counted, whichever module's."""
    import fanout.delta_tables.io as io
    import fanout.spool.data as spool_data
    import fanout.spool.table as spool_table
    from fanout.app.cli import main
    from fanout.ledger.delta import DeltaLedger

    ledger, spool = DeltaLedger(str(tmp_path / "ledger")), str(tmp_path / "spool")
    _lagged_two_batches(ledger, spool)
    held = spool_table.Spool(spool, "lagged")
    held.open()
    batches, rows, size = held.size()
    assert (batches, rows) == (2, 4) and size > 0
    opened: list[str] = []
    open_table = io.open_table

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(path)
        return open_table(path, *args, **kwargs)

    monkeypatch.setattr(io, "open_table", counted)
    monkeypatch.setattr(spool_table, "open_table", counted)
    monkeypatch.setattr(spool_data, "open_table", counted)
    for pipeline in (["--pipeline", "lagged"], []):
        argv = ["status", "--ledger", ledger.path, "--spool", spool, *pipeline, "--watch"]
        assert main([*argv, "--count", "2", "--interval", "0"]) == 0
        assert [p for p in opened if p.endswith("/index")] == [f"{spool}/index"] * 2, pipeline
        opened.clear()
        out = capsys.readouterr().out
        footer = f"spool {spool} (lagged): 2 batch(es), 4 row(s), {size} bytes\n"
        assert out.count(footer) == 2, out


def test_metrics_and_the_run_line_show_the_lag(tmp_path: Path) -> None:
    import io

    from fanout.app.progress import ProgressObserver
    from fanout.observe.metrics import MetricsObserver

    metrics, progress = MetricsObserver("lagged"), ProgressObserver()
    _lagged_two_batches(MemoryLedger(), str(tmp_path / "spool"), plugins=[metrics, progress])
    assert metrics.value("fanout_sink_lag_batches", sink="down") == 2
    assert metrics.value("fanout_sink_lag_rows", sink="down") == 4
    assert metrics.value("fanout_sink_state", sink="down", state="lagging") == 1
    assert metrics.value("fanout_sink_state", sink="down", state="live") == 0
    assert metrics.value("fanout_spool_batches") == 2
    assert metrics.value("fanout_spool_rows") == 4
    assert metrics.value("fanout_sink_failures_total", sink="down") == 1  # one live attempt
    out = io.StringIO()
    progress.flush([], out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("batch 0: ? rows in | good 2 rows ")
    assert " | down lagging 1 batch(es) / 2 row(s) since " in lines[0]
    assert " | down lagging 2 batch(es) / 4 row(s) since " in lines[1]


def test_the_guard_counts_a_lagging_sink_at_its_spooled_batches(tmp_path: Path) -> None:
    from fanout import CheckpointResetError

    down = ScriptedSink("down")
    fan = _fan(tmp_path, [ScriptedSink("good"), _spec(down)], probe_interval_s=3600)
    try:
        fan.process(SchemaFrame([0]), BatchInfo("lagged", 0, "q"))  # both commit 0
        down.always_fail = SinkWriteError("refused", sink="down")
        for batch in (1, 2):
            fan.process(SchemaFrame([batch]), BatchInfo("lagged", batch, "q"))
        with pytest.raises(CheckpointResetError) as reset:
            fan.process(SchemaFrame([0]), BatchInfo("lagged", 0, "another-query"))
    finally:
        fan.close()
    lines = str(reset.value).splitlines()
    assert "  - good: batch 2, query id q, source offsets not recorded" in lines
    assert (
        "  - down: batch 0, query id q, source offsets not recorded; it lags, and its batches "
        "up to 2 wait in the spool (they reach it from there: count it at batch 2)"
    ) in lines
    assert lines[-1].endswith(
        f"--pipeline lagged --spool {tmp_path / 'spool'}` prints these facts again, with "
        "Kafka startingOffsets."
    )


def test_the_guard_does_not_count_a_lagging_sink_at_a_batch_spark_never_committed(
    tmp_path: Path,
) -> None:
    """Batch 2 is spooled for the lagging sink while the fail-fast sink fails it: a reset
    gives it up (the new checkpoint reads it again), so the refusal counts the lagging
    sink at batch 1, the last spooled batch the catch-up writes after a reset."""
    from fanout import BatchFailedError, CheckpointResetError

    good, down = ScriptedSink("good"), ScriptedSink("down")
    fan = _fan(tmp_path, [good, _spec(down)], probe_interval_s=3600)
    try:
        fan.process(SchemaFrame([0]), BatchInfo("lagged", 0, "q"))  # both commit 0
        down.always_fail = SinkWriteError("refused", sink="down")
        fan.process(SchemaFrame([1]), BatchInfo("lagged", 1, "q"))
        good.always_fail = SinkWriteError("full", sink="good")
        with pytest.raises(BatchFailedError):
            fan.process(SchemaFrame([2]), BatchInfo("lagged", 2, "q"))
        with pytest.raises(CheckpointResetError) as reset:
            fan.process(SchemaFrame([0]), BatchInfo("lagged", 0, "another-query"))
    finally:
        fan.close()
    assert fan.spool is not None and [b.batch_id for b in fan.spool.batches()] == [1, 2]
    lines = str(reset.value).splitlines()
    assert "  - good: batch 1, query id q, source offsets not recorded" in lines
    assert (
        "  - down: batch 0, query id q, source offsets not recorded; it lags, and its batches "
        "up to 1 wait in the spool (they reach it from there: count it at batch 1)"
    ) in lines


class Unreachable(ScriptedSink):
    """A sink whose target cannot be reached until ``reachable`` is set."""

    reachable = False

    def open(self, context: Any) -> None:
        from fanout import SinkUnreachableError

        if not self.reachable:
            raise SinkUnreachableError("connection refused", sink=self.name)
        super().open(context)


def test_an_unreachable_lag_sink_gets_a_replayed_batch_the_others_hold(tmp_path: Path) -> None:
    # found by the long chaos run: killed after the other sinks marked batch 1 and before
    # it was spooled, the replay had nothing pending but the unreachable sink, and the
    # batch was committed in Spark without being spooled for it
    down = Unreachable("down")
    good = ScriptedSink("good")
    ledger = MemoryLedger()
    frames = {b: SchemaFrame([b]) for b in range(3)}
    first = FanOut("lagged", ledger, [good, _spec(down)], backoff_s=0,
                   spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    assert first.lagging.held("down").state is SinkState.UNOPENED  # behind, not an error
    first.process(frames[0], BatchInfo("lagged", 0, "q"))
    first.close()
    from fanout.ledger.entry import LedgerEntry

    ledger.mark_committed(LedgerEntry("lagged", "good", 1, "committed", query_id="q"))
    again = FanOut("lagged", ledger, [ScriptedSink("good"), _spec(down)], backoff_s=0,
                   spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        again.process(frames[1], BatchInfo("lagged", 1, "q"))  # the replay: only down needs it
        assert again.spool is not None
        assert [(b.batch_id, sorted(b.needed_by)) for b in again.spool.batches()] == [
            (0, ["down"]),
            (1, ["down"]),
        ]
        down.reachable = True
        _catch_up_from_memory(again, frames)
        again.catchup.stop()
        again.catch_up(timeout_s=10)
        assert [batch for batch, _ in down.calls] == [0, 1]
    finally:
        again.close()


def test_a_reopened_sink_whose_check_raises_is_closed_before_it_is_opened_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reopen whose lost-target check raised (the ledger unreadable) left the sink open
    and unopened: opened again at the next try without a close, a PostgreSQL sink's
    connection pool leaked, one per try. Its close failing too is logged, not raised."""

    class Counted(Unreachable):
        def close(self) -> None:
            super().close()
            if self.closed == 1:
                raise OSError("close failed")

    down = Counted("down")
    fan = FanOut("closing", MemoryLedger(), [ScriptedSink("good"), _spec(down)], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()

    def unreadable(sink: str) -> Any:
        raise OSError("the ledger cannot be read")

    asked = rehook(fan.lagging, ask_target=unreadable)
    down.reachable = True
    try:
        for _ in range(3):
            error = fan.lagging.reopen("down")
            assert isinstance(error, OSError) and str(error) == "the ledger cannot be read"
        assert (down.opened, down.closed) == (3, 3)  # each open closed before the next
        assert fan.unopened == ("down",)
        assert "sink 'down': close() after its failed check failed too: OSError: close " \
            "failed" in caplog.text  # fmt: skip
        rehook(fan.lagging, ask_target=asked.ask_target)
        assert fan.lagging.reopen("down") is None
        assert (down.opened, down.closed, fan.unopened) == (4, 3, ())
    finally:
        fan.close()


def test_a_sink_whose_reopen_runs_at_close_is_closed_after_its_open_returns(
    tmp_path: Path,
) -> None:
    """``FanOut.close()`` closed every sink, one whose reopen was still inside ``open()``
    too: that open then returned into a closed pipeline, and nothing closed what it opened
    (a PostgreSQL pool, a Kafka producer). The reopen's thread now closes it."""
    import threading

    events: list[str] = []
    entered, release = threading.Event(), threading.Event()

    class Slow(Unreachable):
        def open(self, context: Any) -> None:
            if self.reachable:
                entered.set()
                assert release.wait(30)
            super().open(context)
            events.append("open")

        def close(self) -> None:
            super().close()
            events.append("close")

    down = Slow("down")
    fan = FanOut("closing", MemoryLedger(), [ScriptedSink("good"), _spec(down)], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    down.reachable = True
    try:
        assert fan.lagging.reopen("down", wait=False) is not None  # lags meanwhile
        assert entered.wait(30)
    finally:
        fan.close()
    assert events == []  # the reopen's thread owns the sink now
    held = fan.lagging.held("down")
    assert isinstance(held, Reopening)
    release.set()
    assert held.opening.done.wait(30)
    assert events == ["open", "close"]
    assert fan.unopened == ("down",)  # not asked, never written
    assert fan.lagging.reopen("down") is not None  # and not opened again
    assert down.opened == 1


@pytest.mark.parametrize(
    "at,lost",
    [("check", False), ("check", True), ("moved", False), ("moved", True)],
)
def test_a_reopened_sink_is_closed_once_wherever_its_reopen_is_when_the_pipeline_closes(
    tmp_path: Path, at: str, lost: bool
) -> None:
    """Whoever holds the sink when ``FanOut.close()`` runs closes it, once: the reopen's
    thread while the sink is ``OPENING`` (its check running: the thread then does not keep
    it), ``FanOut.close()`` once the thread has moved it on (open, or lost: its thread
    still running, here in ``on_reopened``). Counted: one open, one close."""
    import threading

    from fanout import TargetLostError

    entered, release = threading.Event(), threading.Event()
    gone = TargetLostError("table gone", sink="down", batch_id=0)
    reopens: list[threading.Thread] = []

    def blocks() -> None:
        reopens.append(threading.current_thread())
        entered.set()
        assert release.wait(30)

    def check(sink: str) -> TargetLostError | None:
        if at == "check":
            blocks()
        return gone if lost else None

    down = Unreachable("down")
    fan = FanOut("closing", MemoryLedger(), [ScriptedSink("good"), _spec(down)], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    rehook(fan.lagging, ask_target=check)
    if at == "moved":
        rehook(fan.lagging, on_reopened=blocks)
    down.reachable = True
    try:
        answer = fan.lagging.reopen("down", wait=False)
        if at == "check" or lost:  # lags meanwhile; moved to OPEN, its thread may be
            assert answer is not None  # there before this call reads the state
        assert entered.wait(30)
        held = fan.lagging.held("down")
        assert isinstance(held, Reopening if at == "check" else Lost if lost else Open)
    finally:
        fan.close()
    assert (down.opened, down.closed) == (1, 0 if at == "check" else 1)
    release.set()
    reopens[0].join(30)
    assert not reopens[0].is_alive()
    assert (down.opened, down.closed) == (1, 1)
    state = fan.lagging.held("down").state
    kept = SinkState.LOST if lost else SinkState.OPEN
    assert state is (SinkState.UNOPENED if at == "check" else kept)


def test_while_a_reopen_closes_what_its_failed_check_opened_the_sink_lags_with_that_error(
    tmp_path: Path,
) -> None:
    """A reopen whose check raised closes the sink in its thread before it lets it go
    (no other open starts meanwhile); a live batch asking then got the error of the try
    before (here the start's "connection refused", the target reachable now), recorded in
    the ledger and shown by status, for as long as that ``close()`` took."""
    import threading

    from fanout import SinkUnreachableError

    closing, release = threading.Event(), threading.Event()

    class SlowClose(Unreachable):
        def close(self) -> None:
            super().close()
            if self.reachable:
                closing.set()
                assert release.wait(30)

    def unreadable(sink: str) -> Any:
        raise OSError("the ledger cannot be read")

    down = SlowClose("down")
    fan = FanOut("closing", MemoryLedger(), [ScriptedSink("good"), _spec(down)], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    rehook(fan.lagging, ask_target=unreadable)
    down.reachable = True
    try:
        started = fan.lagging.reopen("down", wait=False)  # the start's error, or the
        assert isinstance(started, (SinkUnreachableError, OSError))  # check's if it was quick
        assert closing.wait(30)  # the check failed: its thread closes the sink
        held = fan.lagging.held("down")
        assert isinstance(held, Reopening)  # still its thread's
        error = fan.lagging.reopen("down", wait=False)
        assert isinstance(error, OSError) and str(error) == "the ledger cannot be read"
        assert fan.lagging.not_opened() == {"down": error}
        release.set()
        assert held.opening.done.wait(30)
        assert fan.lagging.held("down") == Unopened(held.context, error)
        assert (down.opened, down.closed) == (1, 1)
    finally:
        release.set()
        fan.close()


def test_a_hanging_check_does_not_stall_the_catch_up_of_the_other_sinks(
    tmp_path: Path,
) -> None:
    """The catch-up's thread waited, without ``write_timeout_s``, for a reopened sink's
    check: one that hangs stopped it for every other lagging sink. It now moves on (and
    is woken when the check ends)."""
    import threading

    gate = threading.Event()
    down = Unreachable("down")
    late = ScriptedSink("late", fail=[SinkWriteError("refused", sink="late")])
    fan = FanOut("stalled", MemoryLedger(), [ScriptedSink("good"), _spec(down), _spec(late)],
                 retries=0, backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=0.05)  # fmt: skip
    frames = {0: SchemaFrame([0, 1])}
    _catch_up_from_memory(fan, frames)
    asked = fan.lagging._reopener.hooks.ask_target
    assert asked is not None  # FanOut gives its lag state every reopen hook

    def hangs(sink: str) -> Any:
        assert gate.wait(60)
        return asked(sink)

    rehook(fan.lagging, ask_target=hangs)
    down.reachable = True
    try:
        fan.process(frames[0], BatchInfo("stalled", 0, "q"))  # both lag; down's check hangs
        deadline = time.monotonic() + 30
        while late.calls != [(0, 1), (0, 1)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert late.calls == [(0, 1), (0, 1)]  # caught up by the thread meanwhile
        assert fan.ledger.last_committed("stalled", ["late", "down"]) == {"late": 0, "down": None}
        assert down.calls == []
        gate.set()
        deadline = time.monotonic() + 30
        while down.calls != [(0, 1)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert down.calls == [(0, 1)]  # the check ended: woken, it catches down up
    finally:
        gate.set()
        fan.close()


def test_a_hold_back_reading_a_reopen_outcome_mid_way_does_not_write_a_lost_target(
    tmp_path: Path,
) -> None:
    """hold_back read ``lost`` then ``unopened`` without the lag state's lock: a reopen's
    thread moving the sink from one to the other in between (its check said lost) made it
    look open, and with no backlog yet it was written live. The state is one value now:
    the thread's outcome lands right after hold_back's read, which saw it opening."""
    import threading

    from fanout import TargetLostError
    from fanout.steps.lag_state import Opening

    down = Unreachable("down")
    fan = FanOut("racing", MemoryLedger(), [ScriptedSink("good"), _spec(down)], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    lagging = fan.lagging
    lost = TargetLostError("table gone", sink="down", batch_id=0)
    rehook(lagging, ask_target=lambda sink: lost)
    running = Opening()  # the reopen's thread, played by the test: no other starts
    held = lagging.held("down")
    assert isinstance(held, Unopened)
    lagging._states.move("down", Reopening(held.context, held.error, running))
    read = lagging._states.of
    fired: list[bool] = []

    def racing(sink: str) -> Any:
        found = read(sink)
        if sink == "down" and not fired:  # the thread's outcome lands now
            fired.append(True)
            thread = threading.Thread(target=lagging._reopener._now_open, args=("down",))
            thread.start()
            thread.join(5.0)
        return found

    lagging._states.of = racing  # type: ignore[method-assign]
    try:
        results = fan.process(SchemaFrame([1]), BatchInfo("racing", 0, "q"))
        assert fired and list(results) == ["good"]
        assert down.calls == []  # never written
        assert lagging.reopen("down", wait=False) is lost
        assert isinstance(read("down"), Lost)
    finally:
        running.done.set()
        fan.close()


def test_an_unreachable_lag_sink_past_its_max_lag_stops_the_query(tmp_path: Path) -> None:
    """A sink that could not be opened spools as one that fails: within its ``max_lag``
    (it spooled without bound before, never reaching the check)."""
    down = Unreachable("down")
    fan = FanOut("lagged", MemoryLedger(), [ScriptedSink("good"), _spec(down, max_lag=2)],
                 backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    frames = {b: SchemaFrame([b]) for b in range(4)}
    _catch_up_from_memory(fan, frames)
    try:
        assert fan.lagging.held("down").state is SinkState.UNOPENED
        fan.process(frames[0], BatchInfo("lagged", 0, "q"))
        fan.process(frames[1], BatchInfo("lagged", 1, "q"))
        with pytest.raises(LagLimitError) as stopped:
            fan.process(frames[2], BatchInfo("lagged", 2, "q"))
        assert "sink 'down' is 2 batch(es) / 2 row(s) behind" in str(stopped.value)
        assert "past its max_lag (2 batches; now 3 batches > 2)" in str(stopped.value)
        assert fan.ledger.last_committed("lagged", ["good"]) == {"good": 1}  # 2 not written
        assert down.calls == []  # never opened, never written

        down.reachable = True  # back: the drain opens it, writes 0, and the batch goes on
        fan.catchup.stop()
        fan.process(frames[2], BatchInfo("lagged", 2, "q"))
        assert fan.ledger.last_committed("lagged", ["good"]) == {"good": 2}
        fan.catch_up(timeout_s=10)
        assert [batch for batch, _ in down.calls] == [0, 1, 2]
    finally:
        fan.close()


def test_an_unreachable_lag_sinks_open_errors_reach_ledger_and_status_masked(
    tmp_path: Path,
) -> None:
    from fanout import SinkUnreachableError

    class Down(Unreachable):
        """Unreachable; its driver's error quotes its password, in the cause too."""

        def secret_values(self) -> list[str]:
            return ["Hunter-2-pw"]

        def open(self, context: Any) -> None:
            if self.reachable:
                return super().open(context)
            cause = OSError("password Hunter-2-pw rejected")
            raise SinkUnreachableError(
                "login app:Hunter-2-pw@db:5432 refused", sink=self.name
            ) from cause

    down = Down("down")
    ledger = MemoryLedger()
    fan = FanOut("masked", ledger, [ScriptedSink("good"), _spec(down)], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        held = fan.lagging.held("down")
        assert isinstance(held, Unopened)
        started = held.error
        assert str(started) == "sink 'down': login app:***@db:5432 refused"
        assert started.__cause__ is None and started.__suppress_context__
        fan.process(SchemaFrame([1]), BatchInfo("masked", 0, "q"))  # hold_back re-opens
        failed = [e.error for e in ledger.entries if e.status == "failed"]
        assert failed == ["SinkUnreachableError: sink 'down': login app:***@db:5432 refused"]
        assert fan.lagging.lag_of("down").error == failed[0]
        assert ledger.last_committed("masked", ["good", "down"]) == {"good": 0, "down": None}
    finally:
        fan.close()


def test_an_unreachable_sink_without_lag_stops_the_start_with_its_secret_masked() -> None:
    from fanout import SinkUnreachableError

    class Down(ScriptedSink):
        def secret_values(self) -> list[str]:
            return ["Hunter-2-pw"]

        def open(self, context: Any) -> None:
            raise SinkUnreachableError("login app:Hunter-2-pw refused", sink=self.name)

    with pytest.raises(SinkUnreachableError) as raised:
        FanOut("masked", MemoryLedger(), [Down("down")], backoff_s=0)
    assert str(raised.value) == "sink 'down': login app:*** refused"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_lag_sink_finding_its_checkpoint_rolled_back_stops_the_query(tmp_path: Path) -> None:
    # a sink's own plan check (the Delta sink's recorded plan) refuses a re-planned batch:
    # lagging would spool it and refuse it again at every catch-up; the query must stop
    from fanout import BatchFailedError, CheckpointRollbackError

    refused = CheckpointRollbackError("batch 3 was planned differently")
    delta = ScriptedSink("delta", always_fail=refused)
    good = ScriptedSink("good")
    ledger = MemoryLedger()
    fan = FanOut("rolled", ledger, [good, _spec(delta)], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        with pytest.raises(BatchFailedError) as failed:
            fan.process(SchemaFrame([1]), BatchInfo("rolled", 3, "q"))
        assert list(failed.value.failures) == ["delta"]
        assert same_error(failed.value.failures["delta"], refused)
        assert fan.spool is not None and fan.spool.batches() == []
        assert ledger.last_committed("rolled", ["good", "delta"]) == {"good": 3, "delta": None}
        assert fan.lagging.lag_of("delta").state == "live"
    finally:
        fan.close()


def test_a_lag_sink_raising_an_interrupt_lags_and_the_interrupt_goes_on(tmp_path: Path) -> None:
    """The interrupted sink's attempt is recorded and it lags like any failed lag sink (the
    batch is spooled for it, the other sink's mark stands), then the interrupt is raised."""
    stop = KeyboardInterrupt("stop")
    good, down = ScriptedSink("good"), ScriptedSink("down", always_fail=stop)
    fan = _fan(tmp_path, [good, _spec(down)], probe_interval_s=3600)
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            fan.process(SchemaFrame([1, 2]), BatchInfo("lagged", 0, "q"))
        assert same_error(raised.value, stop)
        assert fan.ledger.last_committed("lagged", ["down", "good"]) == {"down": None, "good": 0}
        failed = [(e.sink, e.attempt, e.error) for e in fan.ledger.entries if e.status == "failed"]
        assert failed == [
            ("down", 1, "SinkWriteError: sink 'down', batch 0: KeyboardInterrupt: stop")
        ]
        spool = fan.lagging.spool
        assert spool is not None
        assert [(b.batch_id, b.rows, sorted(b.needed_by)) for b in spool.batches()] == [
            (0, 2, ["down"])
        ]
        lag = fan.lagging.lags()["down"]
        assert (lag.state, lag.batches) == ("lagging", 1)
    finally:
        fan.close()


def test_the_catch_up_records_an_interrupt_and_raises_it_only_in_the_callers_thread(
    tmp_path: Path,
) -> None:
    """In its own thread (``step``) the catch-up must live on: the interrupted write is a
    failure like any other. ``catch_up()`` (the caller's thread) raises it on."""
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _fan(tmp_path, [ScriptedSink("good"), _spec(down)], probe_interval_s=3600)
    frames = {0: SchemaFrame([7])}
    _catch_up_from_memory(fan, frames)
    try:
        fan.process(frames[0], BatchInfo("lagged", 0, "q"))
        fan.catchup.stop()
        stop = SystemExit(3)
        down.always_fail = stop

        assert fan.catchup.step("down") is False  # no raise: recorded, tried again later
        with pytest.raises(SystemExit) as raised:
            fan.catch_up(timeout_s=10)
        assert same_error(raised.value, stop)
        failed = [(e.sink, e.attempt, e.error) for e in fan.ledger.entries if e.status == "failed"]
        assert failed == [
            ("down", 1, "SinkWriteError: sink 'down': refused"),
            ("down", 1, "SinkWriteError: sink 'down', batch 0: SystemExit: 3"),
            ("down", 1, "SinkWriteError: sink 'down', batch 0: SystemExit: 3"),
        ]
        assert down.calls == [(0, 1), (0, 1), (0, 1)]
        assert fan.ledger.last_committed("lagged", ["down"]) == {"down": None}
    finally:
        fan.close()


def test_the_catch_up_thread_survives_an_exit_raised_inside_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    fan = _fan(tmp_path, [ScriptedSink("good"), _spec(ScriptedSink("down"))])
    steps: list[str] = []
    twice = threading.Event()

    def step(sink: str) -> bool:
        steps.append(sink)
        if len(steps) == 1:
            raise SystemExit(1)  # a thread it ends does not even print a traceback
        twice.set()
        return False

    fan.catchup.step = step  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.ERROR, "fanout"):
            fan.catchup.start()
            fan.catchup.wake()
            assert twice.wait(10), f"the catch-up stopped after {steps}"
        assert fan.catchup._thread is not None and fan.catchup._thread.is_alive()
        # first lines only: a redacting filter a test left on the logger folds the
        # traceback into the message
        logged = [r.getMessage().splitlines()[0] for r in caplog.records if r.name == "fanout"]
        assert logged[:1] == ["pipeline lagged: the catch-up failed; retrying"]
    finally:
        fan.close()


def _retrying(sink: ScriptedSink, retries: int) -> Any:
    from fanout.retry import RetryPolicy
    from fanout.sink_spec import SinkSpec

    return SinkSpec(
        sink,
        retry=RetryPolicy(retries=retries, backoff_s=0),
        lag=lag_policy(sink.name, {"on_failure": "lag"}),
    )


def _three_missed(tmp: Path, down: ScriptedSink) -> tuple[FanOut, dict[int, SchemaFrame]]:
    fan = _fan(tmp, [ScriptedSink("good"), _retrying(down, 2)], probe_interval_s=3600)
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(3)}
    for batch in range(3):
        fan.process(frames[batch], BatchInfo("lagged", batch, "q"))
    fan.catchup.stop()  # the query ended: only the final catch-up writes now
    _catch_up_from_memory(fan, frames)
    return fan, frames


def test_the_final_catch_up_retries_with_the_sinks_policy_and_writes_in_order(
    tmp_path: Path,
) -> None:
    failing = SinkWriteError("refused", sink="down")
    down = ScriptedSink("down", always_fail=failing)
    fan, _ = _three_missed(tmp_path, down)
    try:
        assert down.calls == [(0, 1)]  # live: batch 0 (not transient), then held back
        down.always_fail = None
        down.fail = [failing, failing]  # two more failures, within its 2 retries
        assert {n: lag.state for n, lag in fan.final_catch_up().items()} == {"down": "live"}
        assert down.calls[1:] == [(0, 1), (0, 1), (0, 1), (1, 1), (2, 1)]
        assert fan.ledger.last_committed("lagged", ["down", "good"]) == {"down": 2, "good": 2}
        assert fan.behind() == []
        assert fan.spool is not None and fan.spool.size() == (0, 0, 0)
    finally:
        fan.close()


def test_the_final_catch_up_names_a_sink_still_behind_and_keeps_its_batches(
    tmp_path: Path,
) -> None:
    from fanout import SinksBehindError
    from fanout.contract.lag import SinkBehind

    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan, _ = _three_missed(tmp_path, down)
    try:
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up()
        assert down.calls[1:] == [(0, 1), (0, 1), (0, 1)]  # 1 + its 2 retries, then it stops
        error = fan.lagging.lags()["down"].error
        assert error is not None and "refused" in error
        assert behind.value.behind == [
            SinkBehind("down", (0, 0), (0, 2), 3, spooled=3, rows=6, error=error)
        ]
        spool = tmp_path / "spool"
        assert str(behind.value) == (
            "pipeline 'lagged': the run ended with 1 sink(s) behind after a final catch-up:\n"
            f"  - down: batches 0 to 2 (3 batch(es), 6 row(s) in the spool); its last error: "
            f"{error}\n"
            f"Nothing is lost: the spool at {spool} keeps those batches (a backfill source "
            "the ones it holds), and the next run of this pipeline writes them to each sink "
            "first, in batch order and exactly once, before its live batches. Fix the "
            f"sink(s), then run again; `fanout status --ledger {fan.ledger.__class__.__name__}@"
            f"{id(fan.ledger):x} --pipeline lagged --spool {spool}` shows how far behind they are."
        )
        assert fan.ledger.last_committed("lagged", ["down"]) == {"down": None}
        assert fan.spool is not None and fan.spool.size()[:2] == (3, 6)

        down.always_fail = None  # a stop asked for before the final catch-up: no write
        with pytest.raises(SinksBehindError):
            fan.final_catch_up(stop=lambda: True)
        assert len(down.calls) == 4
    finally:
        fan.close()


def test_a_stop_writes_nothing_more_and_names_a_sink_still_behind(tmp_path: Path) -> None:
    """``FanOut.stopped``, a signal's clean stop: the catch-up thread stops and no final
    catch-up runs, even for a sink that is back; a sink still behind gets the final
    catch-up's message, saying the stop gave it none. With none behind, it returns."""
    from fanout import SinksBehindError

    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _fan(tmp_path, [ScriptedSink("good"), _spec(down)], probe_interval_s=3600)
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(2)}
    try:
        for batch in range(2):
            fan.process(frames[batch], BatchInfo("lagged", batch, "q"))
        _catch_up_from_memory(fan, frames)
        down.always_fail = None  # back, but the operator asked the run to end
        calls = list(down.calls)
        with pytest.raises(SinksBehindError) as behind:
            fan.stopped("SIGINT")
        assert (down.calls, fan.catchup._thread) == (calls, None)
        error = fan.lagging.lags()["down"].error
        assert str(behind.value) == (
            "pipeline 'lagged': the run ended with 1 sink(s) behind (stopped by SIGINT: no "
            "final catch-up):\n"
            f"  - down: batches 0 to 1 (2 batch(es), 4 row(s) in the spool); its last error: "
            f"{error}\n"
            f"Nothing is lost: the spool at {tmp_path / 'spool'} keeps those batches (a backfill "
            "source the ones it holds), and the next run of this pipeline writes them to each "
            "sink first, in batch order and exactly once, before its live batches. Fix the "
            f"sink(s), then run again; `fanout status --ledger {fan.ledger.__class__.__name__}@"
            f"{id(fan.ledger):x} --pipeline lagged --spool {tmp_path / 'spool'}` shows how far "
            "behind they are."
        )
        assert behind.value.stopped_by == "SIGINT"
        assert fan.ledger.last_committed("lagged", ["down", "good"]) == {"down": None, "good": 1}
    finally:
        fan.close()

    live = _fan(tmp_path / "live", [ScriptedSink("good"), _spec(ScriptedSink("up"))])
    try:
        live.process(frames[0], BatchInfo("lagged", 0, "q"))
        live.stopped("SIGTERM")  # no sink behind: returns
        assert live.catchup._thread is None
    finally:
        live.close()


def test_a_stop_during_the_final_catch_up_is_named_as_such(tmp_path: Path) -> None:
    """A signal during the final catch-up ends it after the write in progress: the sink
    still behind is named with the signal that cut the catch-up short, not as if a whole
    final catch-up had left it behind."""
    from fanout import SinksBehindError

    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _fan(tmp_path, [ScriptedSink("good"), _spec(down)], probe_interval_s=3600)
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(2)}
    try:
        for batch in range(2):
            fan.process(frames[batch], BatchInfo("lagged", batch, "q"))
        _catch_up_from_memory(fan, frames)
        fan.catchup.stop()
        down.always_fail = None
        written = len(down.calls)
        stop = lambda: len(down.calls) > written  # noqa: E731 - the signal after one write
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up(stop=stop, stopped_by=lambda: "SIGTERM")
        assert str(behind.value).startswith(
            "pipeline 'lagged': the run ended with 1 sink(s) behind (stopped by SIGTERM "
            "during the final catch-up):\n  - down: batch 1 (1 batch(es), 2 row(s) in the "
            "spool)"
        )
        assert behind.value.stopped_by == "SIGTERM"
        assert fan.ledger.last_committed("lagged", ["down", "good"]) == {"down": 0, "good": 1}
    finally:
        fan.close()


@pytest.mark.parametrize(
    ("first", "last", "said"),
    [((0, 4), (0, 4), "batch 4"), ((0, 3), (0, 7), "batches 3 to 7"),
     ((2, 3), (2, 7), "batches 3 to 7 of epoch 2"),
     ((0, 8), (1, 2), "batch 8 of epoch 0 to batch 2 of epoch 1")],
)  # fmt: skip
def test_a_sink_behind_says_its_batches(
    first: tuple[int, int], last: tuple[int, int], said: str
) -> None:
    from fanout.contract.lag import SinkBehind

    assert SinkBehind("pg", first, last, 5).batch_range() == said
    assert SinkBehind("new", first, last, 5, spooled=2, rows=9, backfill_from="lake",
                      error="E: a\n\tb").describe() == (
        f"new: {said} (5 batch(es), 9 row(s) in the spool, 3 from its backfill source "
        "'lake'); its last error: E: a b"
    )  # fmt: skip


def test_a_batch_a_fail_fast_sink_failed_waits_for_its_replay_before_the_catch_up(
    tmp_path: Path,
) -> None:
    """Batch 1 is spooled for the lagging sink while a sink without on_failure='lag' fails
    it: Spark has not committed it and may give it up (a checkpoint reset resumes before
    it), so the catch-up writes it only once its replay settles it."""
    from fanout import BatchFailedError

    lake = ScriptedSink("lake")
    pg = ScriptedSink("pg", always_fail=SinkWriteError("refused", sink="pg"))
    fan = _fan(tmp_path, [lake, _spec(pg)], probe_interval_s=3600)
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(2)}
    _catch_up_from_memory(fan, frames)
    try:
        fan.process(frames[0], BatchInfo("lagged", 0, "q"))  # pg lags on 0
        lake.always_fail = SinkWriteError("full", sink="lake")
        with pytest.raises(BatchFailedError, match=r"\(lake\)"):
            fan.process(frames[1], BatchInfo("lagged", 1, "q"))
        fan.catchup.stop()
        assert fan.spool is not None
        assert [(b.batch_id, sorted(b.needed_by)) for b in fan.spool.batches()] == [
            (0, ["pg"]), (1, ["pg"]),
        ]  # fmt: skip

        pg.always_fail = None  # pg is back; lake still fails batch 1
        lags = fan.catch_up(timeout_s=10)
        assert pg.calls[1:] == [(0, 1)]  # batch 0 (settled), not batch 1
        assert (lags["pg"].state, lags["pg"].batches) == ("catching_up", 1)
        assert fan.ledger.last_committed("lagged", ["lake", "pg"]) == {"lake": 0, "pg": 0}
        assert [b.batch_id for b in fan.spool.batches()] == [1]

        lake.always_fail = None  # the replay of batch 1 settles it
        fan.process(frames[1], BatchInfo("lagged", 1, "q"))
        fan.catchup.stop()
        assert fan.catch_up(timeout_s=10)["pg"].state == "live"
        assert pg.calls[1:] == [(0, 1), (1, 1)]
        assert fan.ledger.last_committed("lagged", ["lake", "pg"]) == {"lake": 1, "pg": 1}
        assert fan.spool.size() == (0, 0, 0)
    finally:
        fan.close()


def test_a_batch_every_sink_lagged_on_is_caught_up(tmp_path: Path) -> None:
    """Every sink down: foreachBatch returns (the batch is spooled for all), Spark commits
    it, and the catch-up writes it to each sink once it is back."""
    refused = SinkWriteError("refused", sink="x")
    pg, kafka = ScriptedSink("pg", always_fail=refused), ScriptedSink("kafka", always_fail=refused)
    fan = _fan(tmp_path, [_spec(pg), _spec(kafka)], probe_interval_s=3600)
    frames = {0: SchemaFrame([1, 2])}
    _catch_up_from_memory(fan, frames)
    try:
        assert fan.process(frames[0], BatchInfo("lagged", 0, "q")) == {}
        fan.catchup.stop()
        pg.always_fail = kafka.always_fail = None
        lags = fan.catch_up(timeout_s=10)
        assert {n: lag.state for n, lag in lags.items()} == {"pg": "live", "kafka": "live"}
        assert (pg.calls[1:], kafka.calls[1:]) == ([(0, 1)], [(0, 1)])
        assert fan.ledger.last_committed("lagged", ["pg", "kafka"]) == {"pg": 0, "kafka": 0}
    finally:
        fan.close()


def test_an_unsettled_batch_of_an_epoch_before_a_reset_is_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Epoch 0 ends with batch 1 failed by a fail-fast sink and spooled for the lagging
    one; the checkpoint is reset (new epoch), resuming after batch 0 as `fanout recover`
    says, so epoch 1 reads batch 1's rows again: the spooled epoch-0 batch 1 is never
    written (the sink would hold its rows twice), and it leaves the spool."""
    from fanout import BatchFailedError

    ledger = MemoryLedger()
    lake = ScriptedSink("lake")
    pg = ScriptedSink("pg", always_fail=SinkWriteError("refused", sink="pg"))
    spool = str(tmp_path / "spool")
    old = FanOut("p", ledger, [lake, _spec(pg)], backoff_s=0, spool=spool, probe_interval_s=3600)
    old.process(SchemaFrame([0]), BatchInfo("p", 0, "q1"))  # pg lags on 0
    lake.always_fail = SinkWriteError("full", sink="lake")
    with pytest.raises(BatchFailedError):
        old.process(SchemaFrame([1]), BatchInfo("p", 1, "q1"))
    old.close()

    lake.always_fail = pg.always_fail = None
    fan = FanOut("p", ledger, [lake, _spec(pg)], backoff_s=0, spool=spool, probe_interval_s=3600,
                 on_checkpoint_reset="new_epoch")  # fmt: skip
    frames = {(0, 0): SchemaFrame([0]), (1, 0): SchemaFrame([1])}

    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
        assert spooled is not None, key
        return frames[key], spooled.info()

    fan.catchup._reader.read = read  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, "fanout"):
            fan.process(frames[(1, 0)], BatchInfo("p", 0, "q2"))  # epoch 1: batch 1's rows
            fan.catchup.stop()
            assert fan.catch_up(timeout_s=10)["pg"].state == "live"
        written = [(b.info.epoch, b.info.batch_id) for b in pg.batches[1:]]  # [0]: failed live
        assert written == [(0, 0), (1, 0)]
        assert pg.batches[-1].df is frames[(1, 0)]
        assert ledger.last_committed("p", ["lake", "pg"], 0) == {"lake": 0, "pg": 0}
        assert ledger.last_committed("p", ["lake", "pg"], 1) == {"lake": 0, "pg": 0}
        assert fan.spool is not None and fan.spool.size() == (0, 0, 0)
        given_up = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
        assert given_up == [
            "pipeline p: batch 1 of epoch 0 was never committed by Spark before the checkpoint "
            "was replaced (epoch 1 now): it is given up, not written from the spool to the "
            "sinks that lagged on it; the new checkpoint reads its rows again when it starts "
            "where `fanout recover` said"
        ]
    finally:
        fan.close()


def test_a_batch_a_sink_added_since_never_saw_is_settled_by_the_checkpoints_commit(
    tmp_path: Path,
) -> None:
    """Batch 0 ran (spooled for the lagging sink) before sink "new" was configured: "new"
    has no mark of it, so the ledger cannot tell it settled; the running query's
    checkpoint can (``commits/0``), and until it does the batch waits."""
    ledger = MemoryLedger()
    lake = ScriptedSink("lake")
    pg = ScriptedSink("pg", always_fail=SinkWriteError("refused", sink="pg"))
    spool = str(tmp_path / "spool")
    first = FanOut("p", ledger, [lake, _spec(pg)], backoff_s=0, spool=spool, probe_interval_s=3600)
    first.process(SchemaFrame([5]), BatchInfo("p", 0, "q"))  # pg lags on 0
    first.close()

    pg.always_fail = None
    fan = FanOut("p", ledger, [lake, _spec(pg), ScriptedSink("new")], backoff_s=0, spool=spool,
                 probe_interval_s=3600)  # fmt: skip
    _catch_up_from_memory(fan, {0: SchemaFrame([5])})
    fan.catchup.stop()
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "commits").mkdir(parents=True)
    fan.lagging.checkpoint = (0, str(checkpoint))  # as start_catch_up sets it
    try:
        assert fan.catch_up(timeout_s=10)["pg"].batches == 1
        assert pg.calls == [(0, 1)]  # the failed live attempt only: batch 0 waits
        (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        assert fan.catch_up(timeout_s=10)["pg"].state == "live"
        assert pg.calls == [(0, 1), (0, 1)]
        assert ledger.last_committed("p", ["lake", "pg", "new"]) == {
            "lake": 0, "pg": 0, "new": None,
        }  # fmt: skip
    finally:
        fan.close()


def test_a_replayed_batch_past_max_lag_age_settles_instead_of_stopping_the_query(
    tmp_path: Path,
) -> None:
    """The lagging sink's only missed batch is the one being replayed, older than its
    max_lag age: the drain cannot write it (not settled until this replay returns), and
    that is no reason to stop the query; the catch-up writes it once the batch returns."""
    from fanout import BatchFailedError

    lake = ScriptedSink("lake", always_fail=SinkWriteError("full", sink="lake"))
    pg = ScriptedSink("pg", always_fail=SinkWriteError("refused", sink="pg"))
    fan = _fan(tmp_path, [lake, _spec(pg, max_lag={"age_s": 0.2})], probe_interval_s=3600)
    frames = {0: SchemaFrame([7])}
    _catch_up_from_memory(fan, frames)
    try:
        with pytest.raises(BatchFailedError):
            fan.process(frames[0], BatchInfo("lagged", 0, "q"))
        time.sleep(0.3)  # the spooled batch 0 is now older than the max_lag age
        lake.always_fail = pg.always_fail = None
        fan.catchup.stop()
        assert list(fan.process(frames[0], BatchInfo("lagged", 0, "q"))) == ["lake"]
        assert fan.catch_up(timeout_s=10)["pg"].state == "live"
        assert pg.calls == [(0, 1), (0, 1)]
        assert fan.ledger.last_committed("lagged", ["lake", "pg"]) == {"lake": 0, "pg": 0}
    finally:
        fan.close()


class _Stamps:
    """A dead-letter target recording, per call, the batch and whether it was handed a
    route stamp (each stamp is a read of a real target)."""

    kind = "stamps"

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def describe(self) -> str:
        return "stamps in memory"

    def write(
        self, batch: Any, letters: Any, *, source: str, partition: Any = None, route: Any = None
    ) -> int:
        self.calls.append((batch.batch_id, route is not None))
        return len(letters)


class _StampKind:
    @hookimpl
    def fanout_dead_letter_kinds(self) -> dict[str, Any]:
        return {"stamps": lambda location, sink: sink.target}


def test_the_catch_up_hands_the_identity_stamp_only_until_the_sinks_first_mark(
    tmp_path: Path,
) -> None:
    """A lagging sink with a dead-letter target and no route: its first write in this
    FanOut (live batch 0, failed; then the catch-up's batch 0) may be a batch an earlier
    process attempted, so its target gets the identity's stamp (a read of the target);
    once batch 0 is marked, the catch-up's batches 1 and 2 were attempted by no one else:
    no stamp, and (no letters either) the target is not called."""
    good = ScriptedSink("good")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    target = _Stamps()
    down.target, down.dead_letter = target, "stamps:memory"  # type: ignore[attr-defined]
    fan = _fan(tmp_path, [good, _spec(down)], probe_interval_s=3600, plugins=[_StampKind()])
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(3)}
    try:
        for batch in range(3):
            fan.process(frames[batch], BatchInfo("lagged", batch, "q"))
        assert target.calls == [(0, True)] * len(down.calls)  # every attempt of batch 0
        target.calls.clear()

        down.always_fail = None
        _catch_up_from_memory(fan, frames)
        fan.catchup.stop()
        assert fan.catch_up(timeout_s=10)["down"].state == "live"
        assert down.calls[-3:] == [(0, 1), (1, 1), (2, 1)]
        assert target.calls == [(0, True)]  # batches 1 and 2: not called, nothing to write
    finally:
        fan.close()


def _failed_first_batch(ledger: Ledger, spool: str) -> tuple[ScriptedSink, ScriptedSink]:
    """Epoch 0's first batch: pg (lagging) is down and spools it, lake (fail-fast) fails
    it for good, so no sink has a mark in epoch 0 and Spark never commits the batch.
    Returns lake and pg, both still failing."""
    from fanout import BatchFailedError

    lake = ScriptedSink("lake", always_fail=SinkWriteError("full", sink="lake"))
    pg = ScriptedSink("pg", always_fail=SinkWriteError("refused", sink="pg"))
    old = FanOut("p", ledger, [lake, _spec(pg)], backoff_s=0, spool=spool, probe_interval_s=3600)
    with pytest.raises(BatchFailedError):
        old.process(SchemaFrame([7, 8]), BatchInfo("p", 0, "q1"))
    old.close()
    return lake, pg


def test_a_first_batch_a_fail_fast_sink_failed_is_given_up_after_a_reset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The fail-fast sink has no mark in epoch 0 because it failed the epoch's first batch,
    not because it was added since: the spool recorded it among the batch's sinks, so the
    batch is not settled, and after the reset (resuming before batch 0, as `fanout
    recover` says) it is given up; written, pg would hold rows 7 and 8 twice."""
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    _failed_first_batch(ledger, spool)
    lake, pg = ScriptedSink("lake"), ScriptedSink("pg")
    fan = FanOut("p", ledger, [lake, _spec(pg)], backoff_s=0, spool=spool, probe_interval_s=3600,
                 on_checkpoint_reset="new_epoch")  # fmt: skip
    assert fan.spool is not None
    [spooled] = fan.spool.batches()
    assert (spooled.key, spooled.needed_by, spooled.party) == ((0, 0), {"pg"}, {"lake", "pg"})
    again = SchemaFrame([7, 8])  # epoch 1 reads batch 0's rows again
    fan.catchup._reader.read = lambda sink, key: (again, spooled.info())  # type: ignore[method-assign,assignment]
    try:
        with caplog.at_level(logging.WARNING, "fanout"):
            fan.process(again, BatchInfo("p", 0, "q2"))
            fan.catchup.stop()
            assert fan.catch_up(timeout_s=10)["pg"].state == "live"
        assert [(b.info.epoch, b.info.batch_id) for b in pg.batches] == [(1, 0)]
        assert [(b.info.epoch, b.info.batch_id) for b in lake.batches] == [(1, 0)]
        assert ledger.last_committed("p", ["lake", "pg"], 0) == {"lake": None, "pg": None}
        assert ledger.last_committed("p", ["lake", "pg"], 1) == {"lake": 0, "pg": 0}
        assert fan.spool.size() == (0, 0, 0)
        given_up = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
        assert given_up == [
            "pipeline p: batch 0 of epoch 0 was never committed by Spark before the checkpoint "
            "was replaced (epoch 1 now): it is given up, not written from the spool to the "
            "sinks that lagged on it; the new checkpoint reads its rows again when it starts "
            "where `fanout recover` said"
        ]
    finally:
        fan.close()


def _as_an_older_version_wrote_it(index_path: str) -> None:
    """Rewrite the spool's index without the ``party`` column, as versions before it did."""
    from deltalake import DeltaTable, write_deltalake

    rows = DeltaTable(index_path).to_pyarrow_table().drop_columns(["party"])
    write_deltalake(index_path, rows, mode="overwrite", schema_mode="overwrite")


def test_a_batch_every_sink_lagged_on_in_an_older_versions_spool_is_caught_up_after_a_reset(
    tmp_path: Path,
) -> None:
    """An index row from before the spool recorded a batch's sinks: the sinks it is spooled
    for and those with a mark in its epoch took part. Every sink lagged on batch 0 (all
    down), so each holds it by the spool: settled, and written to both after the reset;
    the next spooling adds the column to the old index."""
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    refused = SinkWriteError("refused", sink="x")
    pg, kafka = ScriptedSink("pg", always_fail=refused), ScriptedSink("kafka", always_fail=refused)
    old = FanOut("p", ledger, [_spec(pg), _spec(kafka)], backoff_s=0, spool=spool,
                 probe_interval_s=3600)  # fmt: skip
    assert old.process(SchemaFrame([1, 2]), BatchInfo("p", 0, "q1")) == {}
    old.close()
    _as_an_older_version_wrote_it(f"{spool}/index")

    pg.always_fail = None  # kafka still down: batch 0 of epoch 1 is spooled for it
    fan = FanOut("p", ledger, [_spec(pg), _spec(kafka)], backoff_s=0, spool=spool,
                 probe_interval_s=3600, on_checkpoint_reset="new_epoch")  # fmt: skip
    assert fan.spool is not None
    [spooled] = fan.spool.batches()
    assert (spooled.key, spooled.needed_by, spooled.party) == ((0, 0), {"pg", "kafka"}, None)
    frames = {(0, 0): SchemaFrame([1, 2]), (1, 0): SchemaFrame([3])}
    fan.catchup._reader.read = lambda sink, key: (frames[key], fan.spool.get(key).info())  # type: ignore[method-assign,assignment,union-attr]
    try:
        fan.process(frames[(1, 0)], BatchInfo("p", 0, "q2"))
        fan.catchup.stop()
        assert [(b.key, b.party) for b in fan.spool.batches()] == [
            ((0, 0), None), ((1, 0), {"pg", "kafka"}),
        ]  # fmt: skip
        kafka.always_fail = None
        lags = fan.catch_up(timeout_s=10)
        assert {n: lag.state for n, lag in lags.items()} == {"pg": "live", "kafka": "live"}
        for sink in (pg, kafka):  # before: failed attempts (kafka's may include a probe)
            written = [(b.info.epoch, b.info.batch_id, b.df) for b in sink.batches[-2:]]
            assert written == [(0, 0, frames[(0, 0)]), (1, 0, frames[(1, 0)])]
        assert ledger.last_committed("p", ["pg", "kafka"], 0) == {"pg": 0, "kafka": 0}
        assert fan.spool.size() == (0, 0, 0)
    finally:
        fan.close()


def test_status_shows_a_batch_given_up_with_the_checkpoint_as_given_up_not_behind(
    tmp_path: Path,
) -> None:
    """Epoch 0's first batch, failed by the fail-fast sink and spooled for pg, stays in the
    spool until a start releases it; meanwhile `fanout status` says it is given up (the
    catch-up's rule), and counts only epoch 1's batch 0 as pg's lag."""
    from fanout.app.status import report
    from fanout.ledger.delta import DeltaLedger

    ledger, spool = DeltaLedger(str(tmp_path / "ledger")), str(tmp_path / "spool")
    lake, pg = _failed_first_batch(ledger, spool)
    lake.always_fail = None  # the reset: lake writes epoch 1's batch 0, pg is still down
    fan = FanOut("p", ledger, [lake, _spec(pg)], backoff_s=0, spool=spool, probe_interval_s=3600,
                 on_checkpoint_reset="new_epoch")  # fmt: skip
    try:
        fan.process(SchemaFrame([7, 8, 9]), BatchInfo("p", 0, "q2"))
    finally:
        fan.close()
    assert fan.spool is not None
    assert [(b.key, sorted(b.needed_by)) for b in fan.spool.batches()] == [
        ((0, 0), ["pg"]), ((1, 0), ["pg"]),
    ]  # fmt: skip

    status = {s["sink"]: s for s in json.loads(report(ledger, "p", as_json=True, spool=spool))}
    assert (status["pg"]["state"], status["pg"]["lag_batches"], status["pg"]["lag_rows"]) == (
        "lagging", 1, 3,
    )  # fmt: skip
    assert status["pg"]["given_up"] == [{"epoch": 0, "batches": [0], "rows": 2, "current_epoch": 1}]
    assert (status["lake"]["lag_batches"], status["lake"]["given_up"]) == (0, [])
    text = report(ledger, "p", spool=spool)
    assert text.splitlines()[-4:-2] == [
        "",
        "pipeline p, pg: 1 batch(es) / 2 row(s) of epoch 0 (0) given up, not behind: Spark "
        "never committed them before the checkpoint was replaced (epoch 1 now), so they are "
        "not written to the sink (the new checkpoint reads their rows again where `fanout "
        "recover` said); the next start releases them from the spool",
    ]


def test_a_lost_targets_per_batch_warning_is_short_and_says_nothing_was_retried() -> None:
    """The refusal, with its ways on, is logged in full once when found; each batch the
    sink misses says so in a line, not the whole refusal again, nor "after its retries"."""
    from fanout import TargetLostError
    from fanout.steps.lag_steps import _why_behind

    lost = TargetLostError("table 'orders' no longer holds batch 1\nWays on: ...", sink="pg",
                           batch_id=2)  # fmt: skip
    assert _why_behind(lost) == (
        "wrote nothing: its target lost batches the ledger marks written there "
        "(TargetLostError at batch 2, logged in full when found; `fanout status` shows it "
        "and the ways on)"
    )
    failed = SinkWriteError("refused", sink="pg", batch_id=2)
    assert _why_behind(failed) == "failed after its retries: sink 'pg', batch 2: refused"
