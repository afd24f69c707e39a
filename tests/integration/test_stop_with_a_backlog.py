"""``fanout run`` stopped by SIGTERM while its source has a backlog (one file a batch, more
files waiting): Spark begins the next batch as soon as one ends, so the signal can come
just after Spark began a batch and before fanout's tracker saw it. Spark's ``query.stop()``
interrupts the query's thread: a batch of fanout's running then fails in the middle
(``collectToPython``: ``InterruptedException``) and a routine stop (a rolling restart)
exited 1, "the query failed while it stopped". The stop now closes the ``FanOut``'s gate
first (:class:`fanout.steps.stop_gate.StopGate`): a batch inside the call is waited for,
one Spark begins afterwards is refused before anything of it is done and runs at the next
start.

The signal is placed by ``signal_at_batch.py`` (a run of ``fanout run`` that sends itself
SIGTERM as the chosen batch starts and waits for the run to react), not by timing. The
Delta sink writes from the executors (as on a cluster): its Spark job runs in the batch's
own thread, which ``query.stop()`` interrupts."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from fanout import FanOut, is_stop_refusal
from tests.integration.streams import (
    backlog_pipeline,
    committed_marks,
    delta_rows,
    id_counts,
    run_to_end,
    write_input,
)

DRIVER = Path(__file__).with_name("signal_at_batch.py")
FILES, ROWS = 4, 3


def _sink(data: Path) -> dict[str, str]:
    return {"type": "delta", "name": "lake", "path": str(data / "lake"),
            "write_from": "executors"}  # fmt: skip


def _config(data: Path) -> Path:
    return backlog_pipeline(data, "backlog", _sink(data))  # a backlog of FILES batches


def _signalled_run(config: Path, batch: int, point: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(config), str(batch), point],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    err = [line for line in done.stderr.splitlines() if not line.startswith("\tat ")]
    out = done.stdout + "\n".join(err[-60:])  # Spark's frames left out
    assert f"SIGNAL at {point} of batch {batch}" in out, out
    # a routine stop prints no stack overflow: Spark's stream thread printed one (~1000
    # frames of java.util.regex) when stop() interrupted a Spark job of fanout's batch
    assert "StackOverflowError" not in done.stdout + done.stderr, out
    return done.returncode, out


def _stop_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("SIGTERM: ")]


def test_a_sigterm_as_spark_begins_a_batch_is_a_clean_stop_and_the_restart_writes_it(
    spark: Any, tmp_path: Path
) -> None:
    """Run 1: SIGTERM once batch 1 entered the call and fanout read its context (batch 0
    committed, the tracker idle): batch 1 is waited for and written, exit 0; on the old
    code ``query.stop()`` interrupted its write, exit 1. Run 2: SIGTERM as Spark hands
    batch 2 over, before it enters: it is refused, nothing of it written, exit 0, and the
    stop line says it runs at the next start. The last run (this session) writes batches 2
    and 3: every row once, one mark per batch."""
    rows = write_input(tmp_path / "input", FILES, ROWS)
    config = _config(tmp_path)

    code, out = _signalled_run(config, 1, "context")

    assert code == 0, out
    waited, stopped = _stop_lines(out)
    assert waited == (
        "SIGTERM: batch 1 in flight; waiting up to 60 s for it to finish (a second Ctrl-C "
        "or SIGTERM ends the run at once)"
    ), out
    # Spark may begin batch 2 before query.stop(): refused, it says so
    assert re.fullmatch(
        r"SIGTERM: batch 1 finished; stopped cleanly"
        r"( before batch 2 began \(it runs at the next start\))?",
        stopped,
    ), out
    assert "failed" not in out, out
    assert committed_marks(tmp_path / "ledger", "backlog") == Counter(
        {("lake", 0): 1, ("lake", 1): 1}
    )

    code, out = _signalled_run(config, 2, "entry")

    assert code == 0, out
    # Spark may replay batch 1 first (its commit interrupted by run 1's stop): skipped
    [stopped] = _stop_lines(out)
    assert re.fullmatch(
        r"SIGTERM: stopped before batch 2 began \(it runs at the next start\); "
        r"(no batch ran in this run|last committed batch 1)",
        stopped,
    ), out
    assert "failed" not in out, out
    assert committed_marks(tmp_path / "ledger", "backlog") == Counter(
        {("lake", 0): 1, ("lake", 1): 1}
    )
    assert id_counts(delta_rows(tmp_path / "lake")) == Counter(
        r["order_id"] for r in rows[: 2 * ROWS]
    )

    fan = FanOut("backlog", str(tmp_path / "ledger"), [_sink(tmp_path)], backoff_s=0)
    assert run_to_end(spark, fan, tmp_path) == ""

    assert committed_marks(tmp_path / "ledger", "backlog") == Counter(
        {("lake", b): 1 for b in range(FILES)}
    )
    assert id_counts(delta_rows(tmp_path / "lake")) == Counter(r["order_id"] for r in rows)


def test_a_fanout_asked_to_stop_refuses_the_next_batch_before_writing_and_spark_replays_it(
    spark: Any, tmp_path: Path
) -> None:
    """The library side, with the query running: after ``request_stop()`` (no batch in the
    call: ``None``) Spark's next batch fails with ``StopRequestedError`` before anything is
    written, the query's error is the one ``fanout run`` reads as the refusal, and a new
    ``FanOut`` on the same checkpoint runs that batch: every row once."""
    from tests.integration.streams import run_stream

    rows = write_input(tmp_path / "input", 2, ROWS)
    fan = FanOut("backlog", str(tmp_path / "ledger"), [_sink(tmp_path)], backoff_s=0)
    assert fan.request_stop() is None
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    except Exception as exc:
        error = exc
    else:
        raise AssertionError("the refused batch did not fail the query")
    finally:
        fan.close()
    assert fan.stop_gate.refused == 0
    assert is_stop_refusal(error), error  # what a library user catches
    assert "fanout.errors.StopRequestedError: pipeline 'backlog', batch 0: refused" in str(error)
    assert not (tmp_path / "lake").exists()
    assert committed_marks(tmp_path / "ledger", "backlog") == Counter()

    again = FanOut("backlog", str(tmp_path / "ledger"), [_sink(tmp_path)], backoff_s=0)
    assert run_to_end(spark, again, tmp_path) == ""

    assert committed_marks(tmp_path / "ledger", "backlog") == Counter(
        {("lake", 0): 1, ("lake", 1): 1}
    )
    assert id_counts(delta_rows(tmp_path / "lake")) == Counter(r["order_id"] for r in rows)
