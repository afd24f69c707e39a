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
