"""The query refused for a batch a sink wrote but never marked, started again (ARCHITECTURE
§5, "A batch written but never marked").

A one-sink pipeline: the driver dies after ``bronze`` committed batch 3, before its mark. The
new checkpoint starts after batch 2 (what ``fanout recover`` printed) and its start is
refused; the lost mark is recorded, so ``fanout recover`` now resumes after batch 3 (offsets
unknown: no sink marked it). The same query started again asked about batch 4 only, passed,
and wrote batch 3's rows (30-39) to bronze a second time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, hookimpl
from fanout.errors import UnmarkedBatchError
from tests.in_process_cli import Cli
from tests.integration.streams import delta_rows

PIPELINE = "restarted"


class DriverKilled(BaseException):
    """The driver's death between bronze's write of batch 3 and its mark."""


class KillAfterWrite:
    """Kills the driver right after a sink wrote batch 3, before its ledger mark."""

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 3:
            raise DriverKilled("killed between the write and the mark")


def _fan(tmp_path: Path, *plugins: object, on_reset: str = "refuse") -> FanOut:
    return FanOut(
        PIPELINE,
        str(tmp_path / "ledger"),
        [{"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze")}],
        on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
        plugins=plugins,
        retries=0,
    )


def _run(fan: FanOut, spark: Any, query: str, batch_id: int, first_row: int) -> None:
    rows = [(n, f"order-{n}") for n in range(first_row, first_row + 10)]
    offsets = [{"orders": {"0": first_row + 10}}]
    info = BatchInfo(PIPELINE, batch_id, query, offsets, batch_timestamp_ms=1000 + batch_id)
    fan.process(spark.createDataFrame(rows, "id LONG, name STRING"), info)


def _recover(tmp_path: Path, fanout_cli: Cli) -> str:
    ran = fanout_cli("recover", "--ledger", tmp_path / "ledger", "--pipeline", PIPELINE)
    assert ran.returncode == 0, ran
    return ran.stdout


def _ids(tmp_path: Path) -> list[int]:
    return sorted(r["id"] for r in delta_rows(tmp_path / "bronze"))


def test_the_refused_query_started_again_is_refused_again(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Before: the second start passed and bronze held rows 30-39 twice. Now it is refused
    again, saying where a new checkpoint must start; with bronze's copy removed, a new
    checkpoint from the same start writes batch 3's input once."""
    old = _fan(tmp_path, KillAfterWrite())
    for batch in range(3):
        _run(old, spark, "query-old", batch, batch * 10)
    with pytest.raises(DriverKilled):
        _run(old, spark, "query-old", 3, 30)
    assert """.option("startingOffsets", '{"orders": {"0": 30}}')""" in _recover(
        tmp_path, fanout_cli
    )
    with pytest.raises(UnmarkedBatchError, match="sink bronze holds batch 3 of epoch 0") as first:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-new", 0, 30)
    assert (
        "  Every sink holds batch 3, so resume after it; `fanout recover --ledger "
        f"{tmp_path / 'ledger'} --pipeline restarted` cannot print its offsets (no sink marked "
        "it): the replaced checkpoint's offsets/3 file holds them (one JSON line per source, "
        "after the first two lines). This query's checkpoint starts before it: start a new one."
    ) in str(first.value)
    report = _recover(tmp_path, fanout_cli)
    assert "Resume after batch 3" in report
    assert (
        "No source offsets were recorded for that batch: the replaced checkpoint's offsets/3 "
        "file holds them, if it is still there (one JSON line per source, after the first two "
        "lines)."
    ) in report.splitlines()

    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-new", 0, 30)
    ledger = tmp_path / "ledger"
    assert str(refused.value) == "\n".join(
        [
            "pipeline 'restarted': query query-new cannot start epoch 1: it was refused "
            "before because sink bronze held batch 3 of epoch 0 unmarked, so its checkpoint "
            "starts before that batch; every sink now counts batch 3 (`fanout recover "
            f"--ledger {ledger} --pipeline restarted` resumes after it), and bronze still "
            "holds it: started again, this query would write batch 3's rows a second time "
            "there. Nothing was written under epoch 1.",
            "Start a new checkpoint (not this one) that reads what comes after the source "
            "offsets of batch 3, which the ledger does not hold (no sink marked it): the "
            "replaced checkpoint's offsets/3 file holds them (one JSON line per source, after "
            "the first two lines). Or remove bronze's copy of batch 3 so that the sink's own "
            "records no longer hold it (a Delta table: a restore to a version before the "
            "batch's commit), and start this query again: it passes, and writes the batch "
            f"once. bronze: Its rows are version 3 of the Delta table at {tmp_path / 'bronze'}, "
            "the table's last commit: to remove them, restore the table to version 2 "
            "(delta-rs: DeltaTable(path).restore(2); Spark SQL: RESTORE TABLE "
            f"delta.`{tmp_path / 'bronze'}` TO VERSION AS OF 2).",
        ]
    )
    assert _ids(tmp_path) == list(range(40))

    from deltalake import DeltaTable

    DeltaTable(str(tmp_path / "bronze")).restore(2)  # bronze's copy removed
    # this query started again, as printed (before: a new checkpoint from the same start,
    # which is not a way the refusal names: the ledger cannot tell it from one after batch
    # 3, where bronze, the only sink, would lose rows 30-39; refused since 9673cdfd)
    _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-new", 0, 30)
    assert _ids(tmp_path) == list(range(40))


def test_the_refused_query_passes_once_the_restore_its_refusal_names_removed_the_copy(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The way out of the refusal above with the same checkpoint is the one command the
    first refusal names: the restore of bronze's table to the version before the batch.
    Before, the restore kept the table's app transaction, so bronze still counted as
    holding batch 3 and the query stayed refused (only a new checkpoint passed). Now a
    restore to before the batch's commit counts as its removal: the query starts epoch 1
    and bronze holds rows 30-39 once; a restore back to the batch's version holds it
    again."""
    from deltalake import DeltaTable

    old = _fan(tmp_path, KillAfterWrite())
    for batch in range(3):
        _run(old, spark, "query-old", batch, batch * 10)
    with pytest.raises(DriverKilled):
        _run(old, spark, "query-old", 3, 30)
    with pytest.raises(UnmarkedBatchError) as first:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-new", 0, 30)
    restore = "restore the table to version 2 (delta-rs: DeltaTable(path).restore(2)"
    assert restore in str(first.value)
    assert (
        "Or remove bronze's copy as said above and start this query again, not a new "
        "checkpoint (the ledger counts the batch as held by bronze now: a new checkpoint after "
        "it never gives it the batch)."
    ) in str(first.value)
    bronze = _fan(tmp_path).sinks["bronze"]
    table = DeltaTable(str(tmp_path / "bronze"))
    assert table.version() == 3  # the refused start fenced nothing: no fence, no lift
    table.restore(2)  # version 4: the batch's commit (3) taken out
    assert bronze.holds_batch(PIPELINE, 0, 3) is False
    DeltaTable(str(tmp_path / "bronze")).restore(3)  # version 5: given back
    assert bronze.holds_batch(PIPELINE, 0, 3) is True
    DeltaTable(str(tmp_path / "bronze")).restore(4)  # version 6: as version 4, without it
    assert bronze.holds_batch(PIPELINE, 0, 3) is False
    assert _ids(tmp_path) == list(range(30))

    _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-new", 0, 30)
    assert _ids(tmp_path) == list(range(40))
