"""Core review (session 44): holes in the dispatcher's own logic, each shown by a test that
fails on the code as reviewed. Each is marked ``xfail(strict=True)``: the fix removes the
mark. Memory ledger and a real spool (delta-rs), as tests/unit/test_lag.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError, FanOut, FanoutError, SinkWriteError
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import SchemaFrame, ScriptedSink


def _catch_up_from_memory(fan: FanOut, frames: dict[int, SchemaFrame]) -> None:
    """The catch-up reads the spool with Spark; here it reads the frames the test kept
    (as tests/unit/test_lag.py does)."""

    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
        assert spooled is not None, key
        return frames[key[1]], spooled.info()

    fan.catchup._reader.read = read  # type: ignore[method-assign]


def _lag(sink: ScriptedSink) -> SinkSpec:
    return SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag"}))


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


def test_a_lagging_sink_left_out_for_one_start_gets_its_missed_batches_when_put_back(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    spool = str(tmp_path / "spool")
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(4)}
    down = ScriptedSink("down")
    fan = FanOut(
        "gap", ledger, [ScriptedSink("good"), _lag(down)], backoff_s=0, spool=spool,
        probe_interval_s=3600,
    )  # fmt: skip
    try:
        fan.process(frames[0], BatchInfo("gap", 0, "q"))
        down.always_fail = SinkWriteError("refused", sink="down")
        fan.process(frames[1], BatchInfo("gap", 1, "q"))  # "down" lags: batch 1 spooled for it
        assert [b.batch_id for b in fan.lagging.spool.needed_by("down")] == [1]  # type: ignore[union-attr]
    finally:
        fan.close()

    # its target stays down for a while: the pipeline restarts without it...
    without = FanOut("gap", ledger, [ScriptedSink("good")], backoff_s=0, spool=spool)
    try:
        without.process(frames[2], BatchInfo("gap", 2, "q"))
    finally:
        without.close()

    # ...and with it again once its target is back
    back = ScriptedSink("down")
    fan = FanOut(
        "gap", ledger, [ScriptedSink("good"), _lag(back)], backoff_s=0, spool=spool,
        probe_interval_s=3600,
    )  # fmt: skip
    _catch_up_from_memory(fan, frames)  # the spool is readable whether or not Spark runs
    try:
        try:
            fan.process(frames[3], BatchInfo("gap", 3, "q"))
        except FanoutError as refused:  # a loud refusal naming the sink closes the hole
            assert "down" in str(refused)
            assert back.calls == [(1, 1)]  # batch 1, held for it, given before the refusal
            return
        _catch_up_from_memory(fan, frames)
        fan.catch_up(timeout_s=30)
    finally:
        fan.close()
    assert (1, 1) in back.calls, (
        f"sink 'down' held batch 0 and lagged at batch 1; left out for batch 2 and put back, "
        f"it was written {back.calls} without an error: batch 1, spooled for it, was "
        "released while it was left out and is lost for it (batch 2 it never had)"
    )


class _Streams:
    def __init__(self, running: list[str]) -> None:
        self.active = [type("Query", (), {"id": q})() for q in running]


class _ConnectSession:
    def __init__(self, running: list[str]) -> None:
        self.streams = _Streams(running)


class _ConnectFrame:
    """A foreachBatch DataFrame as Spark Connect hands it over (no local properties)."""

    def __init__(self, running: list[str]) -> None:
        self.sparkSession = _ConnectSession(running)


_ConnectFrame.__module__ = "pyspark.sql.connect.dataframe"
_ConnectSession.__module__ = "pyspark.sql.connect.session"


def _checkpoint(path: Path, query_id: str, planned_ms: int) -> str:
    (path / "offsets").mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    (path / "offsets" / "0").write_text(
        f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{planned_ms}}}\n{{"logOffset":0}}\n'
    )
    return str(path)


def test_under_connect_the_checkpoint_of_another_running_query_is_refused(
    tmp_path: Path,
) -> None:
    from fanout.steps.context import ContextReader

    _checkpoint(tmp_path / "orders", "q-orders", 1000)
    other = _checkpoint(tmp_path / "payments", "q-payments", 2000)
    # the orders pipeline is given the payments query's checkpoint by mistake
    reader = ContextReader("orders", checkpoint_location=other)
    batch = _ConnectFrame(running=["q-orders", "q-payments"])
    try:
        info = reader.read(batch, 0)
    except ConfigurationError:
        return
    raise AssertionError(
        f"the orders query's batch was read as query {info.query_id} planned at "
        f"{info.batch_timestamp_ms} (the payments query's checkpoint) without an error"
    )


def test_recover_resumes_after_the_sinks_the_pipeline_still_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fanout.app.cli import main as cli

    ledger = str(tmp_path / "ledger")

    def run(sinks: list[str], batches: range) -> None:
        fan = FanOut("rec", ledger, [ScriptedSink(s) for s in sinks], backoff_s=0)
        try:
            for b in batches:
                offsets = [{"logOffset": b}]
                fan.process(SchemaFrame([b]), BatchInfo("rec", b, "q", offsets))
        finally:
            fan.close()

    run(["orders", "audit"], range(2))  # batches 0-1 to both sinks
    run(["orders"], range(2, 6))  # "audit" was taken out of the pipeline; 2-5 to orders
    capsys.readouterr()
    assert cli(["recover", "--ledger", ledger, "--pipeline", "rec"]) == 0
    said = capsys.readouterr().out
    assert "Resume after batch 5" in said, (
        "after batch 5 the checkpoint is lost; the pipeline writes only 'orders', which "
        f"holds batches 0-5, but `fanout recover` says:\n{said}"
    )
