"""The outage timeline of bench_lag.py: per batch, what each sink did (written, and in how
long; or missed and how far behind it was), then the catch-up, batch by batch."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fanout import hookimpl


@dataclass
class Timeline:
    """An observer plugin recording each live batch and each caught-up batch."""

    started: float = field(default_factory=time.perf_counter)
    live: dict[int, dict[str, str]] = field(default_factory=dict)
    caught_up: list[tuple[int, float, float]] = field(default_factory=list)  # batch, s, at
    _current: int | None = None
    _catching: bool = False

    def catching_up(self) -> None:
        """From now on, sink writes are the catch-up's."""
        self._catching = True

    @hookimpl
    def fanout_batch_start(self, info: Any, pending: Any, skipped: Any) -> None:
        """A live batch begins."""
        self._current = info.batch_id
        self.live[info.batch_id] = {"at": f"{time.perf_counter() - self.started:.2f}"}

    @hookimpl
    def fanout_sink_done(self, info: Any, sink: str, result: Any, duration_s: float) -> None:
        """A sink wrote a batch: live, or caught up."""
        if self._catching or info.batch_id != self._current:
            self.caught_up.append((info.batch_id, duration_s, time.perf_counter() - self.started))
        else:
            self.live[info.batch_id][sink] = f"{result.rows} rows {duration_s:.2f}s"

    @hookimpl
    def fanout_sink_lag(self, info: Any, lags: Mapping[str, Any], spool: Any) -> None:
        """How far behind each lag-capable sink is after the batch."""
        for sink, lag in lags.items():
            if lag.state != "live":
                self.live[info.batch_id][sink] = f"{lag.state} {lag.batches} batches behind"

    def print(self, sinks: tuple[str, ...]) -> None:
        """The table."""
        print("\noutage timeline (the last outage run; t = seconds since the FanOut was built)")
        print(f"{'batch':>5} {'t':>7}  " + "  ".join(f"{s:<26}" for s in sinks))
        for batch, cells in sorted(self.live.items()):
            row = "  ".join(f"{cells.get(s, '-'):<26}" for s in sinks)
            print(f"{batch:>5} {cells['at']:>7}  {row}")
        if self.caught_up:
            total = sum(s for _, s, _ in self.caught_up)
            order = [b for b, _, _ in self.caught_up]
            print(f"catch-up: batches {order} in order, {total:.2f} s of writes")
