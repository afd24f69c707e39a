"""The catch-up's registries in this process: the one writer of each sink (:class:`SinkWriter`,
one per pipeline, ledger and sink) and the one catch-up of each pipeline and ledger
(:func:`replace_current`), shared by every :class:`fanout.steps.catchup.CatchUp` of the
pipeline (docs/architecture.md §14.4, "One writer of a sink per process").

``_current_lock`` guards both, and the catch-up's own once-said sets.
"""

from __future__ import annotations

import threading
import weakref
from typing import TypeVar, cast

from fanout.spool.index import BatchKey

Current = TypeVar("Current")

_current: weakref.WeakValueDictionary[tuple[str, str], object] = weakref.WeakValueDictionary()
"""The catch-up of each pipeline and ledger in this process (:func:`replace_current`)."""
_current_lock = threading.Lock()


def replace_current(pipeline: str, ledger: str, catchup: Current) -> Current | None:
    """Make ``catchup`` the process's catch-up of ``pipeline`` with the ledger ``ledger``
    (:func:`fanout.ledger.entry.ledger_key`); the one it replaces, if any
    (:meth:`fanout.steps.catchup.CatchUp.take_over`)."""
    with _current_lock:
        previous = _current.get((pipeline, ledger))
        _current[(pipeline, ledger)] = catchup
    return cast("Current | None", previous)


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
    with _current_lock:
        writer = _writers.get((pipeline, ledger, sink))
        if writer is None:
            writer = _writers[(pipeline, ledger, sink)] = SinkWriter()
        return writer
