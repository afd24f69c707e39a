"""``fanout run`` on SIGINT/SIGTERM: how the stop ends (between batches, the batch finished,
the batch failed, the batch abandoned), the exit code of each, and a second signal."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fanout.app import runner
from fanout.app.config import PipelineConfig
from fanout.contract.batch import BatchInfo
from fanout.errors import BatchFailedError, ConfigurationError, StopRequestedError
from fanout.steps.stop_gate import StopGate

ROOT = Path(__file__).resolve().parents[2]


class _Query:
    """A streaming query: ``stop()`` takes ``stop_s`` (for ever: ``None``) and is recorded."""

    id = "query-1"
    recentProgress: list[Any] = []

    def __init__(self, stop_s: float | None = 0.0, error: Exception | None = None) -> None:
        self.stop_s, self.error = stop_s, error
        self.stops: list[float] = []
        self.isActive = True

    def stop(self) -> None:
        self.stops.append(time.monotonic())
        if self.stop_s is None:
            threading.Event().wait()
        time.sleep(self.stop_s)
        self.isActive = False

    def exception(self) -> Exception | None:
        return self.error


def _config(tmp_path: Path, stop_timeout_s: float = 5) -> PipelineConfig:
    return PipelineConfig("p", str(tmp_path / "ledger"), str(tmp_path / "cp"), {}, [],
                          stop_timeout_s=stop_timeout_s)  # fmt: skip


def _in_flight(batch: int) -> runner.BatchTracker:
    tracker = runner.BatchTracker()
    tracker.fanout_batch_start(BatchInfo("p", batch, "q"), ["a"], [])
    return tracker


def _later(seconds: float, action: Any) -> None:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()


def test_a_stop_between_batches_stops_the_query(tmp_path: Path) -> None:
    tracker, query, out = runner.BatchTracker(), _Query(), io.StringIO()
    tracker.last_committed = 4

    outcome = runner._stop(query, tracker, _config(tmp_path), "SIGINT", out)

    assert (outcome, len(query.stops)) == ("between", 1)
    assert out.getvalue() == "SIGINT: stopped between batches; last committed batch 4\n"


def test_a_stop_in_a_run_that_ran_no_batch_says_so(tmp_path: Path) -> None:
    tracker, query, out = runner.BatchTracker(), _Query(), io.StringIO()

    outcome = runner._stop(query, tracker, _config(tmp_path), "SIGTERM", out)

    assert (outcome, len(query.stops)) == ("between", 1)
    assert out.getvalue() == "SIGTERM: stopped between batches; no batch ran in this run\n"


def test_a_batch_finishing_within_the_timeout_is_waited_for(tmp_path: Path) -> None:
    tracker, query, out = _in_flight(7), _Query(), io.StringIO()
    ended = []
    _later(0.3, lambda: (ended.append(time.monotonic()),
                         tracker.fanout_batch_end(BatchInfo("p", 7, "q"), {})))  # fmt: skip

    outcome = runner._stop(query, tracker, _config(tmp_path), "SIGTERM", out)

    assert outcome == "finished"
    assert len(query.stops) == 1 and query.stops[0] >= ended[0], "stop() before the batch ended"
    assert out.getvalue() == (
        "SIGTERM: batch 7 in flight; waiting up to 5 s for it to finish (a second Ctrl-C or "
        "SIGTERM ends the run at once)\n"
        "SIGTERM: batch 7 finished; stopped cleanly\n"
    )


def test_a_batch_still_running_at_the_timeout_is_abandoned_without_stopping_spark(
    tmp_path: Path,
) -> None:
    tracker, query, out = _in_flight(7), _Query(stop_s=None), io.StringIO()
    clock = time.monotonic()

    outcome = runner._stop(query, tracker, _config(tmp_path, 0.5), "SIGTERM", out)

    took = time.monotonic() - clock
    assert (outcome, query.stops) == ("abandoned", [])  # stop() would wait for the batch
    assert 0.5 <= took < 2, took
    assert out.getvalue().splitlines()[1] == (
        "SIGTERM: batch 7 still running after 1 s (stop_timeout_s); abandoned: fanout exits "
        "without waiting for it, Spark replays it on restart and fanout skips the sinks that "
        "committed it"
    )


def test_a_stop_spark_does_not_finish_in_time_is_abandoned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch finished, but Spark began the next one before stop(): stop() waits for it."""
    monkeypatch.setattr(runner, "STOP_GRACE_S", 0.3)
    tracker, query, out = _in_flight(7), _Query(stop_s=None), io.StringIO()
    tracker.fanout_batch_end(BatchInfo("p", 7, "q"), {})
    tracker.fanout_batch_start(BatchInfo("p", 8, "q"), ["a"], [])
    tracker.in_flight = 8  # the next batch began before the signal was handled
    tracker.idle.set()

    outcome = runner._stop(query, tracker, _config(tmp_path, 0.2), "SIGINT", out)

    assert (outcome, len(query.stops)) == ("abandoned", 1)
    assert "SIGINT: batch 8 still running after" in out.getvalue()


