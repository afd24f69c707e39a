"""The Delta sink's own records (its app transactions in the table's log) expired while
the table still holds the batches: what a replay of a batch written and never marked does.

Known gap (docs/architecture.md §5, "A sink's own records gone"; fanout.delta_tables.
retention): a table with ``delta.setTransactionRetentionDuration`` forgets the
transactions that long after the last batch, so ``holds_batch`` answers ``None`` (an idle
pipeline's restart must pass) and the replay writes the batch a second time. The sink's
``min_txn_retention_hours`` (168 h by default) refuses a shorter retention at ``open()``;
this test sets it to 0. Kept as a strict xfail: it fails the day it is fixed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from deltacheck import ids

from fanout import BatchInfo, FanOut
from fanout.testing.faults import DieAfterWrite, DriverKilled

pytestmark = pytest.mark.integration


def _write(fan: FanOut, spark: Any, batch_id: int) -> None:
    """Batch ``batch_id`` of pipeline ``gonedelta``: ids ``10 * batch_id`` + 0..2."""
    info = BatchInfo("gonedelta", batch_id, "query-1", [{"src": {"0": batch_id + 1}}])
    fan.process(spark.createDataFrame([(batch_id * 10 + n,) for n in range(3)], "id LONG"), info)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Delta app transactions expired: batch 1 written again",
)
def test_an_expired_transaction_of_an_unmarked_batch_does_not_let_its_replay_write_it_again(
    spark: Any, tmp_path: Path
) -> None:
    sinks = [{"type": "delta", "name": "silver", "path": str(tmp_path / "silver"),
              "configuration": {"delta.setTransactionRetentionDuration": "interval 2 seconds"},
              "min_txn_retention_hours": 0}]  # fmt: skip

    def fan(*plugins: object) -> FanOut:
        return FanOut("gonedelta", str(tmp_path / "ledger"), sinks, retries=0, plugins=plugins)

    first = fan(DieAfterWrite("silver", 1))
    _write(first, spark, 0)
    with pytest.raises(DriverKilled):
        _write(first, spark, 1)
    first.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]
    time.sleep(3)  # the transactions expire

    replay = fan()
    try:
        _write(replay, spark, 1)
    except Exception as refused:  # a refusal naming the sink would do: nothing written
        assert "sink 'silver'" in str(refused)
    finally:
        replay.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]
