"""Core review (session 44): holes in the dispatcher's own logic, each shown by a test that
fails on the code as reviewed. Each is marked ``xfail(strict=True)``: the fix removes the
mark. Memory ledger and a real spool (delta-rs), as tests/unit/test_lag.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fanout import FanOut, FanoutError, SinkWriteError
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import SchemaFrame, ScriptedSink


def _lag(sink: ScriptedSink) -> SinkSpec:
    return SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag"}))


@pytest.mark.xfail(
    strict=True,
    reason="core review finding 1: a lag sink whose spool is lost is written live past "
    "the batches it missed (its ledger mark shows the gap), silently",
)
def test_a_lag_sink_whose_spool_was_lost_is_not_written_past_its_missed_batches(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    spool = tmp_path / "spool"
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(4)}
    down = ScriptedSink("down")
    fan = FanOut(
        "gap", ledger, [ScriptedSink("good"), _lag(down)], backoff_s=0, spool=str(spool),
        probe_interval_s=3600,
    )  # fmt: skip
    try:
        fan.process(frames[0], BatchInfo("gap", 0, "q"))  # both hold batch 0
        down.always_fail = SinkWriteError("refused", sink="down")
        for batch in (1, 2):  # "down" lags: batches 1 and 2 wait in the spool for it
            fan.process(frames[batch], BatchInfo("gap", batch, "q"))
    finally:
        fan.close()
    assert ledger.last_committed("gap", ["good", "down"]) == {"good": 2, "down": 0}

    shutil.rmtree(spool)  # the spool directory is lost (or the pipeline is given another)
    back = ScriptedSink("down")  # the sink's target is reachable again
    fan = FanOut(
        "gap", ledger, [ScriptedSink("good"), _lag(back)], backoff_s=0, spool=str(spool),
        probe_interval_s=3600,
    )  # fmt: skip
    try:
        try:
            fan.process(frames[3], BatchInfo("gap", 3, "q"))
        except FanoutError as refused:  # a loud refusal naming the sink closes the hole
            assert "down" in str(refused)
            assert back.calls == []
            return
    finally:
        fan.close()
    # written: then it must have received what it missed, in order, before batch 3
    assert back.calls == [(1, 1), (2, 1), (3, 1)], (
        f"sink 'down' held batch 0, missed batches 1-2 (their spool is gone) and was "
        f"written {back.calls} without an error: batches 1 and 2 are lost for it"
    )
