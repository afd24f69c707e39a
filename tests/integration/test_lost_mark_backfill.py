"""A sink backfilled from another's lost mark (ARCHITECTURE §5, "A batch written but never
marked"): the mark fanout recorded at a refused epoch start has no row counts, so the
backfill reads back the letters its source set aside whatever their number, instead of
taking a null count for none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, UnmarkedBatchError, hookimpl
from fanout.ledger.delta import DeltaLedger
from tests.integration.streams import delta_rows

SCHEMA = "id LONG, k STRING"
ROWS = {0: [(1, "a")], 1: [(2, "b"), (3, "")], 2: [(4, "c")]}  # 3: set aside (k "")


class DriverKilled(BaseException):
    """The driver's death, between lake's commit of batch 1 and its mark."""


class KillAfterLakeWrote:
    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 1 and sink == "lake":
            raise DriverKilled("killed between the write and the mark")


def _process(fan: FanOut, spark: Any, query: str, batch: int) -> None:
    info = BatchInfo("lost", batch, query, [{"t": {"0": batch + 1}}], batch_timestamp_ms=batch)
    fan.process(spark.createDataFrame(ROWS[batch], SCHEMA), info)


def test_a_backfill_from_a_lost_mark_takes_the_letters_its_source_set_aside(
    spark: Any, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger")
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake"),
            "partition_by": ["k"], "dead_letter": str(tmp_path / "dead")}  # fmt: skip
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
            "backfill_from": "lake"}  # fmt: skip
    old = FanOut("lost", ledger, [lake], plugins=[KillAfterLakeWrote()], backoff_s=0)
    _process(old, spark, "q", 0)
    with pytest.raises(DriverKilled):
        _process(old, spark, "q", 1)
    letters = [(r["batch_id"], json.loads(r["row"])["id"]) for r in delta_rows(tmp_path / "dead")]
    assert letters == [(1, 3)]
    with pytest.raises(UnmarkedBatchError, match="sink lake holds batch 1 of epoch 0"):
        _process(FanOut("lost", ledger, [lake], on_checkpoint_reset="new_epoch"), spark, "r", 0)
    [lost] = [e for e in DeltaLedger(ledger).committed_entries("lost") if e.batch_id == 1]
    assert (lost.sink, lost.lost, lost.rows, lost.dead_lettered) == ("lake", True, None, None)

    fan = FanOut("lost", ledger, [lake, copy], backoff_s=0, spool=str(tmp_path / "spool"))
    try:
        _process(fan, spark, "q", 2)  # the old query, restarted: batch 2 is new
        assert fan.catch_up(timeout_s=120)["copy"].state == "live"
    finally:
        fan.close()
    got = sorted((r["id"], r["k"]) for r in delta_rows(tmp_path / "copy"))
    assert got == [(1, "a"), (2, "b"), (3, ""), (4, "c")], "the lake's letter of batch 1 too"
