"""The catch-up's note before it writes a backfilled batch (fanout.steps.catchup_notes
``ReplayNotes._note_backfill``, :mod:`fanout.ledger.begun`): such a batch is in no spool,
so the note is a ``begun`` ledger row; a process killed in that write leaves the next run
no replay of Spark's to go by, and the note makes that run's catch-up ask the sink
(:meth:`fanout.steps.replay_lag.SpooledReplays.backfill_refusal`) before writing the batch
again; the run that wrote the note retries on without asking. Readers of marks and
``fanout status`` ignore the rows. Fake sinks, memory and Delta ledgers. The real Spark
and Delta path, a driver SIGKILLed in its backfill write:
plugins/fanout-delta/tests/test_catchup_killed.py."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, SinkRecordsGoneError, SinkWriteError
from fanout.app.status import summarize
from fanout.ledger.begun import began, record_begun
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger, LedgerEntry
from fanout.ledger.gaps import skip_batches
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import BackfillLake, SchemaFrame, ScriptedSink
from tests.unit.test_replay import Unsure

FRAMES = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(3)}


def _lake(ledger: MemoryLedger, rows: int = 2) -> BackfillLake:
    """The lake alone commits batches 0-2 (``rows`` rows each)."""
    lake = BackfillLake("lake")
    fan = FanOut("grow", ledger, [lake], retries=0, backoff_s=0)
    try:
        for batch in range(3):
            frame = FRAMES[batch] if rows else SchemaFrame([])
            fan.process(frame, BatchInfo("grow", batch, "q"))
    finally:
        fan.close()
    return lake


def _fan(tmp_path: Path, ledger: MemoryLedger, lake: BackfillLake, pg: ScriptedSink,
         **kw: Any) -> FanOut:  # fmt: skip
    """``pg`` added with ``backfill_from="lake"``; the catch-up driven by the test, reading
    the lake's batches from memory."""
    spec = SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], retries=0, backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600, **kw)  # fmt: skip
    fan.catchup.stop()
    fan.catchup._reader.read = lambda sink, key: (  # type: ignore[method-assign]
        SchemaFrame(lake.table[key].column("id").to_pylist()),
        BatchInfo("grow", key[1], "q", epoch=key[0]),
    )
    return fan


def _begun(ledger: MemoryLedger) -> list[tuple[str, int]]:
    return sorted((e.sink, e.batch_id) for e in ledger.entries if e.status == "begun")


def _killed_in_batch_1(tmp_path: Path, ledger: MemoryLedger, lake: BackfillLake) -> Unsure:
    """pg backfills batch 0, then its write of batch 1 fails (a kill: the same note)."""
    pg = Unsure("pg")
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        assert fan.catchup.drain("pg", until=lambda: fan.lagging.mark("pg", 0) == 0) is None
        pg.always_fail = SinkWriteError("down", sink="pg")
        assert isinstance(fan.catchup.drain("pg", until=lambda: False), SinkWriteError)
    finally:
        fan.close()
    assert pg.calls == [(0, 1), (1, 1)]
    assert _begun(ledger) == [("pg", 0), ("pg", 1)]
    return pg


