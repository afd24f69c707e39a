"""A stop asked of a :class:`fanout.fan_out.FanOut` beside a Spark Connect server from its
client (docs/architecture.md §15), and the refusal of a batch handed to one built from its
pickle that a failed batch closed."""

from __future__ import annotations

import time
from typing import Any

from fanout.errors import ConfigurationError, FanoutError
from fanout.steps.stop_gate import client_stop_key


def ask_server_to_stop(pipeline: str, query: Any) -> None:
    """Ask the ``FanOut`` of ``pipeline`` beside the Spark Connect server that runs
    ``query`` to refuse the batches Spark begins from now on, through a session option of
    the query's session (``fanout.stop.<pipeline>`` = the query's run id). Raises
    :class:`fanout.ConfigurationError` without ``query``, and when the option cannot be set
    (the query shows no session, or the server refuses the option), naming what to do
    instead."""
    if query is None:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: under Spark Connect the batches run in the "
            "FanOut beside the server, which this one's stop gate does not reach: pass "
            "the query, fan_out.request_stop(query), or stop it with "
            "fan_out.stop_query(query)"
        )
    key, run = client_stop_key(pipeline), str(query.runId)
    todo = (
        f"set it on the session that started the query, spark.conf.set({key!r}, "
        f"{run!r}), or stop the query with query.stop() (the batch in flight is then "
        "cut short and redone at the next start)"
    )
    session = getattr(query, "_session", None)  # the session that started the query
    if session is None:  # pyspark 4.2's Connect StreamingQuery keeps it there (private)
        raise ConfigurationError(
            f"pipeline {pipeline!r}: cannot reach the session of Spark Connect "
            f"query {query.id} (this pyspark's StreamingQuery has no _session) to ask "
            f"the FanOut beside the server to stop: {todo}"
        )
    try:
        session.conf.set(key, run)
    except Exception as exc:  # a server that allows only some options to be set
        raise ConfigurationError(
            f"pipeline {pipeline!r}: the Spark Connect session of query "
            f"{query.id} refused the option {key!r} through which the FanOut beside "
            f"the server is asked to stop ({type(exc).__name__}); {todo}"
        ) from exc


def trigger_ended(query: Any, started: float, timeout_s: float) -> bool:
    """Wait until the Spark Connect ``query`` is inactive or its trigger is (the batch
    that entered before the stop request has ended); ``False`` when ``timeout_s`` since
    ``started`` (``time.monotonic()``) passed first."""

    def idle() -> bool:
        return not query.isActive or not query.status["isTriggerActive"]

    while not idle():
        if time.monotonic() - started >= timeout_s:
            return False
        time.sleep(0.2)
    return True


def closed_here(pipeline: str, batch_id: int, failed: int) -> FanoutError:
    """The refusal of batch ``batch_id`` handed to a ``FanOut`` built from its pickle that
    the failure of batch ``failed`` closed (a runtime retrying the function in the same
    process): its sinks are closed and released, its catch-up stopped; only a new one,
    built by the query's restart, may write."""
    return FanoutError(
        f"pipeline {pipeline!r}, batch {batch_id}: refused, this FanOut (built from "
        f"its pickle, as under Spark Connect) was closed when batch {failed} failed, its "
        f"sinks with it; nothing of batch {batch_id} was written. Restart the query: the "
        f"restart builds a new FanOut from the pickle and runs batch {failed} again"
    )
