"""A zombie query during a reset (ARCHITECTURE §5 "A query still running during a reset").

The operator replaces a checkpoint: ``fanout recover`` prints where the new checkpoint
must start, and a new query continues from there under ``on_checkpoint_reset="new_epoch"``.
The old query, not stopped, commits one more batch: the new epoch reads its input again.
Three windows, each with two FanOuts on one ledger (two drivers, as in production) and
two real Delta sinks, batches handed by ``FanOut.process`` with Kafka-style offsets:

1. the old query commits after the report and before the new epoch starts: the new epoch
   is refused, naming the batch, and nothing is written;
2. the old query's batch, admitted before the new epoch started, writes after it: the new
   epoch's start fenced the old epoch's app transactions of the Delta sinks, so the old
   query's writes are refused (before, they wrote the rows twice and only the mark failed,
   with ZombieBatchError);
3. the old query's next batch, once the new epoch exists: refused by its guard as an
   earlier epoch's owner.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fanout_delta.fence import EpochFencedError

from fanout import BatchInfo, FanOut, hookimpl
from fanout.errors import (
    BatchFailedError,
    CheckpointResetError,
    UnmarkedBatchError,
    ZombieBatchError,
)
from fanout.ledger.delta import DeltaLedger
from tests.in_process_cli import Cli
from tests.integration import two_sink_resets as resets
from tests.integration.two_sink_resets import NEW, OLD, ROWS, SINKS

PIPELINE = "zombie"
_fan = partial(resets.fan, PIPELINE)
_batch = partial(resets.batch, PIPELINE)
_run, _ids, _marks = resets.run, resets.ids, resets.marks


def _old_query_ran_three_batches_then_recover(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> FanOut:
    """The old query commits batches 0-2 (rows 0-29), then the operator runs recover."""
    old = _fan(tmp_path)
    for batch in range(3):
        _run(old, spark, OLD, batch, batch * ROWS)
    ran = fanout_cli("recover", "--ledger", tmp_path / "ledger", "--pipeline", "zombie")
    assert ran.returncode == 0, ran
    report = ran.stdout
    assert "Resume after batch 2: every sink the pipeline still writes holds it" in report
    assert """.option("startingOffsets", '{"orders": {"0": 30}}')""" in report
    return old


def test_a_batch_the_old_query_commits_after_the_report_refuses_the_new_epoch(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Window 1. Today the new epoch started and read rows 30-39 again: both sinks held
    them twice. Now the new epoch is refused before anything is written, naming the batch
    the old query committed since the report, and before the sinks are fenced (no commit
    in their tables); recover run again counts it."""
    old = _old_query_ran_three_batches_then_recover(spark, tmp_path, fanout_cli)
    _run(old, spark, OLD, 3, 30)  # the zombie: rows 30-39, after the report

    new = _fan(tmp_path, on_reset="new_epoch")
    with pytest.raises(ZombieBatchError) as refused:
        _run(new, spark, NEW, 0, 30)  # the new checkpoint, from the report's offsets
    message = str(refused.value)
    assert isinstance(refused.value, CheckpointResetError)
    assert re.fullmatch(
        r"pipeline 'zombie': query query-new cannot start epoch 1 from the `fanout recover` "
        r"report 1 \(epoch 0, recorded \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\): since that "
        r"report, epoch 0's query committed bronze: batch 3, silver: batch 3\..*",
        message,
        flags=re.S,
    )
    assert "Stop every query of this pipeline" in message
    assert f"fanout recover --ledger {tmp_path / 'ledger'} --pipeline zombie" in message
    for sink in SINKS:
        assert _ids(tmp_path, sink) == list(range(40))
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch("zombie") == 0
    from deltalake import DeltaTable

    # the ledger's refusal is read before the sinks are fenced: no fence, no lift commit
    # (before: version 5 in each, the refused start's fence and lift)
    assert [DeltaTable(str(tmp_path / sink)).version() for sink in SINKS] == [3, 3]

    # stopped, and recover run again: its report counts batch 3, the new epoch starts
    ran = fanout_cli("recover", "--ledger", tmp_path / "ledger", "--pipeline", "zombie")
    assert ran.returncode == 0, ran
    assert """.option("startingOffsets", '{"orders": {"0": 40}}')""" in ran.stdout
    _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 40)
    for sink in SINKS:
        assert _ids(tmp_path, sink) == list(range(50))
    assert _marks(tmp_path) == sorted(
        [(0, s, b) for s in SINKS for b in range(4)] + [(1, s, 0) for s in SINKS]
    )


class NewQueryStartsMeanwhile:
    """Runs the new query's first batch right before the old query's first sink writes its
    batch (``when="start"``), or right after it wrote, before its mark (``when="done"``):
    the new epoch starts, or tries to, while the old batch is in flight."""

    def __init__(self, run: Any, when: str = "start") -> None:
        self.run = run
        self.when = when
        self.done = False

    def _maybe_run(self, info: BatchInfo, when: str) -> None:
        if not self.done and info.batch_id == 3 and when == self.when:
            self.done = True
            self.run()

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        self._maybe_run(info, "start")

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        self._maybe_run(info, "done")


