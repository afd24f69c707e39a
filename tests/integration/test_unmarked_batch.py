"""A batch a sink wrote but never marked, then a checkpoint reset (ARCHITECTURE §5, "A batch
written but never marked").

The old query's driver dies after sink ``bronze`` committed batch 3 to its Delta table and
before the ledger mark (``silver`` never got to it). The checkpoint is replaced; ``fanout
recover`` prints "resume after batch 2", and the new query starts from those offsets under
``on_checkpoint_reset="new_epoch"``. Without the check, the new epoch wrote batch 3's rows
(30-39) to ``bronze`` again under new transaction ids: they were in its table twice. Now the
start is refused before anything of epoch 1 is written, naming the sink, the batch, and the
Delta version holding the rows.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, hookimpl
from fanout.errors import CheckpointResetError, TargetLostError, UnmarkedBatchError
from fanout.ledger.delta import DeltaLedger
from tests.in_process_cli import Cli
from tests.integration import two_sink_resets as resets
from tests.integration.two_sink_resets import NEW, OLD, ROWS, SINKS

PIPELINE = "unmarked"
_fan = partial(resets.fan, PIPELINE)
_run, _ids, _marks = resets.run, resets.ids, resets.marks


class DriverKilled(BaseException):
    """The driver's death: not an error fanout handles, it ends the batch where it is."""


class KillAfterWrite:
    """Kills the driver right after ``bronze`` wrote batch 3, before its ledger mark (and
    before ``silver`` starts it)."""

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        if info.batch_id == 3 and sink == "silver":
            raise DriverKilled("killed before silver's write")

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 3 and sink == "bronze":
            raise DriverKilled("killed between the write and the mark")


def _recover(tmp_path: Path, fanout_cli: Cli) -> str:
    ran = fanout_cli("recover", "--ledger", tmp_path / "ledger", "--pipeline", "unmarked")
    assert ran.returncode == 0, ran
    return ran.stdout


