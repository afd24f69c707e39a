"""The ledger's rows of a batch refused before any write (``fanout.ledger.refusals``,
docs/architecture.md §4 "Refused batches"): what ``refused_unwritten`` answers, on the
memory ledger and on a real (delta-rs) Delta ledger, and that no reader of the ledger
counts the rows (status, recover, sink names, marks, failures, owners, compaction)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest

from fanout.app import activity
from fanout.app.cli import main
from fanout.app.status import summarize
from fanout.ledger.begun import BEGUN, began, record_begun
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import OWN_ROWS, Ledger, LedgerEntry, Status, now_utc
from fanout.ledger.memory import MemoryLedger
from fanout.ledger.recovery import RECOVERY
from fanout.ledger.refusals import (
    ADMITTED,
    NO_SINK,
    REFUSED,
    record_admitted,
    record_refused,
    refused_unwritten,
)
from fanout.ledger.target_records import DEAD_LETTER
from tests.newest_lines import readout

T, T2 = 1_796_227_392_924, 1_796_227_405_218  # two planning times of batch 7


def _delta(tmp_path: Path) -> Ledger:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    return ledger


def _memory(tmp_path: Path) -> Ledger:
    return MemoryLedger()


LEDGERS = pytest.mark.parametrize("make", [_memory, _delta], ids=["memory", "delta"])


@LEDGERS
def test_no_rows_is_no_refusal(make: Callable[[Path], Ledger], tmp_path: Path) -> None:
    ledger = make(tmp_path)
    assert refused_unwritten(ledger, "orders", 0, 7, T) is False


@LEDGERS
def test_a_refusal_answers_for_its_own_planning_time_only(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    ledger = make(tmp_path)
    record_refused(ledger, "orders", 0, 7, T)
    assert refused_unwritten(ledger, "orders", 0, 7, T) is True
    assert refused_unwritten(ledger, "orders", 0, 7, T2) is False  # re-planned: another batch
    assert refused_unwritten(ledger, "orders", 0, 7, None) is False  # unknown: no
    # another batch, epoch or pipeline has no refusal
    assert refused_unwritten(ledger, "orders", 0, 8, T) is False
    assert refused_unwritten(ledger, "orders", 1, 7, T) is False
    assert refused_unwritten(ledger, "other", 0, 7, T) is False


@LEDGERS
def test_an_admitted_replay_after_the_refusal_ends_it(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    ledger = make(tmp_path)
    record_refused(ledger, "orders", 0, 7, T)
    record_admitted(ledger, "orders", 0, 7, T)  # that replay may have written
    assert refused_unwritten(ledger, "orders", 0, 7, T) is False


@LEDGERS
def test_a_refusal_after_an_admitted_replay_counts_again(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    ledger = make(tmp_path)
    record_refused(ledger, "orders", 0, 7, T)
    record_admitted(ledger, "orders", 0, 7, T)
    record_refused(ledger, "orders", 0, 7, T2)  # the batch planned again, refused again
    assert refused_unwritten(ledger, "orders", 0, 7, T2) is True
    assert refused_unwritten(ledger, "orders", 0, 7, T) is False  # not the newest refusal
    record_refused(ledger, "orders", 0, 7, T)
    assert refused_unwritten(ledger, "orders", 0, 7, T) is True
    assert refused_unwritten(ledger, "orders", 0, 7, T2) is False


def _admitted_meanwhile(ledger: Ledger, batch: int) -> Callable[[], bool]:
    """A ``go_on`` for :func:`record_refused`, asked after its read of the rows and before
    its append: another attempt appends ``admitted`` meanwhile."""

    def go_on() -> bool:
        record_admitted(ledger, "orders", 0, batch, T)
        return True

    return go_on


@LEDGERS
def test_a_refused_row_landing_after_an_admitted_one_read_later_is_not_the_newest(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    """A slow ``refused`` append (a first attempt's, given up on) lands after a later
    attempt read the rows and appended ``admitted``: numbered from its own earlier read,
    it ties with the ``admitted`` row, which wins: the replay after is not exempt,
    whatever order they landed in. Also with rows before (batch 8)."""
    ledger = make(tmp_path)
    assert record_refused(ledger, "orders", 0, 7, T, go_on=_admitted_meanwhile(ledger, 7))
    rows = [(r.status, r.attempt) for r in ledger.refusal_rows("orders", 0, 7)]
    assert sorted(rows) == [(ADMITTED, 1), (REFUSED, 1)]
    assert refused_unwritten(ledger, "orders", 0, 7, T) is False
    record_refused(ledger, "orders", 0, 8, T)
    record_admitted(ledger, "orders", 0, 8, T)
    assert record_refused(ledger, "orders", 0, 8, T, go_on=_admitted_meanwhile(ledger, 8))
    rows = [(r.status, r.attempt) for r in ledger.refusal_rows("orders", 0, 8)]
    assert sorted(rows) == [(ADMITTED, 2), (ADMITTED, 3), (REFUSED, 1), (REFUSED, 3)]
    assert refused_unwritten(ledger, "orders", 0, 8, T) is False


@LEDGERS
def test_the_rows_are_numbered_per_batch_and_hold_nothing_but_the_batch(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    ledger = make(tmp_path)
    record_refused(ledger, "orders", 2, 7, T)
    record_admitted(ledger, "orders", 2, 7, T)
    record_refused(ledger, "orders", 2, 8, T2)
    rows = sorted(ledger.refusal_rows("orders", 2, 7), key=lambda e: e.attempt)
    assert [(e.status, e.attempt, e.sink, e.epoch, e.batch_id) for e in rows] == [
        (REFUSED, 1, NO_SINK, 2, 7),
        (ADMITTED, 2, NO_SINK, 2, 7),
    ]
    assert {e.batch_timestamp_ms for e in rows} == {T}
    assert all(
        (e.query_id, e.error, e.source_offsets, e.rows) == (None, None, None, None) for e in rows
    )
    assert [e.attempt for e in ledger.refusal_rows("orders", 2, 8)] == [1]


@LEDGERS
def test_a_tie_of_two_writers_disagreeing_is_no_refusal(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    """Two refusals numbered alike (two writers read the rows at once): unsure, ``False``
    unless both name the planning time."""
    ledger = make(tmp_path)
    for planned in (T, T2):
        ledger.record_refusal_row(
            LedgerEntry("orders", NO_SINK, 7, REFUSED, attempt=1, batch_timestamp_ms=planned)
        )
    assert refused_unwritten(ledger, "orders", 0, 7, T) is False
    assert refused_unwritten(ledger, "orders", 0, 7, T2) is False


@LEDGERS
def test_only_refused_and_admitted_rows_go_through_the_refusal_rows(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    ledger = make(tmp_path)
    with pytest.raises(ValueError, match="refused or admitted"):
        ledger.record_refusal_row(LedgerEntry("orders", "lake", 7, "failed"))


def test_the_new_statuses_are_statuses_and_the_ledgers_own_rows() -> None:
    assert set(get_args(Status)) == {"committed", "failed", *OWN_ROWS}
    assert {REFUSED, ADMITTED, RECOVERY, DEAD_LETTER, BEGUN, "epoch"} == set(OWN_ROWS)


# -- no reader counts them --------------------------------------------------------------


def _pipeline(ledger: Ledger) -> None:
    """Pipeline ``orders``: sinks bronze (batches 0-2) and latest (0-1, a failure at 2),
    epoch 0 claimed by query q1."""
    ledger.start_epoch(LedgerEntry("orders", NO_SINK, 0, "epoch", query_id="q1"))
    for batch in range(3):
        for sink in ("bronze", "latest")[: 2 if batch < 2 else 1]:
            offsets = json.dumps([{"logOffset": batch}])
            ledger.mark_committed(
                LedgerEntry(
                    "orders",
                    sink,
                    batch,
                    "committed",
                    query_id="q1",
                    rows=3,
                    source_offsets=offsets,
                    finished_at=now_utc(),
                    batch_timestamp_ms=T + batch,
                )
            )
    ledger.record_failure(
        LedgerEntry(
            "orders",
            "latest",
            2,
            "failed",
            query_id="q1",
            error="SinkWriteError: x",
            finished_at=now_utc(),
        )
    )


def _refusals(ledger: Ledger) -> None:
    """A refused batch 3, admitted; a refused batch 4; one of another epoch; and the
    catch-up's notes of backfill writes begun (:mod:`fanout.ledger.begun`): latest's batch
    2 (it failed there) and bronze's batch 3, rows of real sinks."""
    record_refused(ledger, "orders", 0, 3, T + 3)
    record_admitted(ledger, "orders", 0, 3, T + 3)
    record_refused(ledger, "orders", 0, 4, T + 4)
    record_begun(ledger, "orders", "latest", 0, 2)
    record_begun(ledger, "orders", "bronze", 0, 3)


def _readings(ledger: Ledger) -> dict[str, object]:
    """What the ledger's readers other than the commands answer."""
    return {
        "marks": ledger.last_committed("orders", ["bronze", "latest"]),
        "view": ledger.lookup("orders", ["bronze", "latest"]),
        "committed": sorted(ledger.committed_entries("orders"), key=lambda e: (e.sink, e.batch_id)),
        "failed": ledger.failed_batches("orders", 0, 0),
        "sinks": ledger.sink_names("orders"),
        "owners": ledger.epoch_owners("orders"),
        "start": ledger.epoch_start("orders", 0),
    }


@LEDGERS
def test_no_reader_of_the_ledger_counts_the_rows(
    make: Callable[[Path], Ledger], tmp_path: Path
) -> None:
    ledger = make(tmp_path)
    _pipeline(ledger)
    before = _readings(ledger)
    _refusals(ledger)
    assert _readings(ledger) == before
    assert before["sinks"] == ["bronze", "latest"]


def test_fanout_status_and_recover_print_the_same_with_the_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fanout status`` (table and JSON) and ``fanout recover`` on a Delta ledger: the
    same output before and after the rows (the newest mark's age at one clock); no sink
    ``*``."""
    now = now_utc()
    monkeypatch.setattr(activity, "clock", lambda: now)
    ledger = _delta(tmp_path)
    _pipeline(ledger)
    where = str(tmp_path / "ledger")
    commands = [
        ["status", "--ledger", where, "--pipeline", "orders", "--json"],
        ["status", "--ledger", where, "--wide"],
        ["recover", "--ledger", where, "--pipeline", "orders", "--no-record"],
    ]

    def outputs() -> list[tuple[int, str]]:
        found = []
        for command in commands:
            code = main(command)
            found.append((code, readout(capsys).out))
        return found

    before = outputs()
    _refusals(ledger)
    after = outputs()
    assert after == before
    assert [code for code, _ in after] == [0, 0, 0]
    status = json.loads(after[0][1])
    assert sorted(s["sink"] for s in status) == ["bronze", "latest"]
    assert NO_SINK not in after[1][1].split()


def test_status_summary_leaves_the_rows_out() -> None:
    """``summarize`` on rows as dicts, a pipeline with refusal rows only: no sink."""
    rows = [
        {"pipeline": "fresh", "sink": NO_SINK, "batch_id": 0, "status": REFUSED, "epoch": 0,
         "attempt": 1, "rows": None, "finished_at": now_utc(), "error": None},
        {"pipeline": "fresh", "sink": NO_SINK, "batch_id": 0, "status": ADMITTED, "epoch": 0,
         "attempt": 2, "rows": None, "finished_at": now_utc(), "error": None},
    ]  # fmt: skip
    assert summarize(rows) == []


def test_the_ledgers_compaction_keeps_the_rows_and_their_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kept on purpose: a refusal must outlive ``fanout ledger maintain`` (a pipeline
    stopped for days is compacted meanwhile), and the rows are few."""
    ledger = _delta(tmp_path)
    _pipeline(ledger)
    _refusals(ledger)
    before = _readings(ledger)
    where = str(tmp_path / "ledger")
    assert main(["ledger", "maintain", "--ledger", where, "--retention-hours", "0"]) == 0
    assert "compacted" in readout(capsys).out
    again = DeltaLedger(where)
    assert _readings(again) == before
    assert [(e.status, e.attempt) for e in sorted(again.refusal_rows("orders", 0, 3),
                                                  key=lambda e: e.attempt)] == [
        (REFUSED, 1), (ADMITTED, 2)]  # fmt: skip
    assert refused_unwritten(again, "orders", 0, 4, T + 4) is True
    assert refused_unwritten(again, "orders", 0, 3, T + 3) is False
    assert began(again, "orders", "bronze", 0, 3) and began(again, "orders", "latest", 0, 2)


def test_a_ledger_without_the_rows_answers_no_refusal(tmp_path: Path) -> None:
    """A ledger written before the rows existed (an older fanout's): nothing to read,
    ``False``; the first refusal appends to it."""
    ledger = _delta(tmp_path)
    _pipeline(ledger)
    assert refused_unwritten(ledger, "orders", 0, 3, T + 3) is False
    record_refused(ledger, "orders", 0, 3, T + 3)
    assert refused_unwritten(ledger, "orders", 0, 3, T + 3) is True
