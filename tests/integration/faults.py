"""A fault-injection plugin: kills the driver process at a chosen lifecycle point.

It works only through fanout's lifecycle hooks, like any observer plugin; product code
has no test-only branches.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from fanout import hookimpl
from fanout.sink import BatchInfo, SinkResult

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
