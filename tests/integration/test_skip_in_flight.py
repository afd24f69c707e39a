"""``fanout ledger skip`` run by an operator while the pipeline writes the same sink's batch
(ARCHITECTURE §14.1, "A skip racing a write").

The skip lands after ``silver`` wrote batch 3 to its Delta table and before its ledger mark
(``bronze`` marked the batch already, so the skip accepts batch 3). The skip's mark says
"batches 3-3 were never written to this sink", with 0 rows; the write's own mark, finding
the sink's transaction at batch 3 already, was a no-op, so the ledger held only the skip's
word for a batch the sink holds: ``fanout status`` counted it as given up, and a sink
backfilled from ``silver`` could not get it (a backfill takes only marks of writes). Real
Spark batches, two Delta sinks, the real Delta ledger, the real CLI in a subprocess.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from fanout import BatchInfo, hookimpl
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import held_by_skip, is_skip
from tests.cli_process import fanout_process
from tests.integration import two_sink_resets as resets
from tests.integration.two_sink_resets import OLD, ROWS, SINKS

PIPELINE = "racing"


class SkipWhileSilverMarks:
    """Runs ``fanout ledger skip --sink silver --through 3`` after silver wrote batch 3 and
    before its mark (bronze's mark of batch 3 is committed: sinks run one at a time)."""

    def __init__(self, ledger: str) -> None:
        self.ledger = ledger
        self.done: subprocess.CompletedProcess[str] | None = None

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id != 3 or sink != "silver":
            return
        marks = DeltaLedger(self.ledger).last_committed(PIPELINE, list(SINKS))
        assert marks == {"bronze": 3, "silver": 2}, marks
        self.done = fanout_process(
            "ledger", "skip", "--ledger", self.ledger, "--pipeline", PIPELINE,
            "--sink", "silver", "--through", "3",
        )  # fmt: skip


def test_a_skip_landing_between_a_write_and_its_mark_leaves_the_write_s_mark(
    spark: Any, tmp_path: Path
) -> None:
    """The skip is recorded as the operator asked, and the write's own mark of batch 3 is
    recorded beside it, with its rows: the ledger no longer says the batch silver holds
    was never written to it."""
    ledger = str(tmp_path / "ledger")
    gate = SkipWhileSilverMarks(ledger)
    running = resets.fan(PIPELINE, tmp_path, gate)
    try:
        for batch in range(5):
            resets.run(running, spark, OLD, batch, batch * ROWS)
    finally:
        running.close()
    assert gate.done is not None
    assert gate.done.returncode == 0, gate.done.stderr
    assert (
        f"pipeline '{PIPELINE}', sink 'silver', epoch 0: batches 3-3 recorded as skipped"
        in gate.done.stdout
    )
    for sink in SINKS:  # every batch written once to each sink
        assert resets.ids(tmp_path, sink) == list(range(50))

    entries = DeltaLedger(ledger).committed_entries(PIPELINE)
    silver = sorted((e.batch_id, e.rows, is_skip(e)) for e in entries if e.sink == "silver")
    assert silver == [(0, ROWS, False), (1, ROWS, False), (2, ROWS, False),
                      (3, 0, True), (3, ROWS, False), (4, ROWS, False)]  # fmt: skip
    marks = [(e.batch_id, is_skip(e)) for e in entries if e.sink == "silver"]
    assert not held_by_skip(3, marks)  # a batch silver holds, not one given up
    assert DeltaLedger(ledger).last_committed(PIPELINE, list(SINKS)) == {
        "bronze": 4,
        "silver": 4,
    }
