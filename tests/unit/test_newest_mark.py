"""Whether a pipeline looks running, from its ledger marks (docs/architecture.md §4, "Does
the pipeline run?"): the newest write mark (sink, batch, epoch, when), its age, and the
window the marks' own cadence gives (:mod:`fanout.app.activity`), as ``fanout status``,
``fanout ledger skip``, ``fanout recover`` and ``fanout ledger maintain`` print it; the
skip and the recover warn on stderr when the pipeline looks running, exit 0 all the same.

The marks are real Delta ledger rows with chosen ``finished_at`` times. The functions are
asked at a fixed "now", and so are the commands run through :func:`fanout.app.cli.main`
in this process (:func:`fanout.app.activity.clock` set to it): their texts are exact, ages
included, however slow the machine. The skip runs as a real subprocess (its warning and
exit code as an operator sees them), at the real clock: its age alone is matched by a
pattern (the mark an hour old, the window three). No Spark.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fanout.app import activity
from fanout.app.activity import NewestMark, duration, newest_marks, newest_marks_of, no_mark_yet
from fanout.app.cli import RECOVER_WHILE_RUNNING, SKIP_WHILE_RUNNING, main
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LOST_MARK, LedgerEntry
from fanout.ledger.gaps import skip_batches
from tests.cli_process import fanout_process
from tests.unit.fakes import committed

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def _ledger(tmp_path: Path) -> DeltaLedger:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    return ledger


def _mark(
    ledger: DeltaLedger, sink: str, batch: int, at: datetime, *, epoch: int = 0, **kw: object
) -> None:
    assert ledger.mark_committed(
        committed("p", sink, batch, rows=5, finished_at=at, epoch=epoch, **kw)
    )


def _hourly(ledger: DeltaLedger, last: datetime) -> None:
    """Batches 0-3 an hour apart, batch 3 at ``last``: lake marks each, pg 30 s after."""
    for batch in range(4):
        at = last - timedelta(hours=3 - batch, seconds=30)
        _mark(ledger, "lake", batch, at)
        _mark(ledger, "pg", batch, at + timedelta(seconds=30))


def _line(looks: str, age: str, at: datetime) -> str:
    return (
        f"pipeline 'p' looks {looks}: its newest mark is batch 3 of epoch 0 by sink 'pg', "
        f"{age} ago ({at:%Y-%m-%d %H:%M:%S} UTC); window 3h (3 x 1h, the median gap "
        "between its latest batches, at least 1m)"
    )


def _wrapped(line: str) -> str:
    """``line`` as ``fanout status`` prints it: within 100 columns, the rest indented."""
    return textwrap.fill(line, 100, subsequent_indent="  ", break_on_hyphens=False)


def _marks(ledger: DeltaLedger, now: datetime = NOW) -> Sequence[NewestMark]:
    """The marks judged from the rows as dicts, and as the commands judge them (six
    columns reduced in Arrow, :func:`newest_marks_of`): the same, for one pipeline or all."""
    judged = newest_marks(ledger.rows("p"), now)
    assert newest_marks_of(ledger.mark_times("p"), now) == judged
    assert newest_marks_of(ledger.mark_times(), now) == newest_marks(ledger.rows(), now)
    return judged


def test_a_recent_mark_looks_running_and_a_skip_or_lost_mark_is_no_write(
    tmp_path: Path,
) -> None:
    """The newest write's mark, 30 s old, in a pipeline whose batches came a minute apart:
    running (window 3 x 1 min). The operator's skip (of a sink "gone", batches 0-3, made
    now) and a lost mark made after pg's are no write of the pipeline's: the newest mark
    stays pg's batch 3."""
    ledger = _ledger(tmp_path)
    for batch in range(4):
        at = NOW - timedelta(seconds=30 + 60 * (3 - batch))
        _mark(ledger, "lake", batch, at - timedelta(seconds=2))
        _mark(ledger, "pg", batch, at)
    assert skip_batches(ledger, "p", "gone", 3).recorded  # now, past every write's mark
    lost = LedgerEntry("p", "lake", 4, "committed", rows=None, finished_at=NOW,
                       error=f"{LOST_MARK}: recorded at a start")  # fmt: skip
    assert ledger.mark_committed(lost)
    [mark] = _marks(ledger)
    at = NOW - timedelta(seconds=30)
    assert mark == NewestMark("p", "pg", 3, 0, at, 30.0, 60.0, 180.0)
    assert mark.looks_running
    assert mark.describe() == (
        "pipeline 'p' looks running: its newest mark is batch 3 of epoch 0 by sink 'pg', "
        "30s ago (2026-12-01 11:59:30 UTC); window 3m (3 x 1m, the median gap between its "
        "latest batches, at least 1m)"
    )
    assert mark.as_json() == {
        "sink": "pg", "batch_id": 3, "epoch": 0, "at": "2026-12-01T11:59:30+00:00",
        "age_s": 30.0, "cadence_s": 60.0, "window_s": 180.0, "looks_running": True,
    }  # fmt: skip


