"""Fault injection: a plugin that kills the driver process at a chosen lifecycle point,
and a ledger that loses a sink's marks.

It works only through fanout's lifecycle hooks, like any observer plugin; product code
has no test-only branches.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from fanout import hookimpl
from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkResult
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry

KILL_EXIT_CODE = 137  # what a SIGKILLed process reports as 128 + 9


class KillAt:
    """Calls ``os._exit`` (no cleanup, no finally blocks: a hard kill) at ``point``.

    :param point: ``batch_start`` (before any sink writes), ``sink_done`` (after ``sink``
        wrote, before its ledger mark) or ``batch_end`` (after every mark, before Spark's
        commit log).
    """

    def __init__(self, point: str, batch_id: int, sink: str | None = None) -> None:
        self.point, self.batch_id, self.sink = point, batch_id, sink

    def _die(self, info: BatchInfo, point: str, sink: str | None = None) -> None:
        if point == self.point and info.batch_id == self.batch_id and sink == self.sink:
            print(f"KILL at {point} batch {info.batch_id} sink {sink}", file=sys.stderr, flush=True)
            os._exit(KILL_EXIT_CODE)

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """Kill before any sink writes."""
        self._die(info, "batch_start")

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """Kill after a sink's write, before its ledger mark."""
        self._die(info, "sink_done", sink)

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        """Kill after every mark, before Spark's commit log."""
        self._die(info, "batch_end")


class MarkLost(DeltaLedger):
    """A ledger that loses ``sink``'s marks: as if the driver died after the sink wrote
    (dead letters included), before its ledger mark. Run the batch again with a plain
    ledger on the same path for the replay."""

    def __init__(self, path: str, sink: str) -> None:
        super().__init__(path)
        self.sink = sink

    def mark_committed(self, entry: LedgerEntry) -> bool:
        """Fail for ``sink``; mark the others."""
        if entry.sink == self.sink:
            raise OSError("driver killed before the ledger mark")
        return super().mark_committed(entry)
