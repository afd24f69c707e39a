"""Spark ends Connect's foreachBatch process with SIGTERM (``Process.destroy()``) when its
query stops or fails; the ``FanOut`` built there from its pickle is closed, not killed with
it (``fanout.steps.worker_end``, docs/architecture.md §15). Each case is a real subprocess
sent a real SIGTERM, with the environment Spark gives that process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark import cloudpickle

from fanout import Batch, FanOut, SinkResult
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import entries_from_arrow
from fanout.ledger.memory import MemoryLedger
from fanout.steps import worker_end
from fanout.testing import RecordingSink
from tests.unit.fakes import FakeFrame
from tests.unit.test_built_fan_out_close import ClosingSink

REPO = Path(__file__).resolve().parents[2]

CALLBACKS = 'import atexit\natexit.register(print, "earlier callback ran", flush=True)\n'
"""An ``atexit`` callback registered as the process starts (as coverage's or a tracer's
is), before fanout's."""


class HeldSink(ClosingSink):
    """Batch 1's write says it began (the file ``began``) and runs until the process
    ends; ``swallow``: it also swallows what would end it (a write that never returns)."""

    def __init__(self, name: str, *, note: str, began: str, swallow: bool = False) -> None:
        super().__init__(name, note=note)
        self.began, self.swallow = began, swallow

    def write(self, batch: Batch) -> SinkResult:
        if batch.batch_id != 1:
            return super().write(batch)
        Path(self.began).write_text(str(os.getpid()))
        while True:
            try:
                time.sleep(0.05)
            except BaseException:
                if not self.swallow:
                    raise


def _worker(
    tmp_path: Path,
    sink: ClosingSink,
    then: str,
    *,
    before: str = "",
    built: str = "",
    grace: float = 30.0,
) -> subprocess.Popen[str]:
    """A process as Spark starts beside a Connect server (:data:`worker_end.WORKER_ENV`
    set) that runs ``before``, unpickles the FanOut, writes batch 0 with it, runs
    ``built``, prints ``ready``, then runs ``then``; its grace is ``grace`` seconds."""
    fan = FanOut("ending", str(tmp_path / "ledger"), [sink], retries=0)
    fan.close()
    Path(sink.note).unlink()  # the client's own close
    pickled = tmp_path / "fan.pickle"
    pickled.write_bytes(cloudpickle.dumps(fan))
    code = (
        textwrap.dedent(before)
        + textwrap.dedent(f"""
        import sys
        from pyspark import cloudpickle
        from fanout.steps import worker_end
        from tests.unit.fakes import FakeFrame
        worker_end.GRACE_S = {grace!r}
        fan = cloudpickle.loads(open({str(pickled)!r}, "rb").read())
        fan(FakeFrame(), 0)
    """)
        + textwrap.dedent(built)
        + 'print("ready", flush=True)\n'
        + textwrap.dedent(then)
    )
    env = {**os.environ, worker_end.WORKER_ENV: "sc://localhost:15002/;user_id=test"}
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    line = b""  # read from the fd itself: a readline() would buffer what follows, which
    while not line.endswith(b"\n"):  # communicate() (reading the fd) would then miss
        byte = os.read(process.stdout.fileno(), 1)
        if not byte:
            break
        line += byte
    assert line == b"ready\n", process.communicate(timeout=60)
    return process


def _ended(worker: subprocess.Popen[str], timeout_s: float = 60.0) -> tuple[str, str]:
    """The process's stdout and stderr once it has ended; killed and failed if it has not
    ended within ``timeout_s``."""
    try:
        return worker.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        worker.kill()
        _, err = worker.communicate()
        pytest.fail(f"the process was still running {timeout_s} s later: {err}")


def _entries(tmp_path: Path) -> list[tuple[str, int, str, str]]:
    """The ledger's rows of the pipeline: sink, batch, status and error."""
    rows = entries_from_arrow(DeltaLedger(str(tmp_path / "ledger")).read("ending"))
    return sorted((e.sink, e.batch_id, e.status, e.error or "") for e in rows)


