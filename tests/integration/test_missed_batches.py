"""A Delta sink left out of the pipeline for two batches and put back is refused before any
sink writes the next batch (``MissedBatchesError``), and ``backfill_from`` the pipeline's
other Delta sink, the way on the refusal names, gives it exactly the batches it missed:
real local Spark, a Delta ledger, two Delta sinks and a spool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, MissedBatchesError
from fanout.ledger.delta import DeltaLedger
from tests.integration.streams import delta_rows


def _ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in delta_rows(path))


def test_a_delta_sink_put_back_is_refused_then_backfilled_from_the_other(
    spark: Any, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger")
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}

    def run(sinks: list[dict[str, Any]], batches: range, **options: Any) -> FanOut:
        fan = FanOut("mb", ledger, sinks, backoff_s=0, **options)
        try:
            for b in batches:
                frame = spark.createDataFrame([(b * 10,), (b * 10 + 1,)], "id LONG")
                fan.process(frame, BatchInfo("mb", b, "q"))
        finally:
            fan.close()
        return fan

    run([lake, copy], range(2))
    run([lake], range(2, 4))  # "copy" left out for batches 2 and 3
    with pytest.raises(MissedBatchesError) as refused:
        run([lake, copy], range(4, 5))
    assert (refused.value.sink, refused.value.mark, refused.value.missing) == ("copy", 1, [2, 3])
    assert f"fanout ledger skip --ledger {ledger} --pipeline mb --sink copy" in str(refused.value)
    assert _ids(tmp_path / "lake") == [0, 1, 10, 11, 20, 21, 30, 31]  # batch 4 nowhere
    assert _ids(tmp_path / "copy") == [0, 1, 10, 11]

    backfilled = {**copy, "backfill_from": "lake"}
    fan = FanOut("mb", ledger, [lake, backfilled], backoff_s=0, spool=str(tmp_path / "spool"))
    try:
        fan.process(spark.createDataFrame([(40,), (41,)], "id LONG"), BatchInfo("mb", 4, "q"))
        assert fan.catch_up(timeout_s=120)["copy"].state == "live"
    finally:
        fan.close()
    every = [0, 1, 10, 11, 20, 21, 30, 31, 40, 41]
    assert (_ids(tmp_path / "lake"), _ids(tmp_path / "copy")) == (every, every)
    assert DeltaLedger(ledger).last_committed("mb", ["lake", "copy"]) == {"lake": 4, "copy": 4}
