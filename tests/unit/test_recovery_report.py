"""``fanout recover`` records its report in the ledger; the next epoch starts from it and
is refused when the old epoch's query committed past it meanwhile, also when that commit
lands between the start's check and its commit (ARCHITECTURE §5, "A query still running
during a reset"). Real Delta ledgers, one per driver, no Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout.app.cli import main
from fanout.app.recover import NO_CONFIG, NO_SPOOL
from fanout.errors import ZombieBatchError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.recovery import RecoveryReport

OLD, NEW = "q-old", "q-new"


def _mark(ledger: DeltaLedger, sink: str, batch: int, epoch: int = 0, query: str = OLD) -> bool:
    return ledger.mark_committed(
        LedgerEntry(
            "p",
            sink,
            batch,
            "committed",
            query_id=query,
            epoch=epoch,
            source_offsets=json.dumps([{"t": {"0": 10 * (batch + 1)}}]),
        )
    )


def _epoch_row(epoch: int, query: str) -> LedgerEntry:
    return LedgerEntry("p", "*", 0, "epoch", query_id=query, epoch=epoch)


@pytest.fixture
def old(tmp_path: Path) -> DeltaLedger:
    """The old query's ledger: epoch 0 claimed by q-old, a and b marked 0-2, b also 3."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    ledger.start_epoch(_epoch_row(0, OLD))
    for batch in range(3):
        _mark(ledger, "a", batch)
        _mark(ledger, "b", batch)
    _mark(ledger, "b", 3)
    return ledger


