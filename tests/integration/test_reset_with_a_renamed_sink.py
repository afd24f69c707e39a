"""A sink renamed between a crash and a checkpoint reset (ARCHITECTURE §5, "A batch written
but never marked", "A sink renamed").

The old query's driver dies after sink ``bronze`` committed batch 3 (rows 30-39) to its
Delta table and before the ledger mark. The checkpoint is replaced and ``bronze`` renamed
``bronze2`` (same table) in the same restart; ``fanout recover`` says "resume after batch
2". The epoch start asked only the sinks configured now about their batch after their mark
of the replaced epoch: ``bronze2`` has none there and its own name wrote nothing, so the new
epoch started and wrote rows 30-39 into the table a second time. Now the start is refused
before anything of epoch 1 is written (:func:`fanout.steps.renamed.refuse_renamed_at_reset`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut
from fanout.errors import RenamedSinkError, UnmarkedBatchError
from fanout.ledger.delta import DeltaLedger
from tests.in_process_cli import Cli
from tests.integration import two_sink_resets as resets
from tests.integration.test_unmarked_batch import (
    _killed_after_bronze_wrote_batch_3,
)
from tests.integration.two_sink_resets import NEW

PIPELINE = "unmarked"
_run, _ids, _marks = resets.run, resets.ids, resets.marks


def _renamed(tmp_path: Path) -> FanOut:
    """The pipeline with ``bronze`` renamed ``bronze2`` (same table), accepting a reset."""
    return FanOut(
        PIPELINE,
        str(tmp_path / "ledger"),
        [
            {"type": "delta", "name": "bronze2", "path": str(tmp_path / "bronze")},
            {"type": "delta", "name": "silver", "path": str(tmp_path / "silver")},
        ],
        on_checkpoint_reset="new_epoch",
        parallelism=1,
        retries=0,
    )


def _refused(spark: Any, tmp_path: Path, fanout_cli: Cli) -> str:
    """Bronze wrote batch 3 unmarked and died; the reset with bronze renamed bronze2 is
    refused before epoch 1 starts (before the fix: rows 30-39 twice in the table)."""
    _killed_after_bronze_wrote_batch_3(spark, tmp_path, fanout_cli)
    with pytest.raises(RenamedSinkError) as refused:
        _run(_renamed(tmp_path), spark, NEW, 0, 30)  # recover's offsets
    assert refused.value.sink == "bronze2"
    assert refused.value.batch_id == 3
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert _ids(tmp_path, "silver") == list(range(30))
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch(PIPELINE) == 0
    return str(refused.value)


def test_a_sink_renamed_at_a_reset_after_an_unmarked_batch_is_refused(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The refusal names both sinks, the batch and the table; its Delta way on (restore the
    table to before batch 3's commit, restart), run as printed, writes rows 30-39 once."""
    message = _refused(spark, tmp_path, fanout_cli)
    bronze = tmp_path / "bronze"
    assert message.startswith(
        f"sink 'bronze2', batch 3: path '{bronze}' holds batch 3 of sink 'bronze' (epoch 0, "
        "its records keyed 'fanout/unmarked/bronze'), a sink the pipeline no longer "
        "configures, and sink 'bronze2' has no mark in the epoch."
    )
    assert "Either rename the sink back to 'bronze' and restart" in message
    assert "for a Delta table: RESTORE it to the version before the batch's commit" in message
    from deltalake import DeltaTable

    DeltaTable(str(bronze)).restore(2)  # batch 3's commit was version 3
    _run(_renamed(tmp_path), spark, NEW, 0, 30)
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert _ids(tmp_path, "silver") == list(range(40))
    assert [m for m in _marks(tmp_path) if m[0] == 1] == [(1, "bronze2", 0), (1, "silver", 0)]


def test_renaming_it_back_is_the_unmarked_batch_refusal(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The other printed way on, the sink renamed back to bronze and restarted: the epoch
    start asks bronze about batch 3 under its own name, and refuses with the unmarked
    batch's choices (test_unmarked_batch runs them), nothing of epoch 1 written."""
    _refused(spark, tmp_path, fanout_cli)
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(resets.fan(PIPELINE, tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    assert str(refused.value).startswith(
        "pipeline 'unmarked': query query-new cannot start epoch 1: sink bronze holds batch 3 "
        "of epoch 0 by its own records, and the ledger had no mark of it"
    )
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert _ids(tmp_path, "silver") == list(range(30))


def _lagging(tmp_path: Path, name: str) -> FanOut:
    """test_renamed_lagging_sink's pipeline (``lake``, and ``name`` lagging on table
    ``copy``), accepting a checkpoint reset."""
    return FanOut(
        "ren", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         {"type": "delta", "name": name, "path": str(tmp_path / "copy"), "on_failure": "lag",
          "retries": 0}],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
        on_checkpoint_reset="new_epoch",
    )  # fmt: skip


def _process(spark: Any, fan: FanOut, batch: int, first: int) -> None:
    """``fan`` processes orders ``first`` .. ``first + 2`` as batch ``batch`` of query
    ``q-new`` (a new checkpoint), then is closed."""
    try:
        df = spark.range(first, first + 3).withColumnRenamed("id", "order_id")
        fan.process(df, BatchInfo("ren", batch, "q-new", [{"s": 3}]))
    finally:
        fan.close()


def test_a_lagging_sink_renamed_at_a_reset_is_refused(spark: Any, tmp_path: Path) -> None:
    """``copy`` lags on batches 1 and 2 (spooled), then is renamed ``copy2`` (same table)
    at a checkpoint reset. Before, the new epoch started, ``copy2`` wrote its batch 0
    (orders 30-32) and the table never got batches 1-2 (orders 10-12, 20-22): only the
    start's warning said the spool kept them for a sink not configured. Now the start is
    refused, nothing written; its first way on, run as printed (renamed back, restarted),
    starts the new epoch and ``copy`` catches up from the spool: every order once."""
    from tests.integration.test_renamed_lagging_sink import _ids as copy_ids
    from tests.integration.test_renamed_lagging_sink import _lag_on_batches_1_and_2

    assert _lag_on_batches_1_and_2(spark, tmp_path) == [(1, ["copy"]), (2, ["copy"])]
    with pytest.raises(RenamedSinkError) as refused:
        _process(spark, _lagging(tmp_path, "copy2"), 0, 30)
    message = str(refused.value)
    assert message.startswith(f"sink 'copy2', batch 3: path '{tmp_path / 'copy'}' holds batch 0 "
                              "of sink 'copy' (epoch 0")  # fmt: skip
    assert "keeps batches 1-2 of epoch 0 for sink 'copy', which lagged" in message
    assert "Either rename the sink back to 'copy' and restart: it catches up from the spool" in (
        message
    )
    assert sorted(copy_ids(tmp_path / "copy")) == [0, 1, 2]
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch("ren") == 0

    back = _lagging(tmp_path, "copy")
    try:
        back.process(
            spark.range(30, 33).withColumnRenamed("id", "order_id"),
            BatchInfo("ren", 0, "q-new", [{"s": 3}]),
        )
        assert {n: s.state for n, s in back.catch_up(timeout_s=120).items()} == {"copy": "live"}
    finally:
        back.close()
    expected = [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert sorted(copy_ids(tmp_path / "copy").elements()) == expected
    assert sorted(copy_ids(tmp_path / "lake").elements()) == expected