def test_a_batch_the_old_query_writes_after_the_new_epoch_started_is_refused(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Window 2. The old query was admitted batch 3 in epoch 0 before the new epoch
    started; it would write rows 30-39, which the new epoch's first batch writes too. At
    first the old query marked it without a word; then its mark (recorded: the sinks held
    the batch twice) failed the batch with ZombieBatchError. Now the new epoch's start
    fenced the old epoch's app transactions of both Delta sinks (§8.1), so the old query's
    writes are refused before they write (EpochFencedError), the rows are there once and
    the old query marks nothing."""
    old_fan = _old_query_ran_three_batches_then_recover(spark, tmp_path, fanout_cli)
    new = _fan(tmp_path, on_reset="new_epoch")
    meanwhile = NewQueryStartsMeanwhile(lambda: _run(new, spark, NEW, 0, 30))
    old = _fan(tmp_path, meanwhile)  # the same old query, observed
    del old_fan

    with pytest.raises(BatchFailedError) as failed:
        _run(old, spark, OLD, 3, 30)
    assert meanwhile.done
    assert set(failed.value.failures) == set(SINKS)
    for sink in SINKS:
        error = failed.value.failures[sink]
        assert isinstance(error, EpochFencedError)
        assert str(error).startswith(
            f"sink {sink!r}, batch 3: the Delta table {tmp_path / sink} closes this query's "
            f"app transaction 'fanout/zombie/{sink}' (epoch 0): a checkpoint reset started "
            "epoch 1 of the pipeline, which writes this batch again"
        )
        assert "sink.lift_epoch_fence('zombie', 1)" in str(error)
    for sink in SINKS:
        assert _ids(tmp_path, sink) == list(range(40))
    # the old query marked nothing of batch 3: the new epoch's batch 0 holds its rows
    assert _marks(tmp_path) == sorted(
        [(0, s, b) for s in SINKS for b in range(3)] + [(1, s, 0) for s in SINKS]
    )


def test_a_new_epoch_starting_after_the_old_batch_wrote_a_sink_is_refused(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Window 2, once a sink of the old batch wrote before the new epoch's start: that
    sink holds batch 3 by its own records (Delta's app transaction) without a mark, so the
    start is refused (UnmarkedBatchError) and records the mark; the old batch finishes, and
    nothing is written twice. Before, the new epoch started and both sinks held rows
    30-39 twice."""
    old_fan = _old_query_ran_three_batches_then_recover(spark, tmp_path, fanout_cli)
    new = _fan(tmp_path, on_reset="new_epoch")
    refusals: list[BaseException] = []

    def start_new() -> None:
        with pytest.raises(UnmarkedBatchError) as refused:
            _run(new, spark, NEW, 0, 30)
        refusals.append(refused.value)

    old = _fan(tmp_path, NewQueryStartsMeanwhile(start_new, when="done"))
    del old_fan
    _run(old, spark, OLD, 3, 30)
    assert len(refusals) == 1
    assert str(refusals[0]).startswith(
        "pipeline 'zombie': query query-new cannot start epoch 1: sink bronze holds batch 3 "
        "of epoch 0 by its own records, and the ledger had no mark of it"
    )
    for sink in SINKS:
        assert _ids(tmp_path, sink) == list(range(40))
    # the lost mark the refusal recorded, then bronze's own, which replaces it
    assert _marks(tmp_path) == sorted(
        [(0, s, b) for s in SINKS for b in range(4)] + [(0, "bronze", 3)]
    )
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    counted = sorted((e.sink, e.batch_id, e.rows) for e in ledger.committed_entries("zombie"))
    assert counted == [(s, b, ROWS) for s in SINKS for b in range(4)]
    assert ledger.current_epoch("zombie") == 0


def test_the_old_query_s_next_batch_after_the_new_epoch_is_refused(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Window 3. Once the new epoch exists, the old query's next batch is refused at its
    guard's one lookup (the epoch changed: its owners are read again), as an earlier
    epoch's owner; nothing of it is written."""
    old = _old_query_ran_three_batches_then_recover(spark, tmp_path, fanout_cli)
    _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    with pytest.raises(CheckpointResetError) as refused:
        _run(old, spark, OLD, 3, 30)
    assert str(refused.value).startswith(
        "pipeline 'zombie': old checkpoint restored. Spark handed batch 3 of query "
        "query-old, whose batches are epoch 0 of this pipeline, but the pipeline continues "
        "under epoch 1 (query query-new)"
    )
    for sink in SINKS:
        assert _ids(tmp_path, sink) == list(range(40))


def test_a_refused_query_started_again_after_the_old_batch_marked_its_lost_mark_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    """Window 2 without a `fanout recover` report: the new query's start is refused while
    the old batch 3 is in flight (bronze wrote it, its lost mark recorded), then the old
    batch finishes: bronze's own mark replaces the lost mark, silver writes and marks it.
    The new query, started again, still re-reads batch 3's input (its checkpoint starts
    there). The refused query's check found no lost mark of its refusal any more (the
    replaced one is left out of the committed rows) and started epoch 1: rows 30-39 twice
    in both sinks."""
    old = _fan(tmp_path)
    for batch in range(3):
        _run(old, spark, OLD, batch, batch * ROWS)
    new = _fan(tmp_path, on_reset="new_epoch")
    refusals: list[BaseException] = []

    def start_new() -> None:
        with pytest.raises(UnmarkedBatchError) as refused:
            _run(new, spark, NEW, 0, 30)
        refusals.append(refused.value)

    old = _fan(tmp_path, NewQueryStartsMeanwhile(start_new, when="done"))
    _run(old, spark, OLD, 3, 30)
    assert len(refusals) == 1
    with pytest.raises(UnmarkedBatchError) as again:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    assert str(again.value).startswith(
        "pipeline 'zombie': query query-new cannot start epoch 1: it was refused before "
        "because sink bronze held batch 3 of epoch 0 unmarked, so its checkpoint starts "
        "before that batch, and sink silver wrote and marked batch 3: started again, this "
        "query would write batch 3's rows a second time there. Nothing was written under "
        "epoch 1."
    )
    for sink in SINKS:
        assert _ids(tmp_path, sink) == list(range(40))
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch("zombie") == 0
