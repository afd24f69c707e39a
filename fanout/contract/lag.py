"""How far behind a sink is: what observers (metrics, ``fanout run``'s batch line) and
``fanout status`` show for sinks with ``on_failure="lag"`` or ``backfill_from``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

LagState = Literal["live", "lagging", "catching_up", "stopped"]
"""``live``: writes each batch as it comes. ``lagging``: behind, and its last attempt
failed (the catch-up probes it at an interval). ``catching_up``: behind, and writing its
missed batches from the spool. ``stopped``: failed with ``on_failure="stop"`` (status only)."""


@dataclass(frozen=True)
class SinkLag:
    """One sink's distance from the live batch.

    :param sink: the sink's name.
    :param state: see :data:`LagState`.
    :param batches: batches it still needs (from the spool or its backfill source).
    :param rows: rows of those batches the spool holds.
    :param since: when its oldest missed batch was spooled (``None`` when live).
    :param error: its last failure, when lagging.
    """

    sink: str
    state: LagState
    batches: int = 0
    rows: int = 0
    since: datetime | None = None
    error: str | None = None

    def describe(self) -> str:
        """``pg lagging 3 batches / 120 rows since 10:02:11``, or ``pg live``."""
        if self.state == "live":
            return f"{self.sink} live"
        since = "" if self.since is None else f" since {self.since:%H:%M:%S}"
        return (
            f"{self.sink} {self.state.replace('_', ' ')} {self.batches} batch(es) / "
            f"{self.rows} row(s){since}"
        )


@dataclass(frozen=True)
class SpoolSize:
    """What the spool holds: batches, rows and bytes (its Parquet files)."""

    batches: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class SinkBehind:
    """A sink still missing batches when a run ends (:meth:`fanout.FanOut.final_catch_up`).

    :param sink: the sink's name.
    :param first: the oldest batch it misses, as ``(epoch, batch id)``.
    :param last: the newest batch it misses, as ``(epoch, batch id)``.
    :param batches: how many batches it misses.
    :param spooled: how many of them the spool holds (the others: its backfill source).
    :param rows: the rows of those the spool holds.
    :param backfill_from: the backfill source holding the others, when some are not spooled.
    :param error: its last failure (secrets masked as in the log), if any.
    :param stuck: whether that failure waits for the operator, not for a next run (its
        backfill source cannot give a batch back as it was committed, or its next batch
        lies past batches nothing holds for it).
    """

    sink: str
    first: tuple[int, int]
    last: tuple[int, int]
    batches: int
    spooled: int = 0
    rows: int = 0
    backfill_from: str | None = None
    error: str | None = None
    stuck: bool = False

    def batch_range(self) -> str:
        """``batches 3 to 7``, ``batch 3``, with the epoch when it is not 0."""
        (e1, b1), (e2, b2) = self.first, self.last
        if e1 != e2:
            return f"batch {b1} of epoch {e1} to batch {b2} of epoch {e2}"
        epoch = f" of epoch {e1}" if e1 else ""
        return f"batch {b1}{epoch}" if b1 == b2 else f"batches {b1} to {b2}{epoch}"

    def describe(self) -> str:
        """``pg: batches 3 to 7 (5 batch(es), 120 row(s) in the spool); its last error: ...``"""
        held = [f"{self.batches} batch(es)"]
        if self.spooled:
            held.append(f"{self.rows} row(s) in the spool")
        if self.backfill_from is not None and self.spooled < self.batches:
            others = self.batches - self.spooled
            held.append(f"{others} from its backfill source {self.backfill_from!r}")
        error = "" if self.error is None else f"; its last error: {' '.join(self.error.split())}"
        return f"{self.sink}: {self.batch_range()} ({', '.join(held)}){error}"
