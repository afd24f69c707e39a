"""A ``fanout ledger skip`` recorded while the sink's write of the batch ran (between the
write and its mark): the write's own mark is recorded beside the skip's, the sink's mark
left where the skip put it, and readers that take one mark per batch (a backfill from the
sink, the skip's own check of a backfill source) take the write's (docs/architecture.md
§14.1, "A skip racing a write"). On both ledgers; the race itself, with the real CLI in a
subprocess and real Spark, is ``tests/integration/test_skip_in_flight.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger
from fanout.ledger.gaps import held_by_skip, is_skip, skip_batches
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.lag import Lagging
from tests.unit.fakes import ScriptedSink, committed


@pytest.fixture(params=["memory", "delta"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "memory":
        return MemoryLedger()
    delta = DeltaLedger(str(tmp_path / "ledger"))
    delta.open()
    return delta


def _lake_skipped_through_2_while_writing_it(ledger: Ledger) -> None:
    """lake wrote and marked 0 and 1; good marked 2; a skip of lake through 2 lands while
    lake's write of 2 runs; then lake's own mark of 2 (5 rows)."""
    for batch in range(3):
        ledger.mark_committed(committed("pipe", "good", batch, rows=5))
    for batch in range(2):
        ledger.mark_committed(committed("pipe", "lake", batch, rows=5))
    assert skip_batches(ledger, "pipe", "lake", 2).recorded
    assert ledger.mark_committed(committed("pipe", "lake", 2, rows=5)) is True


def _lake_skipped_2_and_pg_backfilling_from_it(ledger: Ledger) -> dict[str, Any]:
    """good committed batches 0-2 and lake 0-1, lake's batch 2 skipped (the skip's mark
    alone in the ledger); the specs of lake and of pg, which backfills from lake."""
    for batch in range(3):
        ledger.mark_committed(committed("pipe", "good", batch, rows=5))
    for batch in range(2):
        ledger.mark_committed(committed("pipe", "lake", batch, rows=5))
    assert skip_batches(ledger, "pipe", "lake", 2).recorded
    return {
        "lake": SinkSpec(ScriptedSink("lake")),
        "pg": SinkSpec(ScriptedSink("pg"), lag=lag_policy("pg", {"backfill_from": "lake"})),
    }


def test_the_write_s_mark_is_recorded_beside_the_skip_s_once(ledger: Ledger) -> None:
    _lake_skipped_through_2_while_writing_it(ledger)
    lake = sorted(
        (e.batch_id, e.rows, is_skip(e))
        for e in ledger.committed_entries("pipe")
        if e.sink == "lake"
    )
    assert lake == [(0, 5, False), (1, 5, False), (2, 0, True), (2, 5, False)]
    assert not held_by_skip(2, [(b, skip) for b, _, skip in lake])
    assert ledger.last_committed("pipe", ["lake", "good"]) == {"lake": 2, "good": 2}

    # made again (a retry, a replay's mark): the batch's write is marked already
    assert ledger.mark_committed(committed("pipe", "lake", 2, rows=5)) is False
    # a mark of a batch the sink's own mark holds, below it, passes as before
    assert ledger.mark_committed(committed("pipe", "lake", 1, rows=5)) is False
    count = sum(1 for e in ledger.committed_entries("pipe") if e.sink == "lake")
    assert count == 4


def test_a_skip_without_a_write_still_holds_its_batches(ledger: Ledger) -> None:
    """Only a write's own mark goes beside a skip: a mark carrying an error (a lost mark, a
    second skip) of a batch the skip holds is not recorded."""
    for batch in range(3):
        ledger.mark_committed(committed("pipe", "good", batch, rows=5))
    ledger.mark_committed(committed("pipe", "lake", 0, rows=5))
    assert skip_batches(ledger, "pipe", "lake", 2).recorded
    lost = committed("pipe", "lake", 1, error="lost mark: recorded by fanout recover")
    assert ledger.mark_committed(lost) is False
    lake = [(e.batch_id, is_skip(e)) for e in ledger.committed_entries("pipe") if e.sink == "lake"]
    assert sorted(lake) == [(0, False), (2, True)]
    assert held_by_skip(1, lake) and held_by_skip(2, lake)


def test_a_backfill_from_the_sink_gets_the_batch_it_wrote(ledger: Ledger) -> None:
    """pg backfills from lake: batch 2 is one lake holds (its write's mark, 5 rows), so pg
    gets it; before, lake's only mark of it was the skip's, which a backfill never takes."""
    _lake_skipped_through_2_while_writing_it(ledger)
    specs: dict[str, Any] = {
        "lake": SinkSpec(ScriptedSink("lake")),
        "pg": SinkSpec(ScriptedSink("pg"), lag=lag_policy("pg", {"backfill_from": "lake"})),
    }
    source: Any = object()  # never read: only the marks are
    lagging = Lagging("pipe", specs, ledger, None, sources={"pg": source})
    lagging.saw_marks(0, {"lake": 2, "pg": None})
    assert lagging.backlog("pg").keys == [(0, 0), (0, 1), (0, 2)]
    mark = lagging.source_mark("pg", (0, 2))
    assert mark is not None and (mark.rows, is_skip(mark)) == (5, False)


def test_a_backfill_that_cached_the_skip_s_mark_takes_the_write_s_mark_landing_after(
    ledger: Ledger,
) -> None:
    """pg backfills from lake and looks at its backlog between the skip of lake's batch 2
    and lake's own mark of it (the skip's mark alone in the ledger): batch 2 is not in it,
    and the skip's mark is cached. Then the write's mark lands beside it; lake's mark does
    not move (2 both times). The next look-up reads the cached skip of a batch pg still
    needs again: batch 2 is back in the backlog, and its source mark is the write's. Up to
    this fix the cache kept the skip's mark until a restart (backlog [0, 1] for good)."""
    specs = _lake_skipped_2_and_pg_backfilling_from_it(ledger)
    source: Any = object()  # never read: only the marks are
    lagging = Lagging("pipe", specs, ledger, None, sources={"pg": source})
    lagging.saw_marks(0, {"lake": 2, "pg": None})
    assert lagging.backlog("pg").keys == [(0, 0), (0, 1)]
    assert ledger.mark_committed(committed("pipe", "lake", 2, rows=5)) is True  # beside
    lagging.committed("lake", (0, 2))  # as the write's step 6b (or the catch-up) says next
    assert lagging.backlog("pg").keys == [(0, 0), (0, 1), (0, 2)]
    mark = lagging.source_mark("pg", (0, 2))
    assert mark is not None and (mark.rows, is_skip(mark)) == (5, False)