def test_a_batch_failing_during_the_wait_is_a_failure(tmp_path: Path) -> None:
    tracker, query, out = _in_flight(7), _Query(), io.StringIO()
    error = BatchFailedError("p", 7, {"a": RuntimeError("sink 'a' is down")})
    _later(0.2, lambda: tracker.fanout_batch_failed(BatchInfo("p", 7, "q"), error))

    outcome = runner._stop(query, tracker, _config(tmp_path), "SIGTERM", out)

    assert (outcome, len(query.stops)) == ("failed", 1)
    assert out.getvalue().splitlines()[1] == (
        "SIGTERM: batch 7 failed while the stop waited for it"
    )


def test_a_query_failing_while_it_stops_between_batches_is_a_failure(tmp_path: Path) -> None:
    query, out = _Query(error=RuntimeError("the source went away")), io.StringIO()

    outcome = runner._stop(query, runner.BatchTracker(), _config(tmp_path), "SIGTERM", out)

    assert outcome == "failed"
    assert out.getvalue() == "SIGTERM: the query failed while it stopped\n"


# -- the stop gate: a batch Spark begins during the stop (the source has a backlog) ---------


def _refusal_text(batch: int) -> str:
    """What Spark's query error says when foreachBatch raised the gate's refusal."""
    return (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent "
        'call last):\n  File "fan_out.py", line 1, in __call__\n'
        f"fanout.errors.StopRequestedError: {StopRequestedError('p', batch)}\n\n"
        "=== Streaming Query ===\nIdentifier: p"
    )


class _RefusingQuery(_Query):
    """Spark begins batch ``batch`` while ``stop()`` runs: the closed gate refuses it, and
    the query's error is the refusal (``error_text``: another one)."""

    def __init__(self, gate: StopGate, batch: int, error_text: str | None = None) -> None:
        super().__init__()
        self.gate, self.batch, self.error_text = gate, batch, error_text

    def stop(self) -> None:
        with pytest.raises(StopRequestedError):
            self.gate.enter(self.batch)
        self.error = RuntimeError(self.error_text or _refusal_text(self.batch))
        super().stop()


def test_the_gate_refuses_every_batch_once_closed_and_names_the_first() -> None:
    gate = StopGate("orders")
    gate.enter(3)  # open: a FanOut never asked to stop behaves as before
    assert (gate.inside, gate.closed) == (3, False)
    gate.leave()
    assert gate.close() is None and gate.closed
    with pytest.raises(StopRequestedError) as refused:
        gate.enter(4)
    with pytest.raises(StopRequestedError):
        gate.enter(5)
    assert (gate.refused, gate.inside, refused.value.batch_id) == (4, None, 4)
    assert str(refused.value) == (
        "pipeline 'orders', batch 4: refused, a stop was requested before the batch began; "
        "nothing of it was written, and Spark runs it again when the query starts next "
        "(nothing to do)"
    )
    import pickle

    assert str(pickle.loads(pickle.dumps(refused.value))) == str(refused.value)


def test_the_gate_closed_with_a_batch_inside_names_it_and_waits_for_it() -> None:
    gate = StopGate("p")
    gate.enter(7)
    assert gate.close() == 7
    assert not gate.wait_empty(0.05)
    _later(0.1, gate.leave)
    assert gate.wait_empty(5) and gate.inside is None and gate.refused is None


