"""The ``fanout ledger skip`` a catch-up refusal prints for a batch of an *older* epoch
(a lagging sink's backlog left from before a checkpoint reset) names that epoch: the skip
defaults to the pipeline's current epoch, so a command without ``--epoch`` gives up the
sink's batch of the new epoch instead (its rows lost to the sink) and leaves the refused
batch refused. Real local Spark, a Delta ledger, two Delta sinks, a spool."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fanout import BatchInfo, FanOut
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import is_skip
from fanout.sink_spec import SinkSpec, lag_policy
from tests.in_process_cli import Cli
from tests.integration.streams import DownSink, delta_rows

if TYPE_CHECKING:
    from fanout import Batch, SinkResult


class _EpochDownSink(DownSink):
    """A :class:`DownSink` that also records each write's (epoch, batch, ids)."""

    def __init__(self, name: str, *, down: bool) -> None:
        super().__init__(name, down=down)
        self.written: list[tuple[int, int, list[int]]] = []

    def write(self, batch: Batch) -> SinkResult:
        """Write as a DownSink; record the write when it succeeds."""
        result = super().write(batch)
        ids = sorted(r["id"] for r in batch.arrow().to_pylist())
        self.written.append((batch.info.epoch, batch.batch_id, ids))
        return result


def _ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in delta_rows(path))


def _gap_fan_out(tmp_path: Path, down: _EpochDownSink) -> FanOut:
    """Pipeline ``gap``: a Delta sink ``lake`` and ``down`` (on_failure='lag'), a spool."""
    return FanOut(
        "gap", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"}))],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
        on_checkpoint_reset="new_epoch",
    )  # fmt: skip


def _frame(spark: Any, ids: list[int]) -> Any:
    return spark.createDataFrame([(i,) for i in ids], "id LONG")


def _lag_past_a_lost_batch(spark: Any, fan: FanOut, down: _EpochDownSink) -> None:
    """Epoch 0: ``down`` takes batch 0 (id 1), then lags on batches 1 (id 2) and 2 (id 3),
    and the spool loses batch 1 for it (its index row removed by hand)."""
    down.down = False
    fan.process(_frame(spark, [1]), BatchInfo("gap", 0, "q"))
    down.down = True
    fan.process(_frame(spark, [2]), BatchInfo("gap", 1, "q"))
    fan.process(_frame(spark, [3]), BatchInfo("gap", 2, "q"))
    assert fan.spool is not None
    assert [(b.key, sorted(b.needed_by)) for b in fan.spool.batches()] == [
        ((0, 1), ["down"]), ((0, 2), ["down"]),
    ]  # fmt: skip
    fan.spool.remove({(0, 1): ["down"]})


def _down_marks(ledger: str) -> list[tuple[int, int, bool]]:
    found = [e for e in DeltaLedger(ledger).committed_entries("gap") if e.sink == "down"]
    return sorted((e.epoch, e.batch_id, is_skip(e)) for e in found)