def _killed_after_bronze_wrote_batch_3(spark: Any, tmp_path: Path, fanout_cli: Cli) -> None:
    """Batches 0-2 (rows 0-29) everywhere, batch 3 (rows 30-39) only in bronze, unmarked;
    recover says: resume after batch 2."""
    old = _fan(tmp_path, KillAfterWrite())
    for batch in range(3):
        _run(old, spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        _run(old, spark, OLD, 3, 30)
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert _ids(tmp_path, "silver") == list(range(30))
    assert """.option("startingOffsets", '{"orders": {"0": 30}}')""" in _recover(
        tmp_path, fanout_cli
    )


def test_a_batch_written_but_never_marked_refuses_the_new_epoch(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Today the new epoch started and bronze held rows 30-39 twice. Now the start is
    refused, naming the sink, the batch, the Delta version and the choices, and the lost
    mark is recorded (no commit of the refused start in either table); the operator
    removes bronze's copy (the restore the message names), runs recover again, and the new
    epoch writes batch 3's input once to each sink."""
    _killed_after_bronze_wrote_batch_3(spark, tmp_path, fanout_cli)
    ledger = tmp_path / "ledger"
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)  # recover's offsets
    assert isinstance(refused.value, CheckpointResetError)
    message = str(refused.value)
    assert message.startswith(
        "pipeline 'unmarked': query query-new cannot start epoch 1: sink bronze holds batch 3 "
        "of epoch 0 by its own records, and the ledger had no mark of it"
    )
    assert "Nothing was written under epoch 1; the ledger now records the lost mark" in message
    bronze = tmp_path / "bronze"
    assert (
        "- sink bronze: batch 3 of epoch 0, source offsets unknown (no sink marked it); sinks "
        f"without it: silver (mark 2). Its rows are version 3 of the Delta table at {bronze}, "
        "the table's last commit: to remove them, restore the table to version 2"
    ) in message
    from deltalake import DeltaTable

    # a refused start fences nothing: no fence, no lift commit (before: 5 and 4, the two
    # commits of the fence and its lift in each table)
    versions = [DeltaTable(str(tmp_path / sink)).version() for sink in ("bronze", "silver")]
    assert versions == [3, 2]
    recover = f"fanout recover --ledger {ledger} --pipeline unmarked"
    assert (
        f"  1. Resume after batch 2, where `{recover}` counts silver: bronze gets batch 3's "
        "rows a second time (unless its copy is removed first)."
    ) in message
    assert (
        f"  2. Or give batch 3 up for silver: `fanout ledger skip --ledger {ledger} --pipeline "
        "unmarked --sink silver --through 3 --epoch 0`, then resume after batch 3: they never "
        "get its rows."
    ) in message
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert _ids(tmp_path, "silver") == list(range(30))
    assert DeltaLedger(str(ledger)).current_epoch("unmarked") == 0
    assert _marks(tmp_path) == sorted(
        [(0, s, b) for s in SINKS for b in range(3)] + [(0, "bronze", 3)]
    )

    # choice 1, with bronze's copy removed as the message says
    DeltaTable(str(bronze)).restore(2)
    assert """.option("startingOffsets", '{"orders": {"0": 30}}')""" in _recover(
        tmp_path, fanout_cli
    )
    _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    for sink in SINKS:
        assert _ids(tmp_path, sink) == list(range(40))
    assert DeltaLedger(str(ledger)).current_epoch("unmarked") == 1


def test_giving_the_unmarked_batch_up_for_the_other_sinks(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Choice 2 of the refusal: the skip it prints gives batch 3 up for silver, recover then
    resumes after batch 3, and the new epoch starts there: bronze holds rows 30-39 once,
    silver never gets them."""
    _killed_after_bronze_wrote_batch_3(spark, tmp_path, fanout_cli)
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    skip = str(refused.value).split("  2. Or give batch 3 up for silver: `")[1].split("`")[0]
    assert skip.startswith("fanout ledger skip ")
    assert fanout_cli(*skip.split()[1:]).returncode == 0
    report = _recover(tmp_path, fanout_cli)
    assert "Resume after batch 3" in report
    _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-newer", 0, 40)  # a new checkpoint
    assert _ids(tmp_path, "bronze") == list(range(50))
    assert _ids(tmp_path, "silver") == [*range(30), *range(40, 50)]
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch("unmarked") == 1


def test_a_dropped_table_after_the_unmarked_batch_refusal_is_still_a_lost_target(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The reset's lost-target check passes over bronze's lost mark 3 once its copy was
    removed (choice 1 above; before, that refused the reset with a TargetLostError about
    batch 3), but asks about its mark before it: bronze's table dropped instead of
    restored is refused, naming batch 2 of epoch 0, nothing of epoch 1 written."""
    import shutil

    _killed_after_bronze_wrote_batch_3(spark, tmp_path, fanout_cli)
    with pytest.raises(UnmarkedBatchError):
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    shutil.rmtree(tmp_path / "bronze")
    assert "Resume after batch 2" in _recover(tmp_path, fanout_cli)
    with pytest.raises(TargetLostError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    assert str(refused.value).startswith(
        f"sink 'bronze', batch 2: pipeline 'unmarked': path '{tmp_path / 'bronze'}' no longer "
        "holds batch 2 of epoch 0, which the ledger marks written there"
    )
    assert not (tmp_path / "bronze").exists()
    assert _ids(tmp_path, "silver") == list(range(30))


def test_the_copy_removed_after_the_batch_was_given_up_for_the_others_is_a_lost_target(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Choice 2 (batch 3 given up for silver, resume after batch 3), and bronze's copy
    removed all the same: the new epoch starts after batch 3, so bronze would never get
    rows 30-39 again. Its lost mark 3 is then asked about as a mark (not passed over as
    in choice 1): the reset is refused naming batch 3, nothing of epoch 1 written."""
    from deltalake import DeltaTable

    _killed_after_bronze_wrote_batch_3(spark, tmp_path, fanout_cli)
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    skip = str(refused.value).split("  2. Or give batch 3 up for silver: `")[1].split("`")[0]
    assert fanout_cli(*skip.split()[1:]).returncode == 0
    DeltaTable(str(tmp_path / "bronze")).restore(2)
    assert "Resume after batch 3" in _recover(tmp_path, fanout_cli)
    with pytest.raises(TargetLostError) as lost:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-newer", 0, 40)
    assert str(lost.value).startswith(
        f"sink 'bronze', batch 3: pipeline 'unmarked': path '{tmp_path / 'bronze'}' no longer "
        "holds batch 3 of epoch 0, which the ledger marks written there"
    )
    assert _ids(tmp_path, "bronze") == list(range(30))
    assert _ids(tmp_path, "silver") == list(range(30))


class KillInTheFirstBatch:
    """Kills the driver right after ``bronze`` wrote batch 0, the epoch's first, before
    its ledger mark (and before ``silver`` starts it): no sink has a mark of the epoch."""

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        if info.batch_id == 0 and sink == "silver":
            raise DriverKilled("killed before silver's write")

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 0 and sink == "bronze":
            raise DriverKilled("killed between the write and the mark")


def test_a_first_batch_written_but_never_marked_refuses_the_new_epoch(
    spark: Any, tmp_path: Path
) -> None:
    """The driver dies in epoch 0's first batch after bronze committed it: no sink has a
    mark, so none was asked, and the new epoch wrote rows 0-9 to bronze a second time.
    Now bronze is asked about the epoch's first batch (its claim's batch), the start is
    refused and bronze's lost mark of batch 0 recorded."""
    with pytest.raises(DriverKilled):
        _run(_fan(tmp_path, KillInTheFirstBatch()), spark, OLD, 0, 0)
    assert _ids(tmp_path, "bronze") == list(range(10))
    assert not (tmp_path / "silver" / "_delta_log").exists()
    assert _marks(tmp_path) == []
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 0)
    message = str(refused.value)
    assert message.startswith(
        "pipeline 'unmarked': query query-new cannot start epoch 1: sink bronze holds batch 0 "
        "of epoch 0 by its own records, and the ledger had no mark of it"
    )
    assert (
        "- sink bronze: batch 0 of epoch 0, source offsets unknown (no sink marked it); sinks "
        "without it: silver (no mark)."
    ) in message
    assert (
        "  1. Resume at epoch 0's start, before its first batch 0 (where it began: the "
        "query's starting offsets; "
        f"`fanout recover --ledger {tmp_path / 'ledger'} --pipeline unmarked --config "
        "PIPELINE.toml` says so, counting silver, which has no mark: without --config it does "
        "not see silver and says resume after batch 0, which is choice 2 without its skip): "
        "bronze gets batch 0's rows a second time (unless its copy is removed first)."
    ) in message
    assert (
        "  2. Or give batch 0 up for silver: `fanout ledger skip --ledger "
        f"{tmp_path / 'ledger'} --pipeline unmarked --sink silver --through 0 --epoch 0`"
    ) in message
    assert _ids(tmp_path, "bronze") == list(range(10))
    assert not (tmp_path / "silver" / "_delta_log").exists()
    assert _marks(tmp_path) == [(0, "bronze", 0)]
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch("unmarked") == 0


def _merging(tmp_path: Path, *plugins: object, on_reset: str = "refuse") -> Any:
    from fanout import FanOut

    sinks = [
        {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze"), "mode": "merge",
         "keys": ["id"]},
        {"type": "delta", "name": "silver", "path": str(tmp_path / "silver")},
    ]  # fmt: skip
    return FanOut(
        PIPELINE, str(tmp_path / "ledger"), sinks, plugins=plugins, parallelism=1, retries=0,
        on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_merge_batch_written_but_never_marked_lets_the_new_epoch_start(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """bronze merges by key without a dead-letter target: merging batch 3 again changes
    nothing. Before, the start was refused. Now, from recover's offsets (after batch 2),
    the new epoch starts; its first batch covers rows 30-44 with other names, bronze ends
    with each key's last row, silver gets every row once, and bronze's lost mark is
    recorded."""
    from tests.integration.streams import delta_rows

    old = _merging(tmp_path, KillAfterWrite())
    for batch in range(3):
        _run(old, spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        _run(old, spark, OLD, 3, 30)
    assert """.option("startingOffsets", '{"orders": {"0": 30}}')""" in _recover(
        tmp_path, fanout_cli
    )
    new = _merging(tmp_path, on_reset="new_epoch")
    rows = [(n, f"again-{n}") for n in range(30, 45)]
    info = BatchInfo(PIPELINE, 0, NEW, [{"orders": {"0": 45}}], batch_timestamp_ms=2000)
    new.process(spark.createDataFrame(rows, "id LONG, name STRING"), info)
    assert sorted((r["id"], r["name"]) for r in delta_rows(tmp_path / "bronze")) == [
        *((n, f"order-{n}") for n in range(30)),
        *((n, f"again-{n}") for n in range(30, 45)),
    ]
    assert _ids(tmp_path, "silver") == list(range(45))
    assert _marks(tmp_path) == sorted(
        [(0, s, b) for s in SINKS for b in range(3)]
        + [(0, "bronze", 3), (1, "bronze", 0), (1, "silver", 0)]
    )
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch(PIPELINE) == 1


def _alone(tmp_path: Path, *plugins: object, on_reset: str = "refuse") -> Any:
    """The pipeline with ``bronze`` its only sink."""
    from fanout import FanOut

    return FanOut(
        PIPELINE,
        str(tmp_path / "ledger"),
        [{"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze")}],
        on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
        plugins=plugins,
        parallelism=1,
        retries=0,
    )


def test_a_single_sink_removes_its_copy_and_restarts_the_refused_query(
    spark: Any, tmp_path: Path
) -> None:
    """A pipeline of one sink, bronze: batch 3 (rows 30-39) written, unmarked, and the reset
    refused. Its way on, "remove bronze's copy as said above and start this query again",
    run as printed (the table restored to version 2, query-new restarted after batch 2):
    the new epoch writes rows 30-39 once. Before, no other sink's mark was below batch 3,
    so the reset's lost-target check counted the lost mark 3 as held and refused the
    restart with a TargetLostError about batch 3 of epoch 0."""
    from deltalake import DeltaTable

    old = _alone(tmp_path, KillAfterWrite())
    for batch in range(3):
        _run(old, spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        _run(old, spark, OLD, 3, 30)
    assert _ids(tmp_path, "bronze") == list(range(40))
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_alone(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    message = str(refused.value)
    assert "Or remove bronze's copy as said above and start this query again, not a new " in (
        message
    )
    assert "restore the table to version 2" in message
    DeltaTable(str(tmp_path / "bronze")).restore(2)
    _run(_alone(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch(PIPELINE) == 1


def test_a_removed_sinks_old_mark_does_not_pass_a_removed_copy(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Sink ``audit`` wrote batches 0-1 and was then removed from the pipeline (its last
    mark of epoch 0 is 1). Then choice 2 (batch 3 given up for silver, resume after batch
    3, a new checkpoint), and bronze's copy removed all the same: the new epoch never
    writes rows 30-39 to bronze again. Before, audit's old mark 1, below batch 3, passed
    bronze's lost mark 3 as a copy the new epoch writes again: the reset started, and
    bronze lost rows 30-39 silently. Now refused naming batch 3."""
    from deltalake import DeltaTable

    from fanout import FanOut

    three = FanOut(
        PIPELINE,
        str(tmp_path / "ledger"),
        [
            {"type": "delta", "name": s, "path": str(tmp_path / s)}
            for s in ("bronze", "silver", "audit")
        ],
        parallelism=1,
        retries=0,
    )
    for batch in range(2):
        _run(three, spark, OLD, batch, batch * ROWS)
    three.close()
    old = _fan(tmp_path, KillAfterWrite())
    _run(old, spark, OLD, 2, 20)
    with pytest.raises(DriverKilled):
        _run(old, spark, OLD, 3, 30)
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    skip = str(refused.value).split("  2. Or give batch 3 up for silver: `")[1].split("`")[0]
    assert fanout_cli(*skip.split()[1:]).returncode == 0
    DeltaTable(str(tmp_path / "bronze")).restore(2)
    with pytest.raises(TargetLostError) as lost:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-newer", 0, 40)
    assert str(lost.value).startswith(
        f"sink 'bronze', batch 3: pipeline 'unmarked': path '{tmp_path / 'bronze'}' no longer "
        "holds batch 3 of epoch 0, which the ledger marks written there"
    )
    assert _ids(tmp_path, "bronze") == list(range(30))
    assert _ids(tmp_path, "silver") == list(range(30))
    assert [m for m in _marks(tmp_path) if m[0] == 1] == []