def test_a_batch_spark_began_during_the_stop_is_refused_and_the_stop_is_clean(
    tmp_path: Path,
) -> None:
    """Batch 8 committed, the tracker idle: Spark begins batch 9 (a backlog) while
    ``query.stop()`` runs. Before the gate, stop() interrupted its jobs and the run exited
    1 ("the query failed while it stopped"); now it is refused before it writes, and the
    stop says it runs at the next start."""
    tracker, gate, out = runner.BatchTracker(), StopGate("p"), io.StringIO()
    tracker.last_committed = 8
    query = _RefusingQuery(gate, 9)

    outcome = runner._stop(query, tracker, _config(tmp_path), "SIGTERM", out, gate)

    assert (outcome, len(query.stops), gate.refused) == ("between", 1, 9)
    assert out.getvalue() == (
        "SIGTERM: stopped before batch 9 began (it runs at the next start); "
        "last committed batch 8\n"
    )


def test_a_batch_refused_after_the_one_waited_for_is_said_after_it(tmp_path: Path) -> None:
    tracker, gate, out = _in_flight(7), StopGate("p"), io.StringIO()
    query = _RefusingQuery(gate, 8)
    _later(0.2, lambda: tracker.fanout_batch_end(BatchInfo("p", 7, "q"), {}))

    outcome = runner._stop(query, tracker, _config(tmp_path), "SIGINT", out, gate)

    assert outcome == "finished"
    assert out.getvalue().splitlines()[1] == (
        "SIGINT: batch 7 finished; stopped cleanly before batch 8 began (it runs at the next start)"
    )


def test_a_batch_inside_the_call_the_tracker_has_not_seen_is_waited_for(
    tmp_path: Path,
) -> None:
    """The signal came just after Spark handed batch 9 over, before fanout's tracker saw
    it (idle): stop() then interrupted it. The gate knows it: it is waited for, and
    stop() called only once it is out of the call."""
    tracker, gate, query, out = runner.BatchTracker(), StopGate("p"), _Query(), io.StringIO()
    tracker.last_committed = 8
    gate.enter(9)
    left: list[float] = []

    def batch_ends() -> None:
        info = BatchInfo("p", 9, "q")
        tracker.fanout_batch_start(info, ["a"], [])
        tracker.fanout_batch_end(info, {})
        left.append(time.monotonic())
        gate.leave()

    _later(0.3, batch_ends)

    outcome = runner._stop(query, tracker, _config(tmp_path), "SIGTERM", out, gate)

    assert outcome == "finished"
    assert len(query.stops) == 1 and query.stops[0] >= left[0], "stop() before the batch left"
    assert out.getvalue() == (
        "SIGTERM: batch 9 in flight; waiting up to 5 s for it to finish (a second Ctrl-C or "
        "SIGTERM ends the run at once)\n"
        "SIGTERM: batch 9 finished; stopped cleanly\n"
    )


def test_a_batch_inside_the_call_past_the_timeout_is_abandoned(tmp_path: Path) -> None:
    tracker, gate, query, out = runner.BatchTracker(), StopGate("p"), _Query(), io.StringIO()
    gate.enter(9)  # never leaves

    outcome = runner._stop(query, tracker, _config(tmp_path, 0.3), "SIGTERM", out, gate)

    assert (outcome, query.stops) == ("abandoned", [])
    assert "SIGTERM: batch 9 still running after" in out.getvalue()


def test_another_error_during_a_stop_that_refused_a_batch_is_a_failure(
    tmp_path: Path,
) -> None:
    gate, out = StopGate("p"), io.StringIO()
    other = _refusal_text(9) + "\nfanout.errors.LedgerError: the ledger cannot be written"
    query = _RefusingQuery(gate, 9, other)

    outcome = runner._stop(query, runner.BatchTracker(), _config(tmp_path), "SIGTERM", out, gate)

    assert outcome == "failed"
    assert out.getvalue() == "SIGTERM: the query failed while it stopped\n"