def test_the_skip_a_backfill_refusal_of_an_older_epoch_prints_gives_up_that_batch_only(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """``copy`` backfills from ``lake``; batch 0 of epoch 0 cannot be read back (a dead
    letter of it deleted by hand), so ``copy`` waits there across a checkpoint reset. The
    refusal's skip, run as printed, gives up exactly that batch: ``copy`` then gets epoch
    0's batch 1 and epoch 1's batch 0 from ``lake``, each row once."""
    from deltalake import DeltaTable

    ledger, dead, spool = str(tmp_path / "ledger"), str(tmp_path / "dead"), tmp_path / "spool"
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake"),
            "partition_by": ["k"], "dead_letter": dead}  # fmt: skip
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
            "backfill_from": "lake", "retries": 0}  # fmt: skip

    def frame(rows: list[tuple[int, str]]) -> Any:
        return spark.createDataFrame(rows, "id LONG, k STRING")

    def fan_out() -> FanOut:
        return FanOut(
            "old", ledger, [lake, copy], backoff_s=0, spool=str(spool),
            on_checkpoint_reset="new_epoch",
        )  # fmt: skip

    first = FanOut("old", ledger, [lake], backoff_s=0)
    try:
        first.process(frame([(1, "a"), (2, "")]), BatchInfo("old", 0, "q"))  # 2: set aside
    finally:
        first.close()
    DeltaTable(dead).delete("batch_id = 0")  # batch 0 can no longer be read back whole

    fan = fan_out()
    try:
        fan.process(frame([(3, "b")]), BatchInfo("old", 1, "q"))
        assert fan.catch_up(timeout_s=120)["copy"].state == "lagging"  # waits at (0, 0)
        # the checkpoint reset: a new query's batch 0 starts epoch 1
        fan.process(frame([(4, "c")]), BatchInfo("old", 0, "q-new"))
        lag = fan.catch_up(timeout_s=120)["copy"]
    finally:
        fan.close()
    assert lag.state == "lagging" and lag.error is not None
    assert "batch 0 (epoch 0)" in lag.error, lag.error
    printed = re.search(r"`(fanout ledger skip [^`]*)`", lag.error)
    assert printed is not None, lag.error
    assert _ids(tmp_path / "lake") == [1, 3, 4]
    assert not (tmp_path / "copy").exists()

    # the user runs the command exactly as printed, then restarts
    ran = fanout_cli(*printed.group(1).split()[1:])
    assert ran.returncode == 0, ran
    again = fan_out()
    try:
        lag = again.catch_up(timeout_s=120)["copy"]
    finally:
        again.close()
    assert (lag.state, lag.error) == ("live", None)
    assert _ids(tmp_path / "copy") == [3, 4]  # epoch 0's batch 1 and epoch 1's batch 0
    marks = [e for e in DeltaLedger(ledger).committed_entries("old") if e.sink == "copy"]
    assert sorted((e.epoch, e.batch_id, is_skip(e)) for e in marks) == [
        (0, 0, True), (0, 1, False), (1, 0, False),
    ]  # fmt: skip


