"""The Prometheus observer: counts match what the sinks committed; served over HTTP."""

from __future__ import annotations

import urllib.request

import pyarrow as pa

from fanout import BatchFailedError, BatchInfo, FanOut, SinkResult
from fanout.ledger.memory import MemoryLedger
from fanout.observe.metrics import MetricsObserver
from fanout.testing import ArrowFrame, FlakySink, RecordingSink


class DeadLettering(RecordingSink):
    def write(self, batch: object) -> SinkResult:
        result = super().write(batch)  # type: ignore[arg-type]
        return SinkResult(rows=result.rows - 1, dead_lettered=1)


def test_counters_match_the_ledger() -> None:
    observer = MetricsObserver.serve("m", port=0, host="127.0.0.1")
    try:
        ledger = MemoryLedger()
        flaky = FlakySink(RecordingSink("flaky"), fail_on=[1], times=1, transient=True)
        broken = FlakySink(RecordingSink("broken"), fail_on=[2], times=5)
        fan = FanOut(
            "m",
            ledger,
            [RecordingSink("plain"), DeadLettering("dl"), flaky, broken],
            retries=1,
            backoff_s=0,
            plugins=[observer],
        )
        frame = ArrowFrame(pa.table({"x": [1, 2, 3]}))
        for batch in range(3):
            try:
                fan.process(frame, BatchInfo("m", batch, "q"))
            except BatchFailedError:
                assert batch == 2
        committed = [e for e in ledger.entries if e.status == "committed"]
        for sink in ("plain", "dl", "flaky", "broken"):
            marks = [e for e in committed if e.sink == sink]
            assert observer.value("fanout_rows_written_total", sink=sink) == sum(
                e.rows or 0 for e in marks
            )
            assert observer.value("fanout_last_committed_batch", sink=sink) == max(
                e.batch_id for e in marks
            )
        assert observer.value("fanout_rows_written_total", sink="plain") == 9
        assert observer.value("fanout_rows_written_total", sink="dl") == 6
        assert observer.value("fanout_dead_lettered_rows_total", sink="dl") == 3
        assert observer.value("fanout_sink_retries_total", sink="flaky") == 1
        assert observer.value("fanout_sink_failures_total", sink="broken") == 1
        assert observer.value("fanout_last_committed_batch", sink="broken") == 1
        assert observer.value("fanout_batches_total", outcome="committed") == 2
        assert observer.value("fanout_batches_total", outcome="failed") == 1
        assert observer.value("fanout_batch_duration_seconds_count") == 3

        assert observer.value("fanout_rows_already_written_total", sink="plain") == 0

        scraped = urllib.request.urlopen(f"http://127.0.0.1:{observer.port}/metrics").read()
        text = scraped.decode()
        assert 'fanout_rows_written_total{pipeline="m",sink="plain"} 9.0' in text
        assert 'fanout_batches_total{outcome="failed",pipeline="m"} 1.0' in text
    finally:
        observer.stop()


class HeldAlready(RecordingSink):
    """Finds every batch written already by its own records (a replay after a lost mark)."""

    def write(self, batch: object) -> SinkResult:
        return SinkResult(rows=3, already_written=True)


def test_rows_found_already_written_are_counted_apart() -> None:
    """A replay that wrote nothing counted its batch's rows in fanout_rows_written_total."""
    observer = MetricsObserver("m")
    fan = FanOut("m", MemoryLedger(), [HeldAlready("pg"), RecordingSink("lake")],
                 plugins=[observer])  # fmt: skip
    fan.process(ArrowFrame(pa.table({"x": [1, 2, 3]})), BatchInfo("m", 0, "q"))
    assert observer.value("fanout_rows_written_total", sink="pg") == 0
    assert observer.value("fanout_rows_already_written_total", sink="pg") == 3
    assert observer.value("fanout_rows_written_total", sink="lake") == 3
    assert observer.value("fanout_rows_already_written_total", sink="lake") == 0