def test_the_refusals_text_without_a_refused_batch_is_a_failure(tmp_path: Path) -> None:
    """Only this run's gate refusing a batch makes the refusal's error a clean stop."""
    query, out = _Query(error=RuntimeError(_refusal_text(9))), io.StringIO()

    outcome = runner._stop(
        query, runner.BatchTracker(), _config(tmp_path), "SIGTERM", out, StopGate("p")
    )

    assert outcome == "failed"


def test_a_batch_failing_after_its_wait_while_the_next_is_refused_is_a_failure(
    tmp_path: Path,
) -> None:
    tracker, gate, out = _in_flight(7), StopGate("p"), io.StringIO()
    error = BatchFailedError("p", 7, {"a": RuntimeError("sink 'a' is down")})
    _later(0.2, lambda: tracker.fanout_batch_failed(BatchInfo("p", 7, "q"), error))

    outcome = runner._stop(_RefusingQuery(gate, 8), tracker, _config(tmp_path), "SIGTERM",
                           out, gate)  # fmt: skip

    assert outcome == "failed"
    assert out.getvalue().splitlines()[1] == "SIGTERM: batch 7 failed while the stop waited for it"


# -- run(): exit codes, the second signal, a query that cannot start ------------------------


def _fake_run(
    monkeypatch: pytest.MonkeyPatch, config: PipelineConfig, start: Any
) -> dict[str, Any]:
    """Replace everything ``run`` builds; ``start(tracker)`` gives the query."""
    made: dict[str, Any] = {"closed": 0, "gate": StopGate("p")}

    class _Fan:
        specs: ClassVar[dict[str, Any]] = {}  # no sink: nothing to check before the start
        unopened = ()
        stop_gate = made["gate"]

        def check_source(self, df: Any) -> None:
            """No sink: nothing to check before the start."""

        def behind(self) -> list[Any]:
            return []

        def start_catch_up(self, query: Any) -> str | None:
            made["catch_up_started"] = query
            return None

        def close(self) -> None:
            made["closed"] += 1

    def build_fanout(spark: Any, config: Any, plugins: Any = (), **kw: Any) -> Any:
        made["tracker"] = plugins[0]
        return _Fan()

    monkeypatch.setattr(runner, "load_pipeline", lambda path: config)
    monkeypatch.setattr(runner, "build_session", lambda config: None)
    monkeypatch.setattr(runner, "_quiet_query_errors", lambda spark: None)
    monkeypatch.setattr(runner, "build_source", lambda spark, config: None)
    monkeypatch.setattr(runner, "build_fanout", build_fanout)
    monkeypatch.setattr(runner, "_start", lambda df, fan, config: start(made["tracker"]))
    return made


class _Left(Exception):
    """What the test's ``_leave`` raises instead of ending the process."""


def test_run_reports_a_batch_failing_during_the_stop_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    error = BatchFailedError("p", 7, {"a": RuntimeError("sink 'a' is down")})
    query = _Query(error=RuntimeError("batch 7 failed"))

    def start(tracker: runner.BatchTracker) -> _Query:
        tracker.fanout_batch_start(BatchInfo("p", 7, "q"), ["a"], [])
        _later(0.1, lambda: os.kill(os.getpid(), signal.SIGTERM))
        _later(0.8, lambda: tracker.fanout_batch_failed(BatchInfo("p", 7, "q"), error))
        return query

    made = _fake_run(monkeypatch, _config(tmp_path), start)
    out = io.StringIO()

    code = runner.run("p.toml", out)

    lines = out.getvalue().splitlines()
    assert code == 1 and made["closed"] == 1
    assert lines[2:4] == ["SIGTERM: batch 7 failed while the stop waited for it",
                          "pipeline 'p': 0 batches, 0 rows in"]  # fmt: skip
    assert out.getvalue().endswith(f"pipeline 'p' failed: {error}\n{lines[-1]}\n")
    trace = lines[-1].removeprefix("(the full trace, Spark's included: ").removesuffix(")")
    assert "batch 7 failed" in Path(trace).read_text()
    Path(trace).unlink()