def test_the_skip_a_gap_in_an_older_epochs_backlog_prints_gives_up_that_gap_only(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """``down`` lags (on_failure='lag') on batches 1 and 2 of epoch 0; the spool loses its
    batch 1 (its index row removed by hand); a checkpoint reset starts epoch 1. The
    catch-up refuses writing batch 2 past the gap (``MissedBatchesError``); its skip, run as
    printed, gives up batch 1 of epoch 0 only: ``down`` then gets batch 2 of epoch 0 and
    batch 0 of epoch 1, each once."""
    ledger = str(tmp_path / "ledger")
    down = _EpochDownSink("down", down=True)
    fan = _gap_fan_out(tmp_path, down)
    try:
        _lag_past_a_lost_batch(spark, fan, down)
        fan.process(_frame(spark, [4]), BatchInfo("gap", 0, "q-new"))  # the reset: epoch 1
        down.down = False
        lag = fan.catch_up(timeout_s=120)["down"]
    finally:
        fan.close()
    assert lag.state == "lagging" and lag.error is not None
    assert "MissedBatchesError" in lag.error and "never received batch(es) 1" in lag.error
    printed = re.search(r"`(fanout ledger skip [^`]*)`", lag.error)
    assert printed is not None, lag.error
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == [1, 2, 3, 4]

    ran = fanout_cli(*printed.group(1).split()[1:])
    assert ran.returncode == 0, ran
    again = _gap_fan_out(tmp_path, down)
    try:
        lag = again.catch_up(timeout_s=120)["down"]
    finally:
        again.close()
    assert (lag.state, lag.error) == ("live", None)
    # batches 0 and 2 of epoch 0, then batch 0 of epoch 1: each row once
    assert down.written == [(0, 0, [1]), (0, 2, [3]), (1, 0, [4])]
    assert _down_marks(ledger) == [
        (0, 0, False), (0, 1, True), (0, 2, False), (1, 0, False),
    ]  # fmt: skip


def test_a_skip_without_epoch_is_refused_while_the_sink_misses_an_older_epochs_batch(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """``down`` misses batch 1 of epoch 0 (its spool lost it) and lags on through a reset
    (epoch 1: batches 0-2 spooled for it). A skip typed without ``--epoch`` (an older
    runbook's, or the batch the refusal names) defaulted to epoch 1: it recorded epoch 1's
    batches 0-1 as skipped, rows ``down`` was still to get, and left epoch 0's gap. It is
    refused before anything is written, naming epoch 0 and the command with ``--epoch 0``,
    which then gives up that batch only; an explicit ``--epoch 1`` is taken as given."""
    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    down = _EpochDownSink("down", down=True)
    fan = _gap_fan_out(tmp_path, down)
    try:
        _lag_past_a_lost_batch(spark, fan, down)
        for batch_id, row in enumerate([4, 5, 6]):  # the reset: epoch 1
            fan.process(_frame(spark, [row]), BatchInfo("gap", batch_id, "q-new"))
        assert fan.spool is not None
        assert [(b.key, sorted(b.needed_by)) for b in fan.spool.batches()] == [
            ((0, 2), ["down"]), ((1, 0), ["down"]), ((1, 1), ["down"]), ((1, 2), ["down"]),
        ]  # fmt: skip
    finally:
        fan.close()
    assert _down_marks(ledger) == [(0, 0, False)]

    typed = ["ledger", "skip", "--ledger", ledger, "--pipeline", "gap", "--sink", "down"]
    for spooled in ([], ["--spool", spool]):
        refused = fanout_cli(*typed, "--through", "1", *spooled)
        assert refused.returncode == 2
        printed = (
            f"fanout ledger skip --ledger {ledger} --pipeline gap --sink down --through 1 "
            f"--epoch 0{' --spool ' + spool if spooled else ''}"
        )
        assert refused.stderr == (
            "fanout: configuration error: pipeline 'gap', sink 'down': the oldest batch it "
            "misses is batch 1 of epoch 0, before the pipeline's current epoch 1, the one a "
            "skip without an epoch acts in: this skip would record epoch 1's batches through "
            "1 as never written to it (it gets them after epoch 0's: their rows lost to it) "
            "and leave batch 1 of epoch 0 missing; nothing was recorded. To skip epoch 0's "
            f"batches, run `{printed}`; to skip epoch 1's anyway, the same with --epoch 1\n"
        )
        assert _down_marks(ledger) == [(0, 0, False)]

    # an explicit --epoch is taken as given (on a copy of the ledger)
    shutil.copytree(ledger, tmp_path / "copy")
    copy = str(tmp_path / "copy")
    taken = fanout_cli(*typed[:2], "--ledger", copy, *typed[4:], "--through", "1", "--epoch", "1")
    assert taken.returncode == 0, taken
    assert _down_marks(copy) == [(0, 0, False), (1, 1, True)]
    assert _down_marks(ledger) == [(0, 0, False)]

    ran = fanout_cli(*printed.split()[1:])
    assert ran.returncode == 0, ran
    assert _down_marks(ledger) == [(0, 0, False), (0, 1, True)]
    down.down = False
    again = _gap_fan_out(tmp_path, down)
    try:
        lag = again.catch_up(timeout_s=120)["down"]
    finally:
        again.close()
    assert (lag.state, lag.error) == ("live", None)
    assert down.written == [(0, 0, [1]), (0, 2, [3]), (1, 0, [4]), (1, 1, [5]), (1, 2, [6])]
    assert _down_marks(ledger) == [
        (0, 0, False), (0, 1, True), (0, 2, False), (1, 0, False), (1, 1, False), (1, 2, False),
    ]  # fmt: skip
