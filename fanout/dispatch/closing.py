"""Closing a :class:`fanout.fan_out.FanOut`'s sinks: at its close, when its start fails,
and, for a sink a thread still uses then, once that thread is done (docs/architecture.md
§14.4)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from fanout.contract.sink import Sink
from fanout.observe.logs import batch_fields
from fanout.sink_spec import SinkSpec, write_timeout
from fanout.spool.index import BatchKey
from fanout.steps.catchup import CatchUp
from fanout.steps.lag import Lagging
from fanout.steps.lag_state import Opening
from fanout.steps.owners import Held
from fanout.steps.owners import release as release_sinks
from fanout.steps.timeout import CLOSE_WAIT_S, AbandonedWrite, AbandonedWrites, BoundedCall

log = logging.getLogger("fanout")


class SinkCloser:
    """Closes the sinks of ``owner`` (the ``FanOut`` of ``pipeline`` that claimed them:
    :mod:`fanout.steps.owners`) and releases them for another ``FanOut``; a sink a thread
    still uses (a reopen, an abandoned write, a catch-up write) stays owned until that
    thread is done."""

    def __init__(self, owner: object, pipeline: str, specs: Mapping[str, SinkSpec]) -> None:
        self.owner = owner
        self.pipeline = pipeline
        self.specs = specs

    def close(self, catchup: CatchUp, lagging: Lagging, abandoned: AbandonedWrites) -> None:
        """:meth:`fanout.fan_out.FanOut.close` of a started ``FanOut``: the catch-up
        stopped, each sink closed but those a thread still uses, every sink released but
        those."""
        running: list[AbandonedWrite] = []
        left: tuple[threading.Thread, dict[str, BatchKey]] | None = None
        try:
            catchup.stop()
            left = self.catch_up_left_writing(catchup)
            running = self.abandoned_at_close(abandoned)
            still_writing = {w.sink for w in running} | set(left[1] if left else ())
            for name in lagging.close():
                if name not in still_writing:
                    self.close_logged(self.specs[name])
        finally:
            sinks = {name: spec.sink for name, spec in self.specs.items()}
            writing: list[tuple[Sink, Held]] = [(sinks[w.sink], "writing") for w in running]
            writing += [(sinks[name], "catching-up") for name in (left[1] if left else ())]
            release_sinks(self.owner, keep=[*self.held_by_threads(lagging), *writing])
            for write in running:
                self.close_after(write)
            if left is not None:
                self.close_after_catch_up(left[0], list(left[1]))

    def release_start(
        self,
        catchup: CatchUp | None,
        lagging: Lagging | None,
        opened: Sequence[str],
        opening: Mapping[str, Opening],
        make_lagging: Callable[[], Lagging],
    ) -> None:
        """A ``FanOut(...)`` failed: release what it acquired before the error, which its
        caller raises unchanged (so a failure here is logged, never raised): the catch-up
        stopped, each sink it opened (``opened``, in order) closed in reverse order of
        opening, a first ``open()`` still running (``opening``) closed by its thread once
        it returns (as at close: :meth:`fanout.steps.lag.Lagging.close`; handed to a lag
        state ``make_lagging`` builds when the start failed before it had one), and its
        sinks free for another ``FanOut``."""
        owned: Sequence[str] = opened
        try:
            if catchup is not None:
                catchup.stop()
        except Exception:  # the sinks are closed all the same
            log.exception("pipeline %s: stopping the catch-up of its failed start failed",
                          self.pipeline, extra=batch_fields(self.pipeline))  # fmt: skip
        try:
            if lagging is not None:  # every sink reached; a first open() past its
                owned = lagging.close()  # timeout may have returned since: open too
            else:  # the running opens not handed to a Lagging yet: handed now, to close
                lagging = make_lagging()
                lagging.close()  # first: each reopen thread closes what its open opened
                for name, running in opening.items():
                    lagging.still_opening(name, running)
        except Exception:
            log.exception("pipeline %s: stopping what its failed start began failed",
                          self.pipeline, extra=batch_fields(self.pipeline))  # fmt: skip
        later = [name for name in owned if name not in opened]  # opened after them
        for name in [*later, *reversed(opened)]:
            if name in owned:
                self.close_logged(self.specs[name])
        release_sinks(self.owner, keep=self.held_by_threads(lagging))

    def catch_up_left_writing(
        self, catchup: CatchUp
    ) -> tuple[threading.Thread, dict[str, BatchKey]] | None:
        """The catch-up thread :meth:`close` did not wait out (30 s) and the sinks it still
        writes (of a sink without ``write_timeout_s``: nothing bounds it), each with its
        batch, logged: their sinks stay open under that write (docs/architecture.md §14.4)."""
        left = catchup.left_writing()
        for name, (epoch, batch) in (left[1] if left else {}).items():
            log.warning(
                "pipeline %s, batch %s, sink %s: its catch-up write of batch %s (epoch %s) "
                "was still running at close (it has no write_timeout_s to bound it): not "
                "waited for, the sink is left open and closed once that write ends; a "
                "catch-up of the sink in this process waits for it. Find what holds the "
                "sink's target (a lock, a stalled connection), or set write_timeout_s",
                self.pipeline, batch, name, batch, epoch,
                extra=batch_fields(self.pipeline, batch, name),
            )  # fmt: skip
        return left

    def close_after_catch_up(self, thread: threading.Thread, sinks: Iterable[str]) -> None:
        """As :meth:`close_after`, for the sinks a catch-up thread still writes at
        :meth:`close`: closed and released once that thread has ended."""

        def close_when_done() -> None:
            thread.join()
            try:
                for name in sinks:
                    self.close_logged(self.specs[name])
            finally:
                release_sinks(self.owner, [self.specs[name].sink for name in sinks])

        name = f"fanout-{self.pipeline}-catchup-close-after-write"
        threading.Thread(target=close_when_done, name=name, daemon=True).start()

    def held_by_threads(self, lagging: Lagging | None) -> list[tuple[Sink, Held]]:
        """The sinks a reopen's thread (a first ``open()`` past its ``write_timeout_s``
        among them) still holds: not released with the others, another ``FanOut`` would
        open them while that thread may still close them; each is released by the thread
        once done (:meth:`released_by_thread`)."""
        if lagging is None:
            return []
        return [(self.specs[name].sink, "opening") for name in lagging.reopening()]

    def close_after(self, write: AbandonedWrite) -> None:
        """An abandoned write still running at :meth:`close` keeps its sink open and owned
        by the ``FanOut``: a daemon thread waits for it to end (its Spark tasks too), then
        closes the sink and releases it (another ``FanOut`` opening it meanwhile would
        replace what the write uses under it)."""
        spec = self.specs[write.sink]

        def close_when_done() -> None:
            write.done.wait()
            try:
                self.close_logged(spec)
            finally:
                release_sinks(self.owner, [spec.sink])

        name = f"fanout-{self.pipeline}-{write.sink}-close-after-write"
        threading.Thread(target=close_when_done, name=name, daemon=True).start()

    def released_by_thread(self, sink: str) -> None:
        """``sink``'s reopen thread, after the pipeline stopped, holds it no more."""
        release_sinks(self.owner, [self.specs[sink].sink])

    def close_logged(self, spec: SinkSpec) -> None:
        """:meth:`close_sink`, its error logged (masked by the log handlers), not raised:
        the other sinks are closed too."""
        try:
            self.close_sink(spec)
        except Exception:
            log.exception(
                "pipeline %s: closing sink %r failed",
                self.pipeline,
                spec.name,
                extra=batch_fields(self.pipeline, sink=spec.name),
            )

    def close_sink(self, spec: SinkSpec) -> None:
        """Close ``spec``'s sink; that of a sink with ``write_timeout_s`` is waited for
        that long, then left running in its daemon thread (logged): a hung target must
        not hang the query's stop."""
        timeout = write_timeout(spec)
        if timeout is None:
            spec.sink.close()
            return
        name = f"fanout-{self.pipeline}-{spec.name}-close"
        closing = BoundedCall.run(spec.sink.close, timeout, name)
        if closing.done.is_set():
            closing.outcome()
            return
        log.warning(
            "pipeline %s: sink %r: close() did not return within its write_timeout_s=%g s; "
            "left running, not waited for (find what holds the sink's target)",
            self.pipeline, spec.name, timeout,
            extra=batch_fields(self.pipeline, sink=spec.name),
        )  # fmt: skip

    def abandoned_at_close(self, abandoned: AbandonedWrites) -> list[AbandonedWrite]:
        """The abandoned writes whose Python code still runs after close's wait (their
        sinks are left open), each logged; one that has returned and only waits for its
        cancelled Spark tasks to end is logged as such (its sink is closed)."""
        still = abandoned.wait(CLOSE_WAIT_S)
        running = [w for w in still if not w.returned.is_set()]
        for write in still:
            since = time.monotonic() - write.since
            fields = batch_fields(self.pipeline, write.key[1], write.sink)
            if write not in running:
                log.warning(
                    "pipeline %s, batch %s, sink %s: its write, abandoned after %g s "
                    "(write_timeout_s), has returned, but Spark tasks of its cancelled jobs "
                    "were still running at close (%.0f s since it started; Spark kills a "
                    "task stuck in Python spark.python.task.killTimeout after the cancel; "
                    "one stuck in the JVM may run on until its call returns): the sink is closed. "
                    "Nothing is lost: the batch is in the spool for the sink, the next run "
                    "writes it and the sink's idempotency absorbs what those tasks commit; "
                    "if they keep running, find what holds the sink's target (a lock, a "
                    "stalled connection)",
                    self.pipeline, write.key[1], write.sink, write.timeout_s, since,
                    extra=fields,
                )  # fmt: skip
                continue
            log.warning(
                "pipeline %s, batch %s, sink %s: its write, abandoned after %g s "
                "(write_timeout_s), is still running at close (%.0f s since it started), "
                "not waited for: the sink is left open. The batch is in the spool for the "
                "sink: the next run writes it, and the sink's idempotency absorbs what this "
                "write may still commit; find what holds the sink's target (a lock, a "
                "stalled connection)",
                self.pipeline, write.key[1], write.sink, write.timeout_s, since,
                extra=fields,
            )  # fmt: skip
        return running
