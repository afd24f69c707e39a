"""Upsert by plain ``COPY`` when a partition's keys are all new, and when to try it.

An upsert stages its rows (``COPY`` into a temporary table), then merges them into the
target. When none of a partition's keys is in the target yet (and none occurs twice), the
merge only inserts, and a ``COPY`` straight into the target ends in the same rows for
half to two thirds of the server's work (the staging copy and the merge's join are gone;
1.5 against 2.9 CPU s for 1M new rows in ``bench/bench_three_sinks.py``).
So an upsert partition first copies into the target inside a savepoint; the unique index
refuses the first key already there, the savepoint undoes the copy, and the staged upsert
runs as before. Any other row the server refuses does the same, so rows are isolated and
reported by the staged path exactly as without the direct copy.

A refused direct copy costs what it copied before the conflicting key: little when the
batch updates many keys (the first conflict comes early), up to a whole copy when it
updates few. :class:`DirectCopyPolicy` keeps that bounded on the driver: a batch in which
a partition's direct copy was refused makes the following batches skip it, for 1, 2, 4 ...
up to :data:`MAX_SKIP` batches while refusals continue; a batch whose direct copies all
held resets it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fanout.partitioned.outcome import PartitionOutcome

HELD = "direct_copies"
"""Outcome counter: 1 when the partition's rows went straight into the target."""
REFUSED = "direct_copies_refused"
"""Outcome counter: 1 when the direct copy was refused and the staged upsert ran."""
MAX_SKIP = 64
"""The most batches skipped between two tries of the direct copy."""


@dataclass
class DirectCopyPolicy:
    """Whether the next upsert batch tries the direct copy (state of one sink, on the
    driver; see the module docstring)."""

    skip: int = 0
    """Batches still to write staged before the next try."""
    backoff: int = 0
    """Batches to skip after the next refused try (0: one)."""

    def wanted(self) -> bool:
        """Whether this batch's partitions try the direct copy; counts a skipped batch."""
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def record(self, outcomes: Sequence[PartitionOutcome]) -> None:
        """Learn from a batch's partitions (those that tried the direct copy)."""
        held = sum(o.counters.get(HELD, 0) for o in outcomes)
        refused = sum(o.counters.get(REFUSED, 0) for o in outcomes)
        if refused:
            self.backoff = min(max(1, self.backoff * 2), MAX_SKIP)
            self.skip = self.backoff
        elif held:
            self.backoff = 0
