"""One rule decides which of two marks of one sink at one batch fanout believes
(:func:`fanout.ledger.gaps.mark_weight`): a write's own mark over a lost mark over a skip's.
The three readers that meet two marks of a batch (the backfill source's mark cache, the
spool's given-up check, ``fanout status``'s last batch) must agree with it."""

from __future__ import annotations

import itertools

import pytest

from fanout.app.status import _last_key
from fanout.ledger.entry import LOST_MARK, LedgerEntry
from fanout.ledger.gaps import SKIPPED, held_by_skip, mark_weight
from fanout.steps.lag_backfill import _written_over

ERRORS = {
    "write": None,
    "lost": f"{LOST_MARK}: the sink's records hold batch 4",
    "skip": f"{SKIPPED}: by an operator",
}


def _entry(kind: str) -> LedgerEntry:
    return LedgerEntry("p", "s", 4, "committed", error=ERRORS[kind])


def test_the_weights_order_a_write_over_a_lost_mark_over_a_skip() -> None:
    assert [mark_weight(False), mark_weight(False, lost=True), mark_weight(True)] == [2, 1, 0]


@pytest.mark.parametrize(("cached", "read"), list(itertools.permutations(ERRORS, 2)))
def test_the_backfill_cache_and_status_keep_the_same_mark(cached: str, read: str) -> None:
    order = ["skip", "lost", "write"]
    expected = order.index(read) > order.index(cached)
    assert _written_over(_entry(cached), _entry(read)) is expected
    rows = [{"batch_id": 4, "epoch": 0, "error": ERRORS[k]} for k in (cached, read)]
    assert max(rows, key=_last_key)["error"] == ERRORS[max(cached, read, key=order.index)]


def test_a_batch_is_given_up_only_when_the_believed_mark_is_a_skip() -> None:
    assert held_by_skip(4, [(4, True)])
    assert not held_by_skip(4, [(4, True), (4, False)])
    assert not held_by_skip(4, [(4, False), (4, True)])
    assert held_by_skip(3, [(5, False), (4, True)])
    assert not held_by_skip(5, [(4, True)])
