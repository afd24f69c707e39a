"""A driver of one's own (``writeStream.foreachBatch(fan)``) restarted with a lagging sink
back and no new data: Spark runs no batch, and ``fan.start_catch_up(query)`` catches the
sink up beside the query (docs/architecture.md §14.4, "Before the first batch"). Real
Spark, a real checkpoint (its location asked of the query), a real spool and Delta ledger."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from fanout import FanOut
from fanout.ledger.delta import DeltaLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.integration.streams import (
    SCHEMA,
    DownSink,
    committed_marks,
    delta_rows,
    run_stream,
    write_input,
)


def _fan(tmp_path: Path, copy: DownSink, probe_interval_s: float) -> FanOut:
    return FanOut(
        "restart", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         SinkSpec(copy, lag=lag_policy("copy", {"on_failure": "lag"}))],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=probe_interval_s,
    )  # fmt: skip


def test_a_restart_with_no_new_data_catches_the_sink_up_once_start_catch_up_is_called(
    spark: Any, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", 3, 4)
    first = _fan(tmp_path, DownSink("copy", down=True), 3600)
    try:
        run_stream(spark, tmp_path / "input", first, tmp_path / "checkpoint")
    finally:
        first.close()
    assert committed_marks(tmp_path / "ledger", "restart") == Counter(
        {("lake", b): 1 for b in range(3)}
    )

    copy = DownSink("copy", down=False)
    fan = _fan(tmp_path, copy, 1)
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
    query = (
        stream.json(str(tmp_path / "input"))
        .writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        assert fan.start_catch_up(query) is None
        deadline = time.monotonic() + 120
        ledger = DeltaLedger(str(tmp_path / "ledger"))
        while ledger.last_committed("restart", ["copy"])["copy"] != 2:
            assert time.monotonic() < deadline, ledger.last_committed("restart", ["copy"])
            time.sleep(0.2)
        assert query.lastProgress is None or query.lastProgress["numInputRows"] == 0
    finally:
        query.stop()
        fan.close()

    assert copy.calls == [(0, 1), (1, 1), (2, 1)]
    by_id = sorted(
        (r for batch in copy.batches.values() for r in batch), key=lambda r: r["order_id"]
    )
    assert by_id == rows
    assert {b: [r["order_id"] for r in batch] for b, batch in copy.batches.items()} == {
        b: [b * 4 + i for i in range(4)] for b in range(3)
    }
    assert sorted(delta_rows(tmp_path / "lake"), key=lambda r: r["order_id"]) == rows
    assert committed_marks(tmp_path / "ledger", "restart") == Counter(
        {(sink, b): 1 for sink in ("lake", "copy") for b in range(3)}
    )
    assert fan.spool is not None and fan.spool.size() == (0, 0, 0)
