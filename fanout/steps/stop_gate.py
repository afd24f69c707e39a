"""The gate a batch passes as it enters the foreachBatch call, closed by a stop request.

``fanout run`` stops a query on SIGINT/SIGTERM with Spark's ``query.stop()``, which
interrupts the query's thread and cancels its jobs: a batch Spark began in the meantime
(the source has a backlog: the next batch starts as soon as one ends) would fail in the
middle, and the run read as failed. So the stop first closes the gate
(:meth:`StopGate.close`): a batch already inside the call is waited for like any batch in
flight, and one Spark begins afterwards is refused at its entry with
:class:`fanout.StopRequestedError` before fanout does anything of it (never returned from
without writing: Spark would commit it, its rows lost). Spark does not commit a batch that
raised, so it runs at the next start. The cost of a batch: one uncontended lock taken at
its entry and at its end.

Under Spark Connect the ``FanOut`` running the batches is the one built beside the server
from the pickled recipe (docs/architecture.md §15); the client's gate does not reach it. The
client's :meth:`fanout.FanOut.request_stop` then sets a session option of the query's own
session, ``fanout.stop.<pipeline>``, to the query's run id (:func:`client_stop_key`); the
server's ``FanOut`` is attached to that session, reads the option as each batch enters
(:func:`stop_asked_by_client`: one round trip to the server beside it, ~2 ms) and closes its
own gate when the option names the run of its query. A later start of the query is a new
run, which the option does not name.
"""

from __future__ import annotations

import threading
from typing import Any

from fanout.errors import StopRequestedError
from fanout.steps.context import checkpoint_query_id

CLIENT_STOP_PREFIX = "fanout.stop."


class StopGate:
    """Open until :meth:`close`; knows the batch inside the foreachBatch call (if any) and
    the batch it refused once closed."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self._changed = threading.Condition()
        self._closed = False
        self._inside: int | None = None
        self.refused: int | None = None
        """The first batch refused since the gate closed (``None``: none)."""

    @property
    def closed(self) -> bool:
        """Whether a stop was requested."""
        return self._closed

    @property
    def inside(self) -> int | None:
        """The batch inside the foreachBatch call now (``None``: none)."""
        return self._inside

    def enter(self, batch_id: int) -> None:
        """Batch ``batch_id`` enters the call; raises :class:`fanout.StopRequestedError`
        once the gate is closed, before anything of the batch is done."""
        with self._changed:
            if self._closed:
                if self.refused is None:
                    self.refused = int(batch_id)
                raise StopRequestedError(self.pipeline, int(batch_id))
            self._inside = int(batch_id)

    def leave(self) -> None:
        """The batch that entered left the call (committed, failed or refused later)."""
        with self._changed:
            self._inside = None
            self._changed.notify_all()

    def close(self) -> int | None:
        """Refuse every batch that enters from now on; the batch inside the call now, which
        goes on (``None``: none)."""
        with self._changed:
            self._closed = True
            return self._inside

    def wait_empty(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for no batch to be inside the call; whether none is."""
        with self._changed:
            return self._changed.wait_for(lambda: self._inside is None, max(timeout_s, 0.0))


def client_stop_key(pipeline: str) -> str:
    """The session option through which a Spark Connect client asks the ``FanOut`` beside
    the server to stop pipeline ``pipeline``: its value is the run id of the query to stop."""
    return CLIENT_STOP_PREFIX + pipeline


def stop_asked_by_client(
    batch_df: Any, pipeline: str, checkpoint_location: str | None, others: set[str]
) -> bool:
    """Under Spark Connect, whether the client asked (:func:`client_stop_key`) to stop the
    run of the query this batch belongs to (the query whose id the checkpoint records, in
    the batch's session). Reads one session option; the checkpoint's query id and the
    running queries only when it names a run not already found to be another one
    (``others``, which it adds to: an option left from a stop of an earlier run costs no
    more than an unset one)."""
    session = batch_df.sparkSession
    run = session.conf.get(client_stop_key(pipeline), None)
    if not run or run in others:
        return False
    query_id = None if checkpoint_location is None else checkpoint_query_id(checkpoint_location)
    if any(
        str(q.runId) == run and (query_id is None or str(q.id) == query_id)
        for q in session.streams.active
    ):
        return True
    others.add(run)
    return False
