"""``fanout ledger skip --through N`` when no other sink marked batch N, only a failed
attempt's row shows it ran (``fanout.ledger.gaps.skip_batches``): N itself is accepted
for the sink the replay check refused N to (a ``SinkRecordsGoneError`` row of that sink:
its target may hold N, and the skip is the refusal's way on), never on a gap refusal's row
of N (that refusal's skip ends at N-1: one through N would mark a batch the sink never
got), nor for another sink. Real Delta ledgers, the CLI, the rows recorded by real
refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fanout import FanOut, MissedBatchesError, SinkRecordsGoneError
from fanout.app.cli import main
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc
from fanout.ledger.memory import MemoryLedger
from tests.newest_lines import readout
from tests.unit.fakes import FakeFrame, ScriptedSink
from tests.unit.test_missed_batches import _run
from tests.unit.test_replay import Unsure, _info


def _skip(path: Path, pipeline: str, sink: str, through: int) -> list[str]:
    return ["ledger", "skip", "--ledger", str(path), "--pipeline", pipeline, "--sink", sink,
            "--through", str(through), "--epoch", "0"]  # fmt: skip


def test_a_gap_refusals_row_takes_a_skip_through_the_batch_before_it_not_the_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ledger restored from a copy taken after batch 1 while Spark ran on to batch 3:
    batch 4 is refused to "good" (it missed 2-3), a failed row of batch 4 recorded. A skip
    through 4 would mark batch 4 written to "good", which never got it (and its replay
    would then skip it there): refused, nothing recorded. Through 3, the refusal's own way
    on: recorded."""
    path, copy = tmp_path / "ledger", tmp_path / "copy"
    _run(FanOut("gap", DeltaLedger(str(path)), [ScriptedSink("good")]), range(2))
    shutil.copytree(path, copy)
    _run(FanOut("gap", DeltaLedger(str(path)), [ScriptedSink("good")]), range(2, 4))
    shutil.rmtree(path)
    shutil.copytree(copy, path)
    with pytest.raises(MissedBatchesError):
        _run(FanOut("gap", DeltaLedger(str(path)), [ScriptedSink("good")]), range(4, 5))
    assert DeltaLedger(str(path)).failed_batches("gap", 0, 0) == [4]

    assert main(_skip(path, "gap", "good", 4)) == 2
    err = readout(capsys).err
    assert (
        "pipeline 'gap', sink 'good': no other sink of the pipeline committed batch 4 of epoch "
        "0 or a later one, no failed attempt names a later batch, and batch 4 was not refused "
        "to this sink as a replay it cannot tell it holds"
    ) in err, err
    assert DeltaLedger(str(path)).last_committed("gap", ["good"]) == {"good": 1}

    assert main(_skip(path, "gap", "good", 3)) == 0, readout(capsys).err
    assert DeltaLedger(str(path)).last_committed("gap", ["good"]) == {"good": 3}


def test_the_replay_checks_refusal_takes_a_skip_of_the_batch_for_the_refused_sink_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Batch 1 replayed, refused to "k" (its records gone, it cannot tell whether its target
    holds the batch): the refusal's way on, when the target holds it, is the skip through 1
    for "k": recorded. "other" was refused nothing: its skip through 1 is refused."""
    path = tmp_path / "ledger"
    ledger = DeltaLedger(str(path))
    ledger.open()
    for sink in ("k", "other"):
        ledger.mark_committed(LedgerEntry("p", sink, 0, "committed", rows=3, finished_at=now_utc()))
    fan = FanOut("p", ledger, [Unsure("k"), ScriptedSink("other")], retries=0, backoff_s=0)
    with pytest.raises(SinkRecordsGoneError) as refused:
        fan.process(FakeFrame(), _info(1, 1_000))
    fan.close()
    assert f"fanout ledger skip --ledger {path} --pipeline p --sink k --through 1" in str(
        refused.value
    )

    assert main(_skip(path, "p", "other", 1)) == 2
    assert "batch 1 was not refused to this sink as a replay" in readout(capsys).err
    assert main(_skip(path, "p", "k", 1)) == 0, readout(capsys).err
    assert DeltaLedger(str(path)).last_committed("p", ["k", "other"]) == {"k": 1, "other": 0}


@pytest.mark.parametrize("delta", [False, True], ids=["memory", "delta"])
def test_failed_batches_of_one_sink_and_error_type(tmp_path: Path, delta: bool) -> None:
    ledger: Ledger = MemoryLedger()
    if delta:
        ledger = DeltaLedger(str(tmp_path / "ledger"))
        ledger.open()
    rows = [("k", 1, "SinkRecordsGoneError: gone"), ("k", 2, "SinkWriteError: down"),
            ("j", 3, "SinkRecordsGoneError: gone"), ("k", 4, None)]  # fmt: skip
    for sink, batch, error in rows:
        ledger.record_failure(
            LedgerEntry("p", sink, batch, "failed", error=error, finished_at=now_utc())
        )
    gone = "SinkRecordsGoneError:"
    assert ledger.failed_batches("p", 0, 0) == [1, 2, 3, 4]
    assert ledger.failed_batches("p", 0, 0, sink="k") == [1, 2, 4]
    assert ledger.failed_batches("p", 0, 0, sink="k", error=gone) == [1]
    assert ledger.failed_batches("p", 2, 0, error=gone) == [3]
    assert ledger.failed_batches("p", 0, 1, sink="k", error=gone) == []