def test_an_old_mark_looks_stopped_and_the_floor_holds_for_fast_batches(tmp_path: Path) -> None:
    """Batches 5 s apart, the newest 2 min old: 3 x 5 s would be 15 s, the floor of 1 min
    holds (two machines' clocks), and 2 min is past it: stopped. 59 s old: running."""
    ledger = _ledger(tmp_path)
    for batch in range(12):  # 11 gaps: the median of the last 10
        _mark(ledger, "lake", batch, NOW - timedelta(seconds=120 + 5 * (11 - batch)))
    [mark] = _marks(ledger)
    assert (mark.batch_id, mark.age_s, mark.cadence_s, mark.window_s) == (11, 120.0, 5.0, 60.0)
    assert not mark.looks_running
    assert mark.describe() == (
        "pipeline 'p' looks stopped: its newest mark is batch 11 of epoch 0 by sink 'lake', "
        "2m ago (2026-12-01 11:58:00 UTC); window 1m (3 x 5s, the median gap between its "
        "latest batches, at least 1m)"
    )
    [soon] = _marks(ledger, NOW - timedelta(seconds=61))
    assert (soon.age_s, soon.looks_running) == (59.0, True)


def test_no_mark_at_all_and_one_batch_only(tmp_path: Path) -> None:
    """A ledger with only a failed attempt of the pipeline: no write mark. Then one
    batch: no gap to judge by, the floor alone."""
    ledger = _ledger(tmp_path)
    ledger.record_failure(LedgerEntry("p", "pg", 0, "failed", finished_at=NOW, error="boom"))
    assert _marks(ledger) == []
    assert no_mark_yet("p") == (
        "pipeline 'p': no write mark with its time yet (never ran, no sink committed a "
        "batch, or its marks carry no time)"
    )
    _mark(ledger, "lake", 0, NOW - timedelta(seconds=10))
    [mark] = _marks(ledger)
    assert (mark.cadence_s, mark.window_s, mark.looks_running) == (None, 60.0, True)
    assert mark.describe() == (
        "pipeline 'p' looks running: its newest mark is batch 0 of epoch 0 by sink 'lake', "
        "10s ago (2026-12-01 11:59:50 UTC); window 1m (one batch of epoch 0 only, no gap to "
        "judge by)"
    )


def test_the_cadence_is_the_newest_epoch_s_and_a_catch_up_mark_does_not_stretch_it(
    tmp_path: Path,
) -> None:
    """Epoch 0 ran batches 10 s apart a day ago; epoch 1 (after a checkpoint reset) runs
    them 20 min apart: lake marked 0, 1, 2 at 60, 40, 20 min ago, and pg, lagging, caught up
    0 and 1 at 19 min ago. The newest mark is pg's catch-up of batch 1; the cadence is
    epoch 1's by each batch's first mark (20 min, not epoch 0's 10 s, and not shortened by
    the catch-up's marks): window 1 h, running; 10 s apart would say stopped."""
    ledger = _ledger(tmp_path)
    for batch in range(6):
        _mark(ledger, "lake", batch, NOW - timedelta(days=1, seconds=10 * (5 - batch)))
        _mark(ledger, "pg", batch, NOW - timedelta(days=1, seconds=10 * (5 - batch)))
    for batch in range(3):
        _mark(ledger, "lake", batch, NOW - timedelta(minutes=60 - 20 * batch), epoch=1)
    for batch in range(2):
        _mark(ledger, "pg", batch, NOW - timedelta(minutes=19, seconds=1 - batch), epoch=1)
    [mark] = _marks(ledger)
    assert (mark.sink, mark.batch_id, mark.epoch) == ("pg", 1, 1)
    assert (mark.age_s, mark.cadence_s, mark.window_s) == (1140.0, 1200.0, 3600.0)
    assert mark.describe() == (
        "pipeline 'p' looks running: its newest mark is batch 1 of epoch 1 by sink 'pg', "
        "19m ago (2026-12-01 11:41:00 UTC); window 1h (3 x 20m, the median gap between its "
        "latest batches, at least 1m)"
    )


def test_durations() -> None:
    assert [duration(s) for s in (0, 59.9, 60, 61, 3599, 3600, 3660, 86400, 90000)] == [
        "0s", "59s", "1m", "1m 1s", "59m 59s", "1h", "1h 1m", "1d", "1d 1h",
    ]  # fmt: skip


