"""A ``FanOut`` whose checkpoint reset was refused, used again by the code that built it (the
replaced checkpoint restored, its query resumed in the same process): its next batch asks
each sink's target again whether it still holds its last marked batch (docs/architecture.md
§5, the lost-target check). Before, the refused start had already counted that check as
done for the run, so a target lost since was written into unasked. A memory ledger and
recording sinks: the check's own cases are ``test_lost_target.py``'s."""

from __future__ import annotations

import pyarrow as pa
import pytest

from fanout import BatchInfo, FanOut, TargetLostError, UnmarkedBatchError
from fanout.errors import CheckpointResetError, ZombieBatchError
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.testing import ArrowFrame, RecordingSink

OLD, NEW = "query-old", "query-new"


class Target(RecordingSink):
    """Holds the batches of epoch 0 in ``held`` by its own records; records what it was
    asked."""

    def __init__(self, name: str, held: set[int]) -> None:
        super().__init__(name)
        self.held = held
        self.asked: list[tuple[int, int]] = []

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        """Whether ``held`` has the batch (epoch 0's only)."""
        self.asked.append((epoch, batch_id))
        return epoch == 0 and batch_id in self.held


class StartRefused(MemoryLedger):
    """A ledger refusing a new epoch's start as a ``fanout recover`` report passed by the
    old query refuses it (after the start's checks of the sinks passed)."""

    def start_epoch(self, entry: LedgerEntry) -> None:
        """Refuse any epoch after 0."""
        if entry.epoch > 0:
            raise ZombieBatchError(f"pipeline {entry.pipeline}: the old query wrote on")
        super().start_epoch(entry)


def _batch(fan: FanOut, batch: int, query: str) -> None:
    fan.process(ArrowFrame(pa.table({"x": [batch]})), BatchInfo("p", batch, query))


@pytest.mark.parametrize(
    ("refused_by", "refusal"),
    [("sink", UnmarkedBatchError), ("ledger", ZombieBatchError)],
)
def test_the_next_batch_after_a_refused_reset_asks_the_targets_again(
    refused_by: str, refusal: type[CheckpointResetError]
) -> None:
    """``refused_by``: the reset refused by its checks of the sinks (sink ``a`` holds batch
    3, written and never marked), or by the ledger once they passed (the start's claim).
    Then sink ``s``'s target is lost (created again empty) and the old query's batch 3
    comes: refused naming ``s``, nothing written."""
    ledger = MemoryLedger() if refused_by == "sink" else StartRefused()
    first = FanOut("p", ledger, [RecordingSink("a"), RecordingSink("s")])
    for batch in range(3):
        _batch(first, batch, OLD)
    first.close()

    a = Target("a", {0, 1, 2, 3} if refused_by == "sink" else {0, 1, 2})
    s = Target("s", {0, 1, 2})
    fan = FanOut("p", ledger, [a, s], retries=0, on_checkpoint_reset="new_epoch")
    try:
        with pytest.raises(refusal):
            _batch(fan, 0, NEW)  # the reset: refused
        assert s.asked == [(0, 2), (0, 3)]  # its last mark (held), the batch after (not)

        s.held = set()  # lost: deleted and created again empty
        with pytest.raises(TargetLostError) as lost:
            _batch(fan, 3, OLD)  # the replaced checkpoint resumed
    finally:
        fan.close()
    assert (lost.value.sink, lost.value.batch_id) == ("s", 2)
    assert s.asked == [(0, 2), (0, 3), (0, 2)]  # asked again (before: not, and written)
    assert a.calls == [] and s.calls == []
    assert ledger.last_committed("p", ["a", "s"]) == {"a": 3 if refused_by == "sink" else 2,
                                                      "s": 2}  # fmt: skip
