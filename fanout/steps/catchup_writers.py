"""The one writer of each sink's catch-up in this process (:class:`SinkWriter`, one per
pipeline, ledger and sink), shared by every :class:`fanout.steps.catchup.CatchUp` of the
pipeline (docs/architecture.md §14.4, "One writer of a sink per process").

:data:`registry_lock` guards it, the catch-up's registry of the process's catch-ups
(``fanout.steps.catchup._current``) and the catch-up's own once-said sets.
"""

from __future__ import annotations

import threading
import weakref

from fanout.spool.index import BatchKey

registry_lock = threading.Lock()
"""Guards :data:`_writers`, the registry of catch-ups and the catch-ups' once-said sets."""


class SinkWriter:
    """The one writer of a sink's catch-up in this process, for a pipeline and ledger: every
    :class:`fanout.steps.catchup.CatchUp` of the pipeline (an earlier ``FanOut``'s thread
    still in a write its ``stop()`` did not wait out, a restarted query's, a notebook's
    re-run cell's) takes ``lock`` to write the sink, so two writes of one batch never run at
    once (a sink that checks "already written?" and then writes is not safe with them:
    docs/architecture.md §14.4, "One writer of a sink per process"). ``writing``: the batch
    being written now, since ``since`` (``time.monotonic()``); ``last``: the catch-up that
    wrote the sink last (another's marks are read again)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writing: BatchKey | None = None
        self.since = 0.0
        self.last: object | None = None


_writers: weakref.WeakValueDictionary[tuple[str, str, str], SinkWriter] = (
    weakref.WeakValueDictionary()
)
"""Held weakly: every :class:`fanout.steps.catchup.CatchUp` of the sink holds its writer, and
a write holding the lock runs in one of them (its thread's, or a drain's caller's), so an
entry goes only once no catch-up could write the sink (a long-lived process creating
pipelines by generated names would otherwise keep one per sink it ever caught up)."""


def sink_writer(pipeline: str, ledger: str, sink: str) -> SinkWriter:
    """The process's :class:`SinkWriter` of ``sink`` in ``pipeline`` with the ledger
    ``ledger`` (:func:`fanout.ledger.entry.ledger_key`: one ledger however spelled), while
    a :class:`fanout.steps.catchup.CatchUp` holds it (:data:`_writers`)."""
    with registry_lock:
        writer = _writers.get((pipeline, ledger, sink))
        if writer is None:
            writer = _writers[(pipeline, ledger, sink)] = SinkWriter()
        return writer