def _wait_for(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_sigterm_inside_a_batch_cuts_it_unmarked_and_closes_the_fan_out(
    tmp_path: Path,
) -> None:
    """Batch 1's write runs when SIGTERM comes: it is cut, recorded as a failed attempt,
    not marked, and the sink closed once before the process exits (143)."""
    note, began = tmp_path / "closed.txt", tmp_path / "began"
    sink = HeldSink("rec", note=str(note), began=str(began))
    worker = _worker(tmp_path, sink, """
        fan(FakeFrame(), 1)
        print("batch 1 returned", flush=True)
    """)  # fmt: skip
    _wait_for(began)
    worker.send_signal(signal.SIGTERM)
    out, err = _ended(worker)
    assert (worker.returncode, out) == (143, ""), err
    assert note.read_text() == "closed\n"
    assert _entries(tmp_path) == [
        ("rec", 0, "committed", ""),
        ("rec", 1, "failed", "SinkWriteError: sink 'rec', batch 1: WorkerTerminated: Spark "
         "ended this foreachBatch process (SIGTERM: the query stopped or failed); the batch "
         "in progress, if any, was cut before its marks: the query's restart runs it again"),
    ]  # fmt: skip


def test_sigterm_in_fanout_code_outside_the_gate_unwinds_it_rather_than_closing_there(
    tmp_path: Path,
) -> None:
    """SIGTERM comes while ``FanOut.__call__`` runs its own code before the stop gate (no
    batch inside the gate), that code holding a lock ``close()`` takes (here the sink
    owners' lock, standing for the ledger's or the Connect client's): the call is unwound
    and the FanOut closed at exit, at once. Before, the handler read "no batch inside the
    gate" as between batches and closed there, under the lock its own thread held: the
    close waited for it until the grace (30 s here) ended the process."""
    note, began = tmp_path / "closed.txt", tmp_path / "began"
    worker = _worker(tmp_path, ClosingSink("rec", note=str(note)), f"""
        import time
        from pathlib import Path
        from fanout.steps import owners

        def entering():
            with owners._lock:
                Path({str(began)!r}).write_text("in")
                while True:
                    time.sleep(0.05)

        fan._refusals.entering = entering  # the first of fanout's steps, before the gate
        fan(FakeFrame(), 1)
    """)  # fmt: skip
    _wait_for(began)
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    out, err = _ended(worker)
    assert (worker.returncode, out) == (143, ""), err
    assert time.monotonic() - sent < 20, err
    assert "still running" not in err
    assert note.read_text() == "closed\n"
    assert _entries(tmp_path) == [("rec", 0, "committed", "")]


@pytest.mark.parametrize(
    ("then", "sigterm", "status"),
    [
        ("sys.stdin.read()\nprint('the wait was not ended')\n", True, 143),
        ("sys.exit(3)\n", False, 3),
    ],
    ids=["sigterm-between-batches", "exit-without-sigterm"],
)
def test_the_exit_closes_the_fan_out_and_runs_every_atexit_callback_once(
    tmp_path: Path, then: str, sigterm: bool, status: int
) -> None:
    """pyspark's loop waits on its socket for the next batch (here: stdin) when SIGTERM
    ends the wait, or the process exits by itself (status 3). Either way the sink is closed
    once and the ``atexit`` callbacks registered before fanout's (coverage's, a tracer's)
    and after it run once each, in their usual order. After a SIGTERM the process ends
    with ``os._exit(143)`` then (its finalization has hung on a gRPC lock); without one, as
    Python's exit, with its own status. Before: SIGTERM's default action killed the process
    with its sink open; then fanout's ``os._exit`` ran none of the earlier callbacks, and
    made status 3 a 0."""
    note = tmp_path / "closed.txt"
    later = 'atexit.register(print, "later callback ran", flush=True)\n'
    sink = ClosingSink("rec", note=str(note))
    worker = _worker(tmp_path, sink, then, before=CALLBACKS, built=later)
    if sigterm:
        worker.send_signal(signal.SIGTERM)
    out, err = _ended(worker)
    assert (worker.returncode, out) == (status, "later callback ran\nearlier callback ran\n"), err
    assert note.read_text() == "closed\n"
    assert _entries(tmp_path) == [("rec", 0, "committed", "")]


def test_a_sigterm_once_the_fan_out_is_closed_at_exit_has_its_default_action(
    tmp_path: Path,
) -> None:
    """Once fanout's exit callback closed the FanOut (no SIGTERM yet), SIGTERM ends the
    process as it would without fanout (killed: -15), so it still cuts an exit that hangs
    after ``atexit`` (the interpreter's finalization), as it did before fanout handled it.
    Here an earlier callback, run after fanout's, waits; before the fix it never ran."""
    note, exiting = tmp_path / "closed.txt", tmp_path / "exiting"
    worker = _worker(tmp_path, ClosingSink("rec", note=str(note)), "", before=f"""
        import atexit, time
        from pathlib import Path

        def exiting():
            Path({str(exiting)!r}).write_text("in")
            time.sleep(60)

        atexit.register(exiting)
    """)  # fmt: skip
    _wait_for(exiting, 30)
    worker.send_signal(signal.SIGTERM)
    out, err = _ended(worker, 20)
    assert (worker.returncode, out) == (-signal.SIGTERM, ""), err
    assert note.read_text() == "closed\n"


def test_a_process_that_does_not_end_is_ended_after_the_grace(tmp_path: Path) -> None:
    """A write that swallows the exit (or a call that never returns to Python) would keep
    the process alive: it is ended GRACE_S (2 s here) after the SIGTERM all the same."""
    note, began = tmp_path / "closed.txt", tmp_path / "began"
    sink = HeldSink("rec", note=str(note), began=str(began), swallow=True)
    worker = _worker(tmp_path, sink, "fan(FakeFrame(), 1)\n", grace=2.0)
    _wait_for(began)
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    out, err = _ended(worker)
    waited = time.monotonic() - sent
    assert (worker.returncode, out) == (143, ""), err
    assert 2.0 <= waited < 30, waited
    assert "still running 2 s after Spark's SIGTERM" in err
    assert not note.exists()  # nothing closed: the write never let the batch end


def test_the_grace_does_not_need_the_signal_wakeup_fd(tmp_path: Path) -> None:
    """The wake-up fd fanout set was cleared (as an event loop does when it closes, or
    replaced by its own): the handler's own timer ends the process after the grace.
    Before, only the fd's byte started the grace: the process ran on."""
    note, began = tmp_path / "closed.txt", tmp_path / "began"
    sink = HeldSink("rec", note=str(note), began=str(began), swallow=True)
    worker = _worker(tmp_path, sink, """
        import signal
        signal.set_wakeup_fd(-1)
        fan(FakeFrame(), 1)
    """, grace=2.0)  # fmt: skip
    _wait_for(began)
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    out, err = _ended(worker, 30)
    waited = time.monotonic() - sent
    assert (worker.returncode, out) == (143, ""), err
    assert 2.0 <= waited < 30, waited
    assert "still running 2 s after Spark's SIGTERM" in err
    assert not note.exists()


def test_nothing_is_installed_outside_connects_worker_or_over_a_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not in a process Spark did not start beside a Connect server (a classic driver, a
    client), nor over a SIGTERM handler someone else set."""
    monkeypatch.delenv(worker_end.WORKER_ENV, raising=False)
    assert worker_end.watch(object()) is False
    assert signal.getsignal(signal.SIGTERM) is not worker_end._terminated

    def users(signum: int, frame: object) -> None:
        """The user's own handler."""

    monkeypatch.setenv(worker_end.WORKER_ENV, "sc://localhost:15002")
    earlier = signal.signal(signal.SIGTERM, users)
    try:
        assert worker_end.watch(object()) is False
        assert signal.getsignal(signal.SIGTERM) is users
    finally:
        signal.signal(signal.SIGTERM, earlier)


def _cut_at_call_entered(counted: bool) -> Callable[[], None]:
    """``call_entered`` as a SIGTERM handled right after (``counted``) or right before its
    append would leave it: the handler's :class:`worker_end.WorkerTerminated` raised."""

    def entered() -> None:
        if counted:
            worker_end.call_entered()
        raise worker_end.WorkerTerminated

    return entered


@pytest.mark.parametrize("counted", [True, False], ids=["after-the-count", "before-the-count"])
def test_a_sigterm_at_the_calls_first_line_still_pairs_its_count(
    monkeypatch: pytest.MonkeyPatch, counted: bool
) -> None:
    """The count of ``FanOut.__call__`` running (what tells the handler to unwind rather
    than close) is undone by the call's ``finally`` however early the SIGTERM comes: a
    count left behind would tell a later SIGTERM that a batch is running when none is (the
    first handled SIGTERM makes later ones do nothing today, so this guards the count's
    own contract). One that came before the count leaves the handler's own error, not a
    ``ValueError``."""
    monkeypatch.setattr("fanout.fan_out.call_entered", _cut_at_call_entered(counted))
    before = list(worker_end._calls)
    fan = FanOut("ending", MemoryLedger(), [RecordingSink("lake")], retries=0)
    with pytest.raises(worker_end.WorkerTerminated):
        fan(FakeFrame(), 0)
    fan.close()
    assert worker_end._calls == before == []
