"""A ``fanout ledger skip`` that lands while the catch-up is writing a spooled batch the
skip gives up (docs/architecture.md §14.4, "A skip while the catch-up runs").

The skip moves the sink's mark past its backlog, so the next live batch finds the sink
with nothing to catch up and used to write it live at once, beside the catch-up's write
still running. A sink whose replays are judged by its newest batch (a Delta table's app
transaction, a progress mark) then answered the catch-up's batch "already written"
(nothing written), and its mark, recorded beside the skip's (§14.1, "A skip racing a
write"), said the sink held rows it never got: ``fanout status`` counted them and a
``backfill_from`` this sink would give them. Now a live batch holds back a sink whose
catch-up write runs: the batch waits in the spool and is written after it, in order.
Delta ledger and spool (delta-rs); the skip is the library call ``fanout ledger skip``
makes (the CLI in a subprocess: ``tests/unit/test_skip_while_catching_up.py``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fanout import FanOut, SinkResult, SinkWriteError
from fanout.contract.batch import Batch, BatchInfo
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import is_skip, skip_batches
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import SchemaFrame, ScriptedSink


class NewestBatchSink(ScriptedSink):
    """Judges replays as a Delta sink does: a batch at or below the newest it committed is
    answered already written (its rows) and not written. ``holds``: the batches whose rows
    it got. Its write of batch ``gate`` waits for ``go`` (after setting ``entered``)."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.holds: list[int] = []
        self.gate: int | None = None
        self.entered, self.go = threading.Event(), threading.Event()

    def write(self, batch: Batch) -> int | SinkResult:
        if batch.batch_id == self.gate and not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(60)
        held = bool(self.holds) and max(self.holds) >= batch.batch_id
        result = super().write(batch)
        rows = result if isinstance(result, int) else result.rows
        if held:
            return SinkResult(rows, already_written=True)
        self.holds.append(batch.batch_id)
        return rows


def test_a_live_batch_waits_for_the_catch_up_write_a_skip_overtook(tmp_path: Path) -> None:
    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    good = ScriptedSink("good")
    down = NewestBatchSink("down", always_fail=SinkWriteError("refused", sink="down"))
    spec = SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"}))
    fan = FanOut("racing", ledger, [good, spec], backoff_s=0, spool=spool, probe_interval_s=3600)
    caught: list[Any] = []
    try:
        fan.catchup.stop()  # the test drives the catch-up: no thread beside it
        frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(4)}
        for batch in range(3):
            fan.process(frames[batch], BatchInfo("racing", batch, "q"))

        def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
            """The catch-up reads the spool with Spark; here, the frames the test kept."""
            spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
            assert spooled is not None, key
            return frames[key[1]], spooled.info()

        fan.catchup._reader.read = read  # type: ignore[method-assign]
        down.always_fail, down.gate = None, 0  # back; its catch-up of batch 0 waits
        catching = threading.Thread(target=lambda: caught.append(fan.catch_up(timeout_s=60)))
        catching.start()
        assert down.entered.wait(30), (down.calls, caught)
        # the operator gives batches 0-2 up while batch 0 is being written
        assert skip_batches(DeltaLedger(ledger), "racing", "down", 2).recorded
        fan.process(frames[3], BatchInfo("racing", 3, "q"))  # the next live batch
        down.go.set()
        catching.join(60)
        assert not catching.is_alive()
    finally:
        down.go.set()
        fan.close()
    assert caught and caught[0]["down"].state == "live"
    assert good.calls == [(0, 1), (1, 1), (2, 1), (3, 1)]
    marks = sorted(
        (e.batch_id, e.rows, is_skip(e))
        for e in DeltaLedger(ledger).committed_entries("racing")
        if e.sink == "down"
    )
    # what the ledger says the sink holds is what it holds: 0 (written beside the skip) and
    # 3; 1-2 given up
    assert sorted(b for b, _, skip in marks if not skip) == down.holds
    assert marks == [(0, 2, False), (2, 0, True), (3, 2, False)]
    # its live failure of 0, the catch-up's 0, then 3 after it: never two writes at once
    assert down.calls == [(0, 1), (0, 1), (3, 1)]
    assert down.holds == [0, 3]
    assert DeltaLedger(ledger).last_committed("racing", ["good", "down"]) == {"good": 3, "down": 3}
