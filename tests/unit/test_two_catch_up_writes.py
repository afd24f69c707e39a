"""Two catch-up writes of one sink and batch at once, in one process (docs/architecture.md
§14.4, "One writer of a sink per process").

A catch-up write of a sink without ``write_timeout_s`` that outlasts ``CatchUp.stop()``'s
wait (at ``FanOut.close()``) runs on in the old catch-up thread; the next ``FanOut`` of the
pipeline in the same process (a restarted query, a notebook's re-run cell) then caught the
same sink up with the same batch beside it. A built-in sink refuses the second commit (an
app transaction, a progress row, a fenced producer), but a third-party sink that checks
"already written?" and then writes (the plugin contract's idempotence) wrote the batch
twice. Now every catch-up of the pipeline in the process writes a sink under one lock, so
the second waits (saying so) and then finds the batch marked. Delta ledger and spool
(delta-rs), no Spark: the catch-up's read of the spool is the frames the test kept."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError, FanOut, SinkResult, SinkWriteError
from fanout.contract.batch import Batch, BatchInfo
from fanout.ledger.delta import DeltaLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.catchup import CatchUp
from tests.unit.fakes import SchemaFrame, ScriptedSink


class Target:
    """What a third-party sink writes to (a remote store both Sink objects reach): every id
    it holds, as many times as written, and the batches it records as written."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.held: set[tuple[int, int]] = set()
        self.entered = threading.Semaphore(0)  # a write past its check
        self.go = threading.Event()


class CheckThenWriteSink(ScriptedSink):
    """A third-party sink's idempotence: it answers a batch its target holds already
    written, and otherwise writes it, with time between the check and the write (a slow
    network): a write waits for ``target.go`` after its check."""

    def __init__(self, name: str, target: Target, **options: Any) -> None:
        super().__init__(name, **options)
        self.target = target

    def write(self, batch: Batch) -> int | SinkResult:
        rows = super().write(batch)  # the scripted failures first
        key, target = (batch.info.epoch, batch.batch_id), self.target
        if key in target.held:
            return SinkResult(0 if isinstance(rows, SinkResult) else rows, already_written=True)
        target.entered.release()
        assert target.go.wait(60)
        target.rows += batch.df.table.column("id").to_pylist()  # type: ignore[attr-defined]
        target.held.add(key)
        return rows


def _reading(fan: FanOut, frames: dict[int, Any]) -> None:
    """The catch-up reads the spool with Spark; here, the frames the test kept."""

    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
        assert spooled is not None, key
        return frames[key[1]], spooled.info()

    fan.catchup._read = read  # type: ignore[method-assign]


@pytest.mark.parametrize("spelled", ["as-before", "file-url"])
def test_a_catch_up_write_left_running_at_close_is_not_doubled_by_the_next_fan_out(
    tmp_path: Path, spelled: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``spelled``: how the restarted query's FanOut names the same ledger (a ``file:`` URL
    with a trailing ``/`` is the same ledger, and the same one writer of the sink)."""
    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    again = ledger if spelled == "as-before" else f"file://{ledger}/"
    frames = {0: SchemaFrame([10, 11, 12])}
    good, target = ScriptedSink("good"), Target()
    slow = CheckThenWriteSink("slow", target, always_fail=SinkWriteError("down", sink="slow"))

    def fan_out(sink: CheckThenWriteSink, probe_interval_s: float, at: str = ledger) -> FanOut:
        spec = SinkSpec(sink, lag=lag_policy("slow", {"on_failure": "lag"}))
        return FanOut(
            "twice", at, [good, spec], backoff_s=0, retries=0, spool=spool,
            probe_interval_s=probe_interval_s,
        )  # fmt: skip

    first = fan_out(slow, 0.05)
    _reading(first, frames)
    first.process(frames[0], BatchInfo("twice", 0, "q"))  # slow fails: spooled, lagging
    slow.always_fail = None  # back: the catch-up thread's write waits after its check
    assert target.entered.acquire(timeout=20), slow.calls
    (old_thread,) = [t for t in threading.enumerate() if t.name == "fanout-twice-catchup"]
    # close()'s wait for the write in progress (30 s) passes: the thread runs on
    first.catchup.stop = lambda timeout_s=0.2: CatchUp.stop(first.catchup, 0.2)  # type: ignore[method-assign]
    first.close()
    assert old_thread.is_alive()
    left = "pipeline twice, batch 0, sink slow: its catch-up write of batch 0 (epoch 0) was"
    assert any(r.getMessage().startswith(left) for r in caplog.records), caplog.text
    assert slow.closed == 0  # left open under its write (before: closed under it)
    with pytest.raises(ConfigurationError, match="catch-up write of the sink"):
        fan_out(slow, 3600)  # still held by that write

    # the restarted query's FanOut, in the same process (its own Sink object, one target)
    second = fan_out(CheckThenWriteSink("slow", target), 3600, again)
    caught: list[Any] = []
    try:
        second.catchup.stop()  # the test drives its catch-up
        _reading(second, frames)
        # its bound holds while it waits for that write (a script's catch_up(timeout_s),
        # a final catch-up a signal stops): it returns, the sink still behind
        bounded: list[Any] = []
        waiting = threading.Thread(target=lambda: bounded.append(second.catch_up(0.3)))
        waiting.start()
        waiting.join(10)
        assert not waiting.is_alive(), "catch_up(timeout_s=0.3) waited past its bound"
        assert bounded[0]["slow"].state != "live" and target.rows == []
        catching = threading.Thread(target=lambda: caught.append(second.catch_up(30)))
        started = time.monotonic()
        catching.start()
        doubled = target.entered.acquire(timeout=1.0)  # a second write past its check
        target.go.set()
        catching.join(30)
        old_thread.join(30)
        assert not catching.is_alive() and not old_thread.is_alive()
    finally:
        target.go.set()
        second.close()
    assert target.rows == [10, 11, 12]  # the old code: [10, 11, 12, 10, 11, 12]
    assert not doubled, "a second write of batch 0 ran beside the first"
    assert time.monotonic() - started < 10
    assert caught and caught[0]["slow"].state == "live"
    assert good.calls == [(0, 1)]
    marks = [
        (e.sink, e.batch_id, e.rows)
        for e in DeltaLedger(ledger).committed_entries("twice")
        if e.sink == "slow"
    ]
    assert marks == [("slow", 0, 3)]
    deadline = time.monotonic() + 10
    while slow.closed == 0 and time.monotonic() < deadline:  # closed once its write ended
        time.sleep(0.02)
    assert slow.closed == 1