def test_skip_warns_while_the_pipeline_looks_running_and_exits_0(tmp_path: Path) -> None:
    """The real CLI in a process of its own: the skip is done, the newest mark printed
    after its own lines, the warning on stderr, exit 0. Batches an hour apart, the newest
    mark an hour (and 30 s) ago: within 3 h, running."""
    ledger = _ledger(tmp_path)
    last = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1, seconds=30)
    _hourly(ledger, last)
    _mark(ledger, "lake", 4, last + timedelta(seconds=5))  # pg missed batch 4
    done = fanout_process(
        "ledger", "skip", "--ledger", ledger.path, "--pipeline", "p", "--sink", "pg",
        "--through", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = _line("running", "AGE", last + timedelta(seconds=5)).replace(
        "batch 3 of epoch 0 by sink 'pg'", "batch 4 of epoch 0 by sink 'lake'"
    )
    *said, newest = done.stdout.splitlines()
    # the real clock's age: 1h 0m 25s at the mark's placing, under 3h for any slowness
    age = re.escape(line).replace("AGE", r"(1h|1h \d+m|2h|2h \d+m)")
    assert re.fullmatch(age, newest), newest
    assert said == [
        "pipeline 'p', sink 'pg', epoch 0: batches 4-4 recorded as skipped (never written to "
        "it); the next batch writes it",
        "pipeline 'p', sink 'pg', epoch 0: the backfill source was not checked (no "
        "--config): if the sink has backfill_from in the pipeline file, batches that source "
        "holds through this mark were given up too (they are not backfilled to it)",
        "pipeline 'p', sink 'pg', epoch 0: the spool was not checked (no --spool): batches "
        "it still holds for the sink through this mark are kept, neither written nor "
        "released; the pipeline's start-up names them and how to release them",
    ]
    assert done.stderr == f"fanout: warning: pipeline 'p' looks running: {SKIP_WHILE_RUNNING}\n"


def test_status_skip_recover_maintain_of_a_stopped_pipeline_say_so_without_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest mark two days old: each command prints it, looks stopped, no warning
    (the skip of pg's batch 4 recorded all the same); ``status --json`` carries it in each
    sink's object."""
    monkeypatch.setattr(activity, "clock", lambda: NOW)
    ledger = _ledger(tmp_path)
    last = NOW - timedelta(days=2, seconds=30)
    _hourly(ledger, last)
    _mark(ledger, "lake", 4, last - timedelta(seconds=1))  # pg missed batch 4
    stopped = _line("stopped", "2d", last)
    args = ["--ledger", ledger.path, "--pipeline", "p"]

    assert main(["status", *args]) == 0
    out, err = capsys.readouterr()
    assert out.endswith(f"\n\n{_wrapped(stopped)}\n") and err == ""

    assert main(["status", *args, "--json"]) == 0
    sinks = json.loads(capsys.readouterr().out)
    marks = [s["pipeline_newest_mark"] for s in sinks]
    assert [s["sink"] for s in sinks] == ["lake", "pg"]
    assert marks[0] == marks[1]
    assert marks[0] == {
        "sink": "pg", "batch_id": 3, "epoch": 0, "at": last.isoformat(),
        "age_s": 2 * 86400 + 30.0, "cadence_s": 3600.0, "window_s": 10800.0,
        "looks_running": False,
    }  # fmt: skip

    assert main(["recover", *args, "--no-record"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == stopped and err == ""

    assert main(["ledger", "skip", *args, "--sink", "pg", "--through", "4"]) == 0
    out, err = capsys.readouterr()
    assert "batches 4-4 recorded as skipped" in out
    assert out.splitlines()[-1] == stopped and err == ""

    assert main(["ledger", "maintain", "--ledger", ledger.path]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == stopped and err == ""


def test_status_recover_maintain_of_a_running_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest mark an hour old, batches an hour apart: running. ``status`` and
    ``ledger maintain`` say so (maintenance beside a run is safe: no warning);
    ``recover`` warns on stderr and still reports, exit 0."""
    monkeypatch.setattr(activity, "clock", lambda: NOW)
    ledger = _ledger(tmp_path)
    last = NOW - timedelta(hours=1, minutes=2, seconds=30)
    _hourly(ledger, last)
    running = _line("running", "1h 2m", last)
    args = ["--ledger", ledger.path, "--pipeline", "p"]

    assert main(["status", *args]) == 0
    out, err = capsys.readouterr()
    assert out.endswith(f"\n\n{_wrapped(running)}\n") and err == ""

    assert main(["recover", *args, "--no-record"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == running
    assert "Resume after batch 3" in out
    assert err == f"fanout: warning: pipeline 'p' looks running: {RECOVER_WHILE_RUNNING}\n"

    assert main(["ledger", "maintain", "--ledger", ledger.path]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == running and err == ""


def test_status_of_a_pipeline_without_a_write_mark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a failed attempt in the ledger: the table shows it, then "no write mark with
    its time yet"."""
    ledger = _ledger(tmp_path)
    ledger.record_failure(LedgerEntry("p", "pg", 0, "failed", finished_at=NOW, error="boom"))
    assert main(["status", "--ledger", ledger.path, "--pipeline", "p"]) == 0
    out, err = capsys.readouterr()
    assert out.endswith(f"\n\n{_wrapped(no_mark_yet('p'))}\n")
    assert err == ""