def _recover(old: DeltaLedger, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert main(["recover", "--ledger", old.path, "--pipeline", "p"]) == 0
    return capsys.readouterr().out.splitlines()


def test_recover_records_each_report_numbered(
    old: DeltaLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _recover(old, capsys)
    assert out[-1] == (
        "Recorded in the ledger as report 1: the next epoch (`fanout run PIPELINE.toml "
        "--new-epoch` for a pipeline file, FanOut(..., "
        'on_checkpoint_reset="new_epoch") in code) starts from it, and is refused '
        "if a batch of epoch 0 after it is committed first (then run this again)."
    )
    assert _recover(old, capsys)[-1].startswith("Recorded in the ledger as report 2: ")
    rows = sorted(
        (r["attempt"], r["sink"], r["batch_id"], r["epoch"])
        for r in old.read("p").to_pylist()
        if r["status"] == "recovery"
    )
    # "*": where a new checkpoint resumes (after a's batch 2); each sink as counted
    assert rows == [(n, s, b, 0) for n in (1, 2) for s, b in (("*", 2), ("a", 2), ("b", 3))]
    report = old._epochs.report(old._table.fresh(), "p", 2)
    assert report == RecoveryReport("p", 2, 0, 2, {"a": 2, "b": 3})
    # status shows the sinks' progress only
    capsys.readouterr()
    assert main(["status", "--ledger", old.path, "--json"]) == 0
    assert sorted(s["sink"] for s in json.loads(capsys.readouterr().out)) == ["a", "b"]


def test_a_batch_committed_after_the_report_refuses_the_new_epoch(
    old: DeltaLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    _recover(old, capsys)
    _mark(old, "a", 3)  # the report counted a at 2: the new epoch writes a's 3 again
    _mark(old, "b", 4)
    _mark(old, "c", 4)  # a sink the report did not count
    new = DeltaLedger(old.path)
    with pytest.raises(ZombieBatchError) as refused:
        new.start_epoch(_epoch_row(1, NEW))
    [recorded] = [
        r["started_at"]
        for r in old.read("p").to_pylist()
        if r["status"] == "recovery" and r["sink"] == "*"
    ]
    assert str(refused.value).startswith(
        "pipeline 'p': query q-new cannot start epoch 1 from the `fanout recover` report 1 "
        f"(epoch 0, recorded {recorded:%Y-%m-%d %H:%M:%S} UTC): since that report, epoch 0's "
        "query committed a: batch 3, b: batch 4, c: batch 4. "
        "A checkpoint started where the report said (after batch 2) reads their input again "
    )
    assert new.current_epoch("p") == 0
    _recover(old, capsys)  # report 2 counts them: the epoch starts
    new.start_epoch(_epoch_row(1, NEW))
    assert new.current_epoch("p") == 1


def test_recover_no_record_prints_only_and_arms_no_check(
    old: DeltaLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    """A look at a healthy pipeline: nothing recorded, so the pipeline running on past the
    report does not refuse a later reset."""
    from fanout.app.recover import NOT_RECORDED, STOP_FIRST_UNRECORDED

    capsys.readouterr()
    command = ["recover", "--ledger", old.path, "--pipeline", "p", "--no-record"]
    assert main(command) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-4:] == [STOP_FIRST_UNRECORDED, NO_SPOOL, NO_CONFIG, NOT_RECORDED]
    assert NOT_RECORDED == (
        "Not recorded in the ledger (--no-record): a new epoch started from these offsets "
        "is not checked for a batch a query still running commits after this report; "
        "before a reset, stop every query and run this again without --no-record."
    )
    assert [r for r in old.read("p").to_pylist() if r["status"] == "recovery"] == []
    _mark(old, "a", 3)  # the pipeline goes on
    _mark(old, "b", 4)
    new = DeltaLedger(old.path)
    new.start_epoch(_epoch_row(1, NEW))
    assert new.current_epoch("p") == 1


class MarkedJustBefore(DeltaLedger):
    """A ledger whose epoch start commits right after the old query's mark of ``mark``:
    the mark lands between the start's check and its commit."""

    def __init__(self, path: str, old: DeltaLedger, mark: tuple[str, int]) -> None:
        super().__init__(path)
        self.old, self.mark = old, mark
        self.appends = 0
        append = self._table.append

        def after_the_mark(table: Any, entries: Any, txns: Any) -> None:
            self.appends += 1
            if self.appends == 1 and entries[0].status == "epoch":
                _mark(self.old, *self.mark)
            append(table, entries, txns)

        self._table.append = after_the_mark  # type: ignore[method-assign]


def test_a_mark_landing_between_the_check_and_the_start_refuses_it(
    old: DeltaLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    """The start's commit carries the old epoch's high-water transaction: delta-rs refuses
    it after the old query's mark, and the check, made again, finds the batch."""
    _recover(old, capsys)
    new = MarkedJustBefore(old.path, old, ("a", 3))
    with pytest.raises(ZombieBatchError) as refused:
        new.start_epoch(_epoch_row(1, NEW))
    assert "since that report, epoch 0's query committed a: batch 3." in str(refused.value)
    assert new.appends == 1  # refused by delta-rs, then by the check on the fresh snapshot
    assert new.current_epoch("p") == 0


def test_marks_of_the_old_epoch_after_the_start(
    old: DeltaLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    """After an epoch started from a report, a mark of the old epoch within the report
    (a lagging sink's spooled batch the catch-up writes) passes; one past it is recorded
    and fails once: made again (the catch-up's next try of a spooled batch), it passes."""
    _recover(old, capsys)
    DeltaLedger(old.path).start_epoch(_epoch_row(1, NEW))
    assert _mark(old, "b", 3) is False  # marked before the report: counted
    with pytest.raises(ZombieBatchError) as late:
        _mark(old, "a", 3)
    assert str(late.value).startswith(
        "pipeline 'p', sink a: query q-old committed batch 3 of epoch 0 after epoch 1 started "
        "(query q-new) from the `fanout recover` report 1, which counted the sink at batch 2:"
    )
    assert old.last_committed("p", ["a"]) == {"a": 3}  # recorded: the sink holds it
    assert _mark(old, "a", 3) is False  # already recorded, and reported: no stall
    # marks of the new epoch are not checked against the report
    assert _mark(old, "a", 0, epoch=1, query=NEW) is True


def test_an_epoch_started_without_a_report_of_the_epoch_before_checks_nothing(
    old: DeltaLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    """Today's behaviour: no report, or a report of an older epoch."""
    new = DeltaLedger(old.path)
    new.start_epoch(_epoch_row(1, NEW))
    assert _mark(old, "a", 3) is True  # no report: nothing to compare with
    _mark(new, "a", 0, epoch=1, query=NEW)
    _recover(old, capsys)  # report 1, of epoch 1
    DeltaLedger(old.path).start_epoch(_epoch_row(2, "q-third"))
    with pytest.raises(ZombieBatchError):
        _mark(new, "a", 1, epoch=1, query=NEW)  # epoch 2 started from the report
    DeltaLedger(old.path).start_epoch(_epoch_row(3, "q-fourth"))  # report 1 is of epoch 1
    assert old.current_epoch("p") == 3


def test_the_new_epochs_marks_read_no_more_of_the_log(
    old: DeltaLedger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common path: a mark of the pipeline's current epoch is checked against the
    epoch version the batch's lookup read; no transaction is read for it, report or not."""
    import fanout.ledger.delta_table as delta_ledger

    _recover(old, capsys)
    new = DeltaLedger(old.path)
    new.start_epoch(_epoch_row(1, NEW))
    assert new.lookup("p", ["a", "b"]).epoch == 1
    reads: list[str] = []
    real = delta_ledger.transaction_version
    monkeypatch.setattr(
        delta_ledger, "transaction_version", lambda t, app: reads.append(app) or real(t, app)
    )
    for batch in range(3):
        new.lookup("p", ["a", "b"])
        _mark(new, "a", batch, epoch=1, query=NEW)
        _mark(new, "b", batch, epoch=1, query=NEW)
    assert reads == []