def test_a_backfilled_batch_is_noted_before_its_write_and_retried_unasked(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    lake = _lake(ledger)
    pg = Unsure("pg", always_fail=SinkWriteError("down", sink="pg"))
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        assert isinstance(fan.catchup.drain("pg", until=lambda: False), SinkWriteError)
        assert _begun(ledger) == [("pg", 0)]  # noted before the write began
        assert fan.spool is not None and fan.spool.batches() == []  # nothing spooled
        pg.always_fail = None
        assert fan.catchup.drain("pg", until=lambda: False) is None
        assert pg.calls == [(0, 1), (0, 1), (1, 1), (2, 1)]  # batch 0 retried unasked
        assert pg.asked == []
        assert _begun(ledger) == [("pg", 0), ("pg", 1), ("pg", 2)]  # one note each
    finally:
        fan.close()
    assert ledger.last_committed("grow", ["pg", "lake"], 0) == {"pg": 2, "lake": 2}


def test_the_next_run_asks_before_writing_a_backfilled_batch_an_earlier_catch_up_began(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    lake = _lake(ledger)
    pg = _killed_in_batch_1(tmp_path, ledger, lake)
    pg.always_fail = None
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        refused = fan.catchup.drain("pg", until=lambda: False)
        assert isinstance(refused, SinkRecordsGoneError)
        assert (refused.sink, refused.batch_id) == ("pg", 1)
        text = str(refused)
        assert text.startswith(
            "sink 'pg', batch 1: pipeline 'grow', sink 'pg': batch 1 of epoch 0, backfilled "
            "from sink 'lake', was begun by an earlier run's catch-up (an attempt that may "
            "have written it to path '/data/pg' died before the sink's ledger mark: the "
            "catch-up's process ended in it), and the sink cannot tell whether its target "
            "holds it, its own records of the epoch being gone: no marker of epoch 0 is "
            "left (password ***). Read back from 'lake' again, it could be there twice."
        ), text
        assert (
            "record the batch as done for the sink: `fanout ledger skip --ledger "
            f"MemoryLedger@{id(ledger):x} --pipeline grow --sink pg --through 1 --epoch 0`, "
            "then start again (the backfill goes on with the batch after it). If it does "
            "not, accept it for the next run: `fanout run PIPELINE.toml --accept-lost-target "
            "pg` (FanOut(accept_lost_targets=['pg'])), whose catch-up writes batch 1 to it."
        ) in text
        assert "s3cr3t" not in text
        assert pg.calls == [(0, 1), (1, 1)]  # not written again
        assert pg.asked == [("holds", 0, 1), ("gone", 0, 0)]  # about batch 1, its mark 0
        assert _begun(ledger) == [("pg", 0), ("pg", 1)]  # no second note
        assert fan.catchup.drain("pg", until=lambda: False) is refused  # lags with it
    finally:
        fan.close()
    assert ledger.failed_batches("grow", 0, 0, sink="pg") == [1]

    skip_batches(ledger, "grow", "pg", 1, 0)  # the printed way on
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        assert fan.catchup.drain("pg", until=lambda: False) is None
    finally:
        fan.close()
    assert pg.calls == [(0, 1), (1, 1), (2, 1)]  # the backfill goes on with batch 2
    assert ledger.last_committed("grow", ["pg"], 0) == {"pg": 2}


def test_an_accepted_sink_is_written_the_batch_an_earlier_catch_up_began(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = MemoryLedger()
    lake = _lake(ledger)
    pg = _killed_in_batch_1(tmp_path, ledger, lake)
    pg.always_fail = None
    fan = _fan(tmp_path, ledger, lake, pg, accept_lost_targets=["pg"])
    try:
        with caplog.at_level(logging.WARNING, logger="fanout"):
            assert fan.catchup.drain("pg", until=lambda: False) is None
    finally:
        fan.close()
    assert pg.calls == [(0, 1), (1, 1), (1, 1), (2, 1)]  # written again, as accepted
    assert "batch 1 of epoch 0, backfilled from sink 'lake' and begun by an earlier run's" in (
        caplog.text
    )
    assert _begun(ledger) == [("pg", 0), ("pg", 1), ("pg", 2)]


@pytest.mark.parametrize(
    ("pg", "rows"), [(ScriptedSink("pg"), 2), (Unsure("pg"), 0)], ids=["no-records-gone", "empty"]
)
def test_no_note_where_no_question_could_refuse(
    tmp_path: Path, pg: ScriptedSink, rows: int
) -> None:
    """A sink that cannot answer ``records_gone`` is never refused; a batch its source's
    mark says wrote no row neither: no ledger row for them."""
    ledger = MemoryLedger()
    lake = _lake(ledger, rows)
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        assert fan.catchup.drain("pg", until=lambda: False) is None
    finally:
        fan.close()
    assert pg.calls == [(0, 1), (1, 1), (2, 1)]
    assert _begun(ledger) == []


def test_a_note_that_cannot_be_written_fails_the_write_before_it_begins(
    tmp_path: Path, monkeypatch: Any
) -> None:
    ledger = MemoryLedger()
    lake = _lake(ledger)
    pg = Unsure("pg")
    fan = _fan(tmp_path, ledger, lake, pg)

    def broken(entry: LedgerEntry) -> None:
        raise OSError("the ledger cannot be written")

    monkeypatch.setattr(ledger, "record_begun", broken)
    try:
        error = fan.catchup.drain("pg", until=lambda: False)
        assert isinstance(error, OSError) and str(error) == "the ledger cannot be written"
        assert pg.calls == []
        assert fan.lagging.lags()["pg"].batches == 3
    finally:
        fan.close()


@pytest.mark.parametrize("kind", ["memory", "delta"])
def test_begun_rows_are_read_by_batch_sink_and_epoch_and_counted_by_no_reader(
    tmp_path: Path, kind: str
) -> None:
    ledger: Ledger
    if kind == "delta":
        ledger = DeltaLedger(str(tmp_path / "ledger"))
        ledger.open()
    else:
        ledger = MemoryLedger()
    ledger.mark_committed(LedgerEntry("grow", "lake", 0, "committed", rows=2))
    record_begun(ledger, "grow", "pg", 0, 1)
    assert began(ledger, "grow", "pg", 0, 1) is True
    assert [began(ledger, *a) for a in [("grow", "pg", 1, 1), ("grow", "pg", 0, 0),
                                        ("grow", "lake", 0, 1), ("other", "pg", 0, 1)]] == [
        False, False, False, False,
    ]  # fmt: skip
    assert ledger.sink_names("grow") == ["lake"]
    assert ledger.last_committed("grow", ["pg", "lake"], 0) == {"pg": None, "lake": 0}
    assert ledger.failed_batches("grow", 0, 0) == []
    with pytest.raises(ValueError, match="record_begun takes a begun entry"):
        ledger.record_begun(LedgerEntry("grow", "pg", 1, "failed"))
    if isinstance(ledger, DeltaLedger):
        again = DeltaLedger(str(tmp_path / "ledger"))
        assert began(again, "grow", "pg", 0, 1) is True  # durable, read by another instance
        rows = ledger.rows("grow")
        assert sorted(r["status"] for r in rows) == ["begun", "committed"]
        without = [r for r in rows if r["status"] != "begun"]
        assert summarize(rows) == summarize(without)  # fanout status: not a sink's progress


def test_the_first_backfilled_batch_of_an_epoch_noted_is_asked_too(tmp_path: Path) -> None:
    """The catch-up noted batch 0, the sink's first of the epoch, and its write failed (as
    a kill would leave it: no mark). The sink has no mark of the epoch that wrote rows, whose
    records could tell; the note says a write may have begun: the next run asks
    ``records_gone`` about the batch itself and refuses it, nothing written again."""
    ledger = MemoryLedger()
    lake = _lake(ledger)
    pg = Unsure("pg", always_fail=SinkWriteError("down", sink="pg"))
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        assert isinstance(fan.catchup.drain("pg", until=lambda: False), SinkWriteError)
    finally:
        fan.close()
    assert _begun(ledger) == [("pg", 0)]
    written = list(pg.calls)
    pg.always_fail = None
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        refused = fan.catchup.drain("pg", until=lambda: False)
    finally:
        fan.close()
    assert isinstance(refused, SinkRecordsGoneError), refused
    assert refused.batch_id == 0
    assert pg.calls == written  # batch 0 not written again, nor any after it
    assert ("gone", 0, 0) in pg.asked


def test_a_source_mark_of_unknown_rows_is_noted(tmp_path: Path) -> None:
    """A source mark that does not say how many rows it wrote (``rows`` None: an older
    ledger's) may hold rows: its backfilled batch is noted like any other."""
    ledger = MemoryLedger()
    lake = _lake(ledger)
    ledger.entries[:] = [
        replace(e, rows=None) if e.sink == "lake" and e.status == "committed" else e
        for e in ledger.entries
    ]
    pg = Unsure("pg")
    fan = _fan(tmp_path, ledger, lake, pg)
    try:
        fan.catchup.drain("pg", until=lambda: False)
    finally:
        fan.close()
    assert _begun(ledger) == [("pg", 0), ("pg", 1), ("pg", 2)]
