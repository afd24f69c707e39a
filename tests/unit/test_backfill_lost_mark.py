"""A backfill's cache of its source's ledger marks never answers with a lost mark a write's
own mark replaced (docs/architecture.md §5, "A batch in flight", and "The lost mark's
counts"): the catch-up would skip the batch's row-count check and take its dead letters
from the source's target. Marks that are not lost stay cached. Memory ledger."""

from __future__ import annotations

from typing import Any

from fanout.ledger.entry import LOST_MARK, LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.lag import Lagging
from tests.unit.fakes import ScriptedSink, committed


class CountingLedger(MemoryLedger):
    """A memory ledger counting the reads of its marks' rows."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def committed_entries(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        self.reads += 1
        return super().committed_entries(pipeline, min_batch_id, epoch)


def _lagging(ledger: MemoryLedger) -> Lagging:
    specs = {
        "lake": SinkSpec(ScriptedSink("lake")),
        "pg": SinkSpec(ScriptedSink("pg"), lag=lag_policy("pg", {"backfill_from": "lake"})),
    }
    source: Any = object()  # never read: only the marks are
    return Lagging("pipe", specs, ledger, None, sources={"pg": source})


def test_a_lost_mark_replaced_after_it_was_cached_is_read_again() -> None:
    ledger = CountingLedger()
    ledger.mark_committed(committed("pipe", "lake", 0, rows=3, dead_lettered=0))
    lost = f"{LOST_MARK}: recorded by fanout recover while the batch was in flight"
    ledger.mark_committed(committed("pipe", "lake", 1, query_id="q-0", error=lost))
    lagging = _lagging(ledger)
    lagging.saw_marks(0, {"lake": 1, "pg": None})

    assert lagging.backlog("pg").keys == [(0, 0), (0, 1)]
    first = lagging.source_mark("pg", (0, 1))
    assert first is not None and first.lost and first.rows is None

    # the live query's own mark of batch 1 replaces the lost one (the lake's mark stays 1)
    assert ledger.mark_committed(committed("pipe", "lake", 1, rows=5, dead_lettered=2)) is True
    lagging.committed("lake", (0, 1))

    assert lagging.backlog("pg").keys == [(0, 0), (0, 1)]
    mark = lagging.source_mark("pg", (0, 1))
    assert mark is not None
    assert (mark.lost, mark.rows, mark.dead_lettered, mark.error) == (False, 5, 2, None)

    # once replaced, it is cached like any other mark: no more reads for it or batch 0
    reads = ledger.reads
    assert lagging.source_mark("pg", (0, 1)) == mark
    assert lagging.source_mark("pg", (0, 0)) == committed(
        "pipe", "lake", 0, rows=3, dead_lettered=0
    )
    assert ledger.reads == reads


def test_a_new_mark_of_the_source_refreshes_a_cached_lost_mark_replaced_since() -> None:
    ledger = CountingLedger()
    lost = f"{LOST_MARK}: recorded by fanout recover while the batch was in flight"
    ledger.mark_committed(committed("pipe", "lake", 0, query_id="q-0", error=lost))
    lagging = _lagging(ledger)
    lagging.saw_marks(0, {"lake": 0, "pg": None})
    assert lagging.backlog("pg").keys == [(0, 0)]

    ledger.mark_committed(committed("pipe", "lake", 0, rows=4, dead_lettered=0))
    ledger.mark_committed(committed("pipe", "lake", 1, rows=6, dead_lettered=1))
    lagging.committed("lake", (0, 1))
    assert lagging.backlog("pg").keys == [(0, 0), (0, 1)]  # one read, from batch 0 on

    reads = ledger.reads
    marks = [lagging.source_mark("pg", (0, b)) for b in (0, 1)]
    assert [(m.batch_id, m.rows, m.lost) for m in marks if m is not None] == [
        (0, 4, False),
        (1, 6, False),
    ]
    assert ledger.reads == reads


def test_a_lost_mark_never_replaced_stays_lost() -> None:
    ledger = MemoryLedger()
    lost = f"{LOST_MARK}: recorded by fanout recover; the sink holds the batch"
    ledger.mark_committed(committed("pipe", "lake", 0, query_id="q-0", error=lost))
    lagging = _lagging(ledger)
    lagging.saw_marks(0, {"lake": 0, "pg": None})
    assert lagging.backlog("pg").keys == [(0, 0)]

    mark = lagging.source_mark("pg", (0, 0))
    assert mark is not None and mark.lost and (mark.rows, mark.dead_lettered) == (None, None)
