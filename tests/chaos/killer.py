"""The chaos fault plugin: SIGKILLs the driver at one chosen point of one batch.

Faults come only through fanout's lifecycle hooks, like any observer plugin. Points:

- ``batch_start``: before any sink writes;
- ``sink_writing``: while a sink is writing (its executors included): a timer started at
  ``fanout_sink_start`` fires after ``delay_s``;
- ``sink_done``: after a sink's write, before its ledger mark;
- ``ledger_commit``: a timer started at ``fanout_sink_done`` fires ``delay_s`` later, in the
  few milliseconds of the ledger commit that follows;
- ``batch_end``: after every mark, before Spark's commit log;
- ``catchup_writing`` / ``catchup_done`` (lag mode): while the catch-up writes one of
  ``sink``'s missed batches (a timer), or after that write and before its mark (a write
  of a batch older than the live one, or of any batch before a live one started).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fanout import hookimpl
from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkResult

POINTS = ("batch_start", "sink_writing", "sink_done", "ledger_commit", "batch_end")
SINK_POINTS = ("sink_writing", "sink_done", "ledger_commit", "catchup_writing", "catchup_done")
CATCHUP_POINTS = ("catchup_writing", "catchup_done")


@dataclass(frozen=True)
class KillPlan:
    """Where to die: ``point`` of batch ``batch_id`` (of ``sink``), ``delay_s`` for timers."""

    point: str
    batch_id: int
    sink: str | None = None
    delay_s: float = 0.0

    def describe(self) -> str:
        """A short label for tables and logs."""
        where = f" of {self.sink}" if self.sink else ""
        delay = (
            f" +{self.delay_s * 1000:.0f}ms"
            if self.point in ("sink_writing", "ledger_commit", "catchup_writing")
            else ""
        )
        return f"{self.point}{where} @ batch {self.batch_id}{delay}"


def die(label: str) -> None:
    """SIGKILL this process: no cleanup, no finally blocks, no flush of anything."""
    print(f"CHAOS KILL {label}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class ChaosKiller:
    """Kills the process according to a :class:`KillPlan`."""

    def __init__(self, plan: KillPlan) -> None:
        self.plan = plan
        self.live: int | None = None  # the live batch (catch-up writes are of older ones)

    def _hit(self, info: BatchInfo, point: str, sink: str | None = None) -> bool:
        plan = self.plan
        if point in CATCHUP_POINTS:  # a write of an older batch than the live one
            return (
                plan.point == point
                and plan.sink == sink
                and (self.live is None or info.batch_id < self.live)
            )
        return plan.point == point and plan.batch_id == info.batch_id and plan.sink == sink

    def _later(self) -> None:
        timer = threading.Timer(self.plan.delay_s, die, args=(self.plan.describe(),))
        timer.daemon = True
        timer.start()

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """Before any sink writes."""
        self.live = info.batch_id
        if self._hit(info, "batch_start"):
            die(self.plan.describe())

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        """Arm the timer that fires while the sink writes."""
        if self._hit(info, "sink_writing", sink) or self._hit(info, "catchup_writing", sink):
            self._later()

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """After the write, before the mark (or arm the timer that fires during the mark)."""
        if self._hit(info, "sink_done", sink) or self._hit(info, "catchup_done", sink):
            die(self.plan.describe())
        if self._hit(info, "ledger_commit", sink):
            self._later()

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        """After every mark, before Spark's commit log."""
        if self._hit(info, "batch_end"):
            die(self.plan.describe())