def test_a_catch_up_write_inside_a_skip_s_range_is_recorded_beside_it(ledger: Ledger) -> None:
    """The catch-up wrote lake's spooled batch 1 while a skip through 3 landed (its range
    1-3): batch 1 counts as written, 2 and 3 stay given up, the mark stays 3."""
    for batch in range(4):
        ledger.mark_committed(committed("pipe", "good", batch, rows=5))
    ledger.mark_committed(committed("pipe", "lake", 0, rows=5))
    assert skip_batches(ledger, "pipe", "lake", 3).recorded
    assert ledger.mark_committed(committed("pipe", "lake", 1, rows=5)) is True
    lake = sorted(
        (e.batch_id, e.rows, is_skip(e))
        for e in ledger.committed_entries("pipe")
        if e.sink == "lake"
    )
    assert lake == [(0, 5, False), (1, 5, False), (3, 0, True)]
    marks = [(b, skip) for b, _, skip in lake]
    assert [held_by_skip(b, marks) for b in range(4)] == [False, False, True, True]
    assert ledger.last_committed("pipe", ["lake"]) == {"lake": 3}


def test_status_shows_the_write_s_counts_of_the_last_batch(tmp_path: Path) -> None:
    """``fanout status``'s last batch of lake is batch 2, which both marks hold: it shows the
    write's rows and time, not the skip's 0, whichever row a scan gives first."""
    from fanout.app.status import summarize

    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    _lake_skipped_through_2_while_writing_it(ledger)
    write = next(
        e
        for e in ledger.committed_entries("pipe")
        if (e.sink, e.batch_id) == ("lake", 2) and not is_skip(e)
    )
    rows = ledger.rows("pipe")
    for order in (rows, rows[::-1]):
        lake = next(s for s in summarize(order) if s.sink == "lake")
        assert (lake.last_committed_batch, lake.last_batch_rows) == (2, 5)
        assert (lake.committed_batches, lake.rows_total) == (3, 15)
        assert lake.last_commit_at == write.finished_at


def test_a_cached_skip_is_read_again_once_per_batch_not_at_every_look_up(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A skip of lake's batch 2 that no write of lake follows (a batch lake missed, given
    up), pg backfilling from lake and below it: the batch-2 skip stays cached as long as pg
    lags. The look-ups of pg's backlog (a batch's start, the hold-back, the catch-up's
    writes, several per batch) read the ledger again only at a batch's start (its marks
    seen) and after this instance committed lake's batch 2 (its write's mark recorded
    beside the skip), not at each look-up: 5 look-ups in one batch, 1 read. Up to this
    bound each look-up read the ledger (5 reads)."""
    specs = _lake_skipped_2_and_pg_backfilling_from_it(ledger)
    reads: list[tuple[Any, ...]] = []
    read = ledger.committed_entries

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return read(*args, **kwargs)

    monkeypatch.setattr(ledger, "committed_entries", counted)
    lagging = Lagging("pipe", specs, ledger, None, sources={"pg": object()})
    lagging.saw_marks(0, {"lake": 2, "pg": None})
    for _ in range(5):
        assert lagging.backlog("pg").keys == [(0, 0), (0, 1)]
    assert len(reads) == 1
    lagging.saw_marks(0, {"lake": 2, "pg": None})  # the next batch's start: read once more
    for _ in range(3):
        assert lagging.backlog("pg").keys == [(0, 0), (0, 1)]
    assert len(reads) == 2
    assert ledger.mark_committed(committed("pipe", "lake", 2, rows=5)) is True  # beside
    lagging.committed("lake", (0, 2))  # as the write's step 6b / the catch-up says
    for _ in range(3):
        assert lagging.backlog("pg").keys == [(0, 0), (0, 1), (0, 2)]
    assert len(reads) == 3
