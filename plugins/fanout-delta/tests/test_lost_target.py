"""A Delta table deleted between two runs, created again by the sink: its last marked batch
is gone (a new table has no app transaction of the pipeline), so the next run's first batch
is refused with :class:`fanout.TargetLostError` before anything is written, instead of
writing on while the ledger and ``fanout status`` count batches 0-1 there (ARCHITECTURE §5,
"A target lost behind fanout's back")."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from deltacheck import ids

from fanout import BatchInfo, FanOut, TargetLostError

pytestmark = pytest.mark.integration


def _fan(tmp_path: Path, **options: Any) -> FanOut:
    sinks = [{"type": "delta", "name": "silver", "path": str(tmp_path / "silver")}]
    return FanOut("lostdelta", str(tmp_path / "ledger"), sinks, retries=0, **options)


def _run(fan: FanOut, spark: Any, batch_id: int) -> None:
    """A new batch ``batch_id``, planned now (as Spark stamps a batch its run plans: a
    replay would keep its first attempt's time, fanout.steps.replay)."""
    rows = [(batch_id * 10 + n,) for n in range(3)]
    info = BatchInfo("lostdelta", batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=int(time.time() * 1000))  # fmt: skip
    fan.process(spark.createDataFrame(rows, "id LONG"), info)


def test_a_deleted_table_refuses_the_next_run_and_an_accepted_loss_writes_on(
    spark: Any, tmp_path: Path
) -> None:
    first = _fan(tmp_path)
    _run(first, spark, 0)
    _run(first, spark, 1)
    first.close()
    shutil.rmtree(tmp_path / "silver")

    second = _fan(tmp_path)
    with pytest.raises(TargetLostError) as refused:
        _run(second, spark, 2)
    second.close()
    assert str(refused.value).startswith(
        f"sink 'silver', batch 1: pipeline 'lostdelta': path '{tmp_path / 'silver'}' no "
        "longer holds batch 1 of epoch 0, which the ledger marks written there (its last "
        "marked batch that wrote rows): the target was probably deleted or replaced since, "
        "and created again empty"
    )
    assert "Nothing was written by this run." in str(refused.value)
    assert "`fanout run PIPELINE.toml --accept-lost-target silver`" in str(refused.value)
    assert not (tmp_path / "silver" / "_delta_log").exists() or ids(tmp_path / "silver") == []

    accepting = _fan(tmp_path, accept_lost_targets=["silver"])
    _run(accepting, spark, 2)
    accepting.close()
    assert ids(tmp_path / "silver") == [20, 21, 22]
    after = _fan(tmp_path)  # its mark 2 is in the new table: the next run passes
    _run(after, spark, 3)
    after.close()
    assert ids(tmp_path / "silver") == [20, 21, 22, 30, 31, 32]


def test_a_restart_with_the_table_in_place_passes_also_after_an_empty_batch(
    spark: Any, tmp_path: Path
) -> None:
    first = _fan(tmp_path)
    _run(first, spark, 0)
    info = BatchInfo("lostdelta", 1, "query-1", [{"src": {"0": 1}}],
                     batch_timestamp_ms=int(time.time() * 1000))  # fmt: skip
    first.process(spark.createDataFrame([], "id LONG"), info)  # commits nothing there
    first.close()

    second = _fan(tmp_path)
    _run(second, spark, 2)
    second.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 20, 21, 22]


def test_a_transaction_the_table_expired_does_not_refuse_an_idle_pipelines_restart(
    spark: Any, tmp_path: Path
) -> None:
    """A table with ``delta.setTransactionRetentionDuration`` forgets the app transaction
    that long after the last batch (delta-rs when it reads the log): a pipeline idle longer
    than that (168 h is the floor fanout accepts by default) has its table, every row, and
    no transaction. Its restart must write on, not be refused as a lost table."""
    sinks = [{"type": "delta", "name": "silver", "path": str(tmp_path / "silver"),
              "configuration": {"delta.setTransactionRetentionDuration": "interval 2 seconds"},
              "min_txn_retention_hours": 0}]  # fmt: skip

    def fan() -> FanOut:
        return FanOut("lostdelta", str(tmp_path / "ledger"), sinks, retries=0)

    first = fan()
    _run(first, spark, 0)
    _run(first, spark, 1)
    first.close()
    time.sleep(3)  # idle longer than the retention

    second = fan()
    _run(second, spark, 2)
    second.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12, 20, 21, 22]
