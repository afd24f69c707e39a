"""A sink backfilled from a sink that a ``fanout ledger skip`` raced (docs/architecture.md
§14.1, "A skip racing a write"): the skip of ``silver``'s batch 3 lands between silver's
write of it and its mark, and the backfill of ``copy`` (``backfill_from="silver"``) reads
silver's marks in that window, so it caches the skip's mark ("never written"); the write's
own mark is recorded beside it a moment later. Up to this fix the backfill kept the cached
skip until a restart: ``copy`` passed batch 3 without its rows, which silver holds.

The window is made exact: in the hook between silver's write and its mark, after the real
CLI's skip, the test does what the next batch's start does in the driver (the ledger
lookup, then the hold-back's look at ``copy``'s backlog), as a batch starting there does
when silver's write of batch 3 is a catch-up write in the catch-up thread. Real Spark
batches, three Delta sinks, the real Delta ledger and spool, the real CLI in a subprocess.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from fanout import BatchInfo, FanOut, hookimpl
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import is_skip
from tests.cli_process import fanout_process
from tests.integration import two_sink_resets as resets
from tests.integration.two_sink_resets import OLD, ROWS, SINKS

PIPELINE = "backfill-racing"


class SkipSilverAndLookAtCopy:
    """After silver wrote batch 3 and before its mark: ``fanout ledger skip --sink silver
    --through 3``, then the next batch's ledger lookup and ``copy``'s backlog."""

    def __init__(self, ledger: str) -> None:
        self.ledger = ledger
        self.fan: FanOut | None = None
        self.done: subprocess.CompletedProcess[str] | None = None
        self.seen: list[tuple[int, int]] = []

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id != 3 or sink != "silver" or self.fan is None:
            return
        self.done = fanout_process(
            "ledger", "skip", "--ledger", self.ledger, "--pipeline", PIPELINE,
            "--sink", "silver", "--through", "3",
        )  # fmt: skip
        lookup = DeltaLedger(self.ledger).last_committed(PIPELINE, [*SINKS, "copy"])
        assert lookup["silver"] == 3, lookup  # the skip's mark; the write's is not yet
        self.fan.lagging.saw_marks(0, lookup)
        self.seen = self.fan.lagging.backlog("copy").keys


def _fan(tmp_path: Path, *plugins: object, copy: bool) -> FanOut:
    sinks: list[dict[str, Any]] = [
        {"type": "delta", "name": s, "path": str(tmp_path / s)} for s in SINKS
    ]
    if copy:
        sinks.append({"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
                      "backfill_from": "silver"})  # fmt: skip
    return FanOut(
        PIPELINE, str(tmp_path / "ledger"), sinks, plugins=plugins, parallelism=1,
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"),
    )  # fmt: skip


def test_a_backfill_that_cached_a_racing_skip_s_mark_takes_the_write_s_mark(
    spark: Any, tmp_path: Path
) -> None:
    """``copy`` gets all of silver's rows, batch 3's too: the cached skip's mark of a batch
    ``copy`` still needs is read again, and the write's own mark recorded beside it wins."""
    ledger = str(tmp_path / "ledger")
    first = _fan(tmp_path, copy=False)
    try:
        for batch in range(3):
            resets.run(first, spark, OLD, batch, batch * ROWS)
    finally:
        first.close()

    gate = SkipSilverAndLookAtCopy(ledger)
    fan = _fan(tmp_path, gate, copy=True)
    gate.fan = fan
    try:
        for batch in range(3, 5):
            resets.run(fan, spark, OLD, batch, batch * ROWS)
        lag = fan.catch_up(timeout_s=120)["copy"]
        assert lag.state == "live", lag
    finally:
        fan.close()
    assert gate.done is not None
    assert gate.done.returncode == 0, gate.done.stderr
    assert "sink 'silver', epoch 0: batches 3-3 recorded as skipped" in gate.done.stdout
    assert (0, 3) not in gate.seen  # the skip's mark, all the ledger held then, was cached

    entries = DeltaLedger(ledger).committed_entries(PIPELINE)
    silver = sorted((e.batch_id, e.rows, is_skip(e)) for e in entries if e.sink == "silver")
    assert silver == [(0, ROWS, False), (1, ROWS, False), (2, ROWS, False),
                      (3, 0, True), (3, ROWS, False), (4, ROWS, False)]  # fmt: skip
    for sink in (*SINKS, "copy"):  # every row once in each sink, batch 3's in copy too
        assert resets.ids(tmp_path, sink) == list(range(50)), sink
    copy = sorted((e.batch_id, e.rows) for e in entries if e.sink == "copy")
    assert copy == [(b, ROWS) for b in range(5)]