def test_run_exits_0_when_the_stop_refused_a_batch_spark_began(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def start(tracker: runner.BatchTracker) -> _Query:
        tracker.last_committed = 4
        _later(0.1, lambda: os.kill(os.getpid(), signal.SIGTERM))
        return _RefusingQuery(made["gate"], 5)

    made = _fake_run(monkeypatch, _config(tmp_path), start)
    monkeypatch.setattr(runner, "_stopped", lambda fan, signame, out: 0)
    out = io.StringIO()

    code = runner.run("p.toml", out)

    assert (code, made["closed"]) == (0, 1)
    assert out.getvalue().splitlines()[1] == (
        "SIGTERM: stopped before batch 5 began (it runs at the next start); last committed batch 4"
    )
    assert "failed" not in out.getvalue()


def test_run_leaves_at_once_with_128_plus_the_signal_when_it_abandons_a_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    handlers: list[Any] = []

    def start(tracker: runner.BatchTracker) -> _Query:
        tracker.fanout_batch_start(BatchInfo("p", 7, "q"), ["a"], [])
        _later(0.1, lambda: os.kill(os.getpid(), signal.SIGINT))
        # during the wait, a second signal would end the process: default handling
        _later(0.5, lambda: handlers.extend(signal.getsignal(s) for s in runner.STOP_SIGNALS))
        return _Query(stop_s=None)

    def leave(code: int) -> None:
        raise _Left(code)

    made = _fake_run(monkeypatch, _config(tmp_path, 1), start)
    monkeypatch.setattr(runner, "_leave", leave)
    before = [signal.getsignal(s) for s in runner.STOP_SIGNALS]

    with pytest.raises(_Left) as left:
        runner.run("p.toml", io.StringIO())

    assert left.value.args == (128 + signal.SIGINT,)
    assert handlers == [signal.SIG_DFL, signal.SIG_DFL]
    assert [signal.getsignal(s) for s in runner.STOP_SIGNALS] == before
    assert made["closed"] == 1  # here only: os._exit runs no finally


def test_a_query_that_cannot_start_closes_the_fanout_and_restores_the_handlers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def start(tracker: runner.BatchTracker) -> _Query:
        raise RuntimeError("the checkpoint location cannot be written")

    made = _fake_run(monkeypatch, _config(tmp_path), start)
    before = [signal.getsignal(s) for s in runner.STOP_SIGNALS]

    with pytest.raises(RuntimeError, match="checkpoint location"):
        runner.run("p.toml", io.StringIO())

    assert made["closed"] == 1
    assert [signal.getsignal(s) for s in runner.STOP_SIGNALS] == before


# -- a real process: the abandoned stop's exit, and a second signal ------------------------

_PROCESS = textwrap.dedent(
    """
    import sys, threading, time
    from fanout.app import runner
    from fanout.app.config import PipelineConfig
    from fanout.contract.batch import BatchInfo
    from fanout.steps.stop_gate import StopGate

    class Query:  # batch 3 runs for ever, and so does stop(), as with a sink that hangs
        id, recentProgress, isActive = "q", [], True
        def stop(self): threading.Event().wait()
        def exception(self): return None

    class Fan:
        specs, unopened, stop_gate = {}, (), StopGate("p")
        def behind(self): return []
        def start_catch_up(self, query): return None
        def check_source(self, df): return None
        def close(self): raise AssertionError("closed while its batch runs")

    def build_fanout(spark, config, plugins=(), **kw):
        plugins[0].fanout_batch_start(BatchInfo("p", 3, "q"), ["a"], [])
        return Fan()

    config = PipelineConfig("p", "l", "c", {}, [], stop_timeout_s=float(sys.argv[1]))
    runner.load_pipeline = lambda path: config
    runner.build_session = runner.build_source = lambda *a: None
    runner._quiet_query_errors = lambda spark: None
    runner.build_fanout = build_fanout
    runner._start = lambda df, fan, config: Query()
    runner.run("p.toml")
    """
)


def _process(stop_timeout_s: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    child = subprocess.Popen(
        [sys.executable, "-c", _PROCESS, str(stop_timeout_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert child.stdout is not None
    assert "started" in child.stdout.readline()
    return child


def _ended(child: subprocess.Popen[str]) -> str:
    """The rest of the child's output once it ended (killed if it does not in 30 s)."""
    try:
        return child.communicate(timeout=30)[0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_an_abandoned_batch_ends_the_process_with_128_plus_the_signal() -> None:
    child = _process(1)
    child.send_signal(signal.SIGTERM)
    rest = _ended(child)
    assert child.returncode == 128 + signal.SIGTERM, rest
    assert rest.splitlines() == [
        "SIGTERM: batch 3 in flight; waiting up to 1 s for it to finish (a second Ctrl-C or "
        "SIGTERM ends the run at once)",
        "SIGTERM: batch 3 still running after 1 s (stop_timeout_s); abandoned: fanout exits "
        "without waiting for it, Spark replays it on restart and fanout skips the sinks that "
        "committed it",
        "pipeline 'p': 0 batches, 0 rows in",
    ]


def test_a_second_signal_ends_the_process_at_once() -> None:
    child = _process(600)
    child.send_signal(signal.SIGINT)
    assert child.stdout is not None
    try:
        assert "waiting up to 600 s" in child.stdout.readline()
    except BaseException:
        child.kill()
        raise
    child.send_signal(signal.SIGINT)
    clock = time.monotonic()
    _ended(child)
    assert (child.returncode, time.monotonic() - clock < 10) == (-signal.SIGINT, True)


def _failed_run(
    tmp_path: Path, failures: dict[str, Exception], path: Path | None = None
) -> list[str]:
    """The lines `fanout run` ends with when batch 11 failed in ``failures``."""
    from dataclasses import replace

    tracker = runner.BatchTracker()
    tracker.fanout_batch_start(BatchInfo("p", 11, "q"), ["bronze", *failures], [])
    tracker.fanout_batch_failed(
        BatchInfo("p", 11, "q"), BatchFailedError("p", 11, failures, committed=["bronze"])
    )
    out = io.StringIO()
    config = replace(_config(tmp_path), path=path or tmp_path / "my pipeline.toml")
    assert runner._failed(_Query(), tracker, config, out) == 1
    return out.getvalue().splitlines()


def test_a_batch_failed_by_a_sink_that_is_down_says_what_to_do_next(tmp_path: Path) -> None:
    """PostgreSQL stopped under a running pipeline: the run ended naming the sink, its
    error and the sinks that would be skipped, and nothing about what to do; the on-call
    could not tell a server to restart from data to fix."""
    from fanout.errors import SinkUnreachableError, TransientSinkError

    down = {
        "pg": TransientSinkError("cannot reach the server", sink="pg", batch_id=11),
        "events": SinkUnreachableError("cannot open: broker down", sink="events", batch_id=11),
    }
    lines = _failed_run(tmp_path, down)
    assert lines[-1] == (
        "Next: events, pg did not answer (transient errors, retries spent). Once they answer, "
        f"run `fanout run '{tmp_path}/my pipeline.toml'` again: Spark replays the batch and "
        "only events, pg writes it. To let the other sinks go on while a sink is down, give "
        'it on_failure = "lag".'
    )
    assert lines[0].startswith("pipeline 'p' failed: pipeline 'p', batch 11: 2 sink(s) failed")


def test_a_batch_failed_by_bad_data_gets_no_advice_to_run_again(tmp_path: Path) -> None:
    from fanout.errors import SinkWriteError, TransientSinkError

    failures = {
        "pg": TransientSinkError("cannot reach the server", sink="pg", batch_id=11),
        "lake": SinkWriteError("column 'amount', value 'abc'", sink="lake", batch_id=11),
    }
    lines = _failed_run(tmp_path, failures)
    assert not any(line.startswith("Next:") for line in lines)
    assert lines[-1] == "  - pg: TransientSinkError: sink 'pg', batch 11: cannot reach the server"


def test_the_next_command_names_the_pipeline_file_as_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fanout run current/orders.toml`, `current` a symlink a deploy moves to the next
    release: the Next: line named the file the link pointed to then (releases/1/...), so
    running it after the next deploy ran the old release's pipeline file."""
    from fanout.errors import TransientSinkError

    (tmp_path / "releases" / "1").mkdir(parents=True)
    (tmp_path / "releases" / "1" / "orders.toml").write_text("")
    (tmp_path / "current").symlink_to(tmp_path / "releases" / "1")
    monkeypatch.chdir(tmp_path)
    down = {"pg": TransientSinkError("cannot reach the server", sink="pg", batch_id=11)}
    lines = _failed_run(tmp_path, down, Path("current/orders.toml"))
    assert f"run `fanout run {tmp_path}/current/orders.toml` again" in lines[-1]


def _fan_out() -> Any:
    from fanout import FanOut
    from fanout.ledger.memory import MemoryLedger
    from tests.unit.fakes import ScriptedSink

    return FanOut("p", MemoryLedger(), [ScriptedSink("good")], backoff_s=0)


def test_stop_query_waits_for_the_batch_inside_the_call_then_stops_the_query() -> None:
    """Classic mode: ``FanOut.stop_query`` closes the gate, waits for the batch inside the
    call and only then calls ``query.stop()``; a batch Spark begins afterwards is refused."""
    fan, query = _fan_out(), _Query()
    try:
        fan.stop_gate.enter(5)
        result: list[bool] = []
        stopper = threading.Thread(target=lambda: result.append(fan.stop_query(query, 30)))
        stopper.start()
        time.sleep(0.3)
        assert (query.stops, fan.stop_gate.closed) == ([], True)  # batch 5 not interrupted
        left = time.monotonic()
        fan.stop_gate.leave()
        stopper.join(10)
        assert result == [True] and len(query.stops) == 1 and query.stops[0] >= left
        with pytest.raises(StopRequestedError, match="pipeline 'p', batch 6: refused"):
            fan.stop_gate.enter(6)
    finally:
        fan.close()


def test_stop_query_leaves_the_query_running_when_the_batch_outlasts_the_timeout() -> None:
    fan, query = _fan_out(), _Query()
    try:
        fan.stop_gate.enter(5)
        assert fan.stop_query(query, 0.2) is False
        assert (query.stops, query.isActive) == ([], True)
    finally:
        fan.close()


class _Session:
    """A Connect session as the server's ``FanOut`` sees it: options, and the running
    queries (``active`` reads counted)."""

    def __init__(self, options: dict[str, str], runs: list[tuple[str, str]]) -> None:
        self.options, self.runs, self.reads = options, runs, 0
        self.conf, self.streams, self.sparkSession = self, self, self

    def get(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)

    @property
    def active(self) -> list[Any]:
        self.reads += 1
        return [type("Q", (), {"id": q, "runId": r})() for q, r in self.runs]


def test_a_connect_stop_option_names_this_run_only_and_a_stale_one_is_read_once() -> None:
    """The server's ``FanOut`` refuses once the option names its query's run; an option
    left from a stop of an earlier run is compared with the running queries once, then costs
    one option read a batch, as an unset one."""
    from fanout.steps.stop_gate import client_stop_key, stop_asked_by_client

    others: set[str] = set()
    session = _Session({}, [("query-1", "run-2")])
    assert not stop_asked_by_client(session, "p", None, others) and session.reads == 0
    session.options[client_stop_key("p")] = "run-1"  # the stop of the run before
    for _ in range(3):
        assert not stop_asked_by_client(session, "p", None, others)
    assert (session.reads, others) == (1, {"run-1"})
    session.options[client_stop_key("other-pipeline")] = "run-2"
    assert not stop_asked_by_client(session, "p", None, others)
    session.options[client_stop_key("p")] = "run-2"  # this run's stop
    assert stop_asked_by_client(session, "p", None, others) and session.reads == 2


class _QueryError(Exception):
    """A streaming query's error as pyspark hands it back: its text holds the Python trace
    of the foreachBatch function (``desc`` in classic mode)."""

    def __init__(self, text: str, desc: bool = False) -> None:
        super().__init__("" if desc else text)
        self.desc = text if desc else None


_TRACE = (
    "[STREAM_FAILED] Query [id = q, runId = r] terminated with exception: [PYTHON_EXCEPTION] "
    "An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
    '  File "fanout/fan_out.py", line 704, in __call__\n'
)


def test_is_stop_refusal_tells_the_refusal_of_a_clean_stop_from_a_failure() -> None:
    """``fanout.is_stop_refusal`` is what a library user catches around
    ``query.awaitTermination()`` after ``stop_query``: true only when the last error
    fanout raised in the query's trace is the refusal (a failure raised after it, or no
    fanout error at all, is a failure), in classic mode (``desc``) and under Spark Connect
    (the text)."""
    import fanout

    refusal = str(StopRequestedError("p", 7))
    refused = _TRACE + f"fanout.errors.StopRequestedError: {refusal}\n\n=== Streaming Query ==="
    assert fanout.is_stop_refusal(_QueryError(refused))
    assert fanout.is_stop_refusal(_QueryError(refused, desc=True))
    assert fanout.is_stop_refusal(StopRequestedError("p", 7))
    failed = refused + "\nDuring handling of the above exception, another exception occurred:\n"
    failed += "fanout.errors.BatchFailedError: pipeline 'p', batch 7: 1 sink(s) failed (pg)"
    assert not fanout.is_stop_refusal(_QueryError(failed))
    assert not fanout.is_stop_refusal(_QueryError(_TRACE + "ValueError: " + refusal))
    assert not fanout.is_stop_refusal(_QueryError(f"StopRequestedError: {refusal}"))
    assert not fanout.is_stop_refusal(None)


class _ConnectQuery:
    """A Spark Connect streaming query as the client holds it (its module is pyspark's
    Connect one, as ``is_connect`` reads it): ``_session`` is the session that started it,
    whose options ``request_stop`` sets; the trigger stays active while ``busy`` is set."""

    __module__ = "pyspark.sql.connect.streaming.query"
    id, runId = "query-1", "run-1"

    def __init__(self, session: Any = None) -> None:
        self.options: dict[str, str] = {}
        self.conf, self._session = self, session if session is not None else self
        self.busy, self.isActive, self.stops = threading.Event(), True, 0

    def set(self, key: str, value: str) -> None:
        self.options[key] = value

    @property
    def status(self) -> dict[str, Any]:
        return {"isTriggerActive": self.busy.is_set()}

    def stop(self) -> None:
        self.stops += 1
        self.isActive = False


def test_stop_query_under_connect_waits_for_the_trigger_after_asking_the_query_session() -> None:
    """Under Spark Connect ``stop_query`` sets the stop option on the query's own session,
    then calls ``query.stop()`` only once the trigger (the batch in flight) is over; past
    its timeout it leaves the query running."""
    from fanout.steps.stop_gate import client_stop_key

    fan, query = _fan_out(), _ConnectQuery()
    try:
        query.busy.set()  # a batch inside the call on the server
        assert fan.stop_query(query, 0.3) is False
        assert (query.options, query.stops) == ({client_stop_key("p"): "run-1"}, 0)
        result: list[bool] = []
        stopper = threading.Thread(target=lambda: result.append(fan.stop_query(query, 30)))
        stopper.start()
        time.sleep(0.5)
        assert (result, query.stops) == ([], 0)
        query.busy.clear()
        stopper.join(10)
        assert (result, query.stops) == ([True], 1)
    finally:
        fan.close()


def test_request_stop_under_connect_says_what_to_do_when_it_cannot_reach_the_session() -> None:
    """A Connect query whose session pyspark does not show (``_session``), or whose session
    refuses the option, is a ``ConfigurationError`` saying what to do, not an
    ``AttributeError`` (nor a stop asked of another session)."""
    fan = _fan_out()
    try:
        query = _ConnectQuery()
        del query._session
        with pytest.raises(ConfigurationError, match=r"pipeline 'p': cannot reach the sess"):
            fan.request_stop(query)

        class Refusing:
            def set(self, key: str, value: str) -> None:
                raise RuntimeError("[CONFIG_NOT_AVAILABLE] Configuration fanout.stop.p")

        refusing = _ConnectQuery(type("S", (), {"conf": Refusing()})())
        with pytest.raises(ConfigurationError, match="refused the option") as caught:
            fan.stop_query(refusing, 5)
        assert "query.stop()" in str(caught.value) and refusing.stops == 0
        assert isinstance(caught.value.__cause__, RuntimeError)
    finally:
        fan.close()
