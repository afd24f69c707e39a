"""What a :class:`fanout.fan_out.FanOut` does about its lagging sinks' backlog outside a
batch (docs/architecture.md §14): start the catch-up beside the query, catch up now or once
the query has ended, and say which sinks are still behind."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.contract.lag import SinkBehind, SinkLag
from fanout.contract.locations import command_location
from fanout.contract.sessions import is_connect
from fanout.dispatch.targets import TargetChecks
from fanout.errors import SinksBehindError, TargetLostError
from fanout.ledger.entry import Ledger, ledger_location
from fanout.observe.logs import batch_fields
from fanout.retry import RetryPolicy
from fanout.sink_spec import SinkSpec
from fanout.spool.table import Spool
from fanout.steps.catchup import CatchUp
from fanout.steps.context import ContextReader
from fanout.steps.lag import Lagging
from fanout.steps.resume import query_checkpoint, why_wait

log = logging.getLogger("fanout")


class Backlog:
    """The lagging sinks of ``pipeline`` (``lagging``) and their catch-up (``catchup``),
    asked from outside a batch: the catch-up thread started with the query, a catch-up
    run in the caller's thread, and what is still behind.

    :param retry: the pipeline's retry policy, for a sink without its own at the final
        catch-up.
    :param context: the batches' context reader, which knows the query's checkpoint.
    :param spark: the session the sinks were opened with.
    :param targets: the run's target checks, asked before a catch-up writes ahead of the
        run's first batch."""

    def __init__(
        self,
        pipeline: str,
        lagging: Lagging,
        catchup: CatchUp,
        specs: Mapping[str, SinkSpec],
        ledger: Ledger,
        spool: Spool | None,
        *,
        retry: RetryPolicy,
        context: ContextReader,
        spark: Any,
        targets: TargetChecks,
    ) -> None:
        self.pipeline = pipeline
        self.lagging = lagging
        self.catchup = catchup
        self.specs = specs
        self.ledger = ledger
        self.spool = spool
        self.retry = retry
        self.context = context
        self.spark = spark
        self.targets = targets

    def start(self, query: Any) -> str | None:
        """:meth:`fanout.fan_out.FanOut.start_catch_up`: start the catch-up thread beside
        the just started ``query`` when the checkpoint guard would admit its next batch and
        no sink's target lost its last marked batch; returns why it did not start
        (``None``: started, or no sink can lag)."""
        if not self.lagging.sinks:
            return None
        reason = self.why_wait(query)
        if reason is None:
            try:
                self.targets.check_before_catch_up()
            except TargetLostError as lost:  # the first batch refuses the run with it
                reason = str(lost)
            except Exception as exc:  # the ledger unreadable: the batch will say
                reason = f"cannot check the sinks' targets: {type(exc).__name__}: {exc}"
        if reason is None:
            checkpoint = self.context.checkpoint_location or query_checkpoint(query)
            if checkpoint is not None:  # the query owns the current epoch (why_wait)
                self.lagging.checkpoint = (self.lagging.epoch, checkpoint)
            self.catchup.start()
            self.catchup.wake()
        log.info(
            "pipeline %s: the catch-up %s",
            self.pipeline,
            "started with the query" if reason is None else f"waits for the first batch: {reason}",
            extra=batch_fields(self.pipeline),
        )
        return reason

    def saw_batch(self, info: BatchInfo) -> None:
        """An admitted live batch: it settles the batches of its epoch before it, and its
        query's checkpoint says which of the epoch's batches Spark committed
        (:meth:`fanout.steps.lag.Lagging.settled`)."""
        self.lagging.saw_batch((info.epoch, info.batch_id))
        checkpoint = self.context.location(info.query_id)
        if checkpoint is not None and info.query_id is not None:
            self.lagging.checkpoint = (info.epoch, checkpoint)

    def why_wait(self, query: Any) -> str | None:
        """Why the catch-up may not start before ``query``'s first batch (``None``: it
        may): :func:`fanout.steps.resume.why_wait`, or Spark Connect."""
        if self.spark is not None and is_connect(self.spark):
            return "under Spark Connect the FanOut beside the server runs the catch-up"
        checkpoint = self.context.checkpoint_location or query_checkpoint(query)
        query_id = getattr(query, "id", None)
        try:
            return why_wait(
                self.ledger,
                self.pipeline,
                None if query_id is None else str(query_id),
                checkpoint,
                self.spool,
            )
        except Exception as exc:  # the ledger or the spool unreadable: the batch will say
            return f"cannot check the checkpoint against the ledger: {type(exc).__name__}: {exc}"

    def catch_up(self, timeout_s: float) -> dict[str, SinkLag]:
        """:meth:`fanout.fan_out.FanOut.catch_up`: every lagging sink's missed batches
        written now, in this thread, within ``timeout_s``; each lag-capable sink's state."""
        deadline = time.monotonic() + timeout_s
        if self.lagging.sinks:
            self.targets.check_before_catch_up()
        for sink in self.lagging.sinks:
            self.catchup.drain(sink, until=lambda: time.monotonic() > deadline)
        self.lagging.release_held()
        return self.lagging.lags()

    def behind(self) -> list[SinkBehind]:
        """Every lag-capable sink still missing batches, with the first and last of them
        and its last error (empty: every sink holds every batch that ran)."""
        found = []
        for sink in self.lagging.sinks:
            backlog = self.lagging.backlog(sink)
            if backlog:
                found.append(
                    SinkBehind(
                        sink, backlog.keys[0], backlog.keys[-1], len(backlog.keys),
                        spooled=backlog.spooled, rows=backlog.spooled_rows,
                        backfill_from=self.specs[sink].lag.backfill_from,
                        error=self.lagging.lag_of(sink, backlog).error,
                        stuck=self.lagging.stuck(sink),
                    )
                )  # fmt: skip
        return found

    def final(
        self, done: Callable[[], bool], stopped_by: Callable[[], str | None] | None
    ) -> dict[str, SinkLag]:
        """:meth:`fanout.fan_out.FanOut.final_catch_up`: each lagging sink's backlog
        written now, until ``done()``; raises :class:`fanout.SinksBehindError` naming the
        sinks still behind (and ``stopped_by()`` when ``done()`` ended it)."""
        if any(self.lagging.backlog(sink) for sink in self.lagging.sinks):
            self.targets.check_before_catch_up()
        for sink in self.lagging.sinks:
            if self.lagging.backlog(sink):
                self.catchup.finish(sink, self.specs[sink].retry or self.retry, done)
        self.lagging.release_held()
        by = stopped_by() if stopped_by is not None and done() else None
        self.raise_behind(by, during_catch_up=by is not None)
        return self.lagging.lags()

    def stopped(self, by: str) -> None:
        """:meth:`fanout.fan_out.FanOut.stopped`: the catch-up thread stopped after the
        write in progress, nothing more written; raises :class:`fanout.SinksBehindError`
        naming the sinks still behind and ``by``."""
        self.catchup.stop()
        self.raise_behind(by)

    def raise_behind(self, stopped_by: str | None, *, during_catch_up: bool = False) -> None:
        """Raise :class:`fanout.SinksBehindError` when a sink is still behind."""
        behind = self.behind()
        if behind:
            spool = None if self.spool is None else command_location(self.spool.path)
            raise SinksBehindError(
                self.pipeline, behind, spool, ledger_location(self.ledger),
                stopped_by=stopped_by, during_catch_up=during_catch_up,
            )  # fmt: skip
