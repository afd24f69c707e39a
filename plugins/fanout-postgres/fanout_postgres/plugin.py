"""The pluggy plugin module registered under the ``fanout`` entry-point group."""

from __future__ import annotations

from fanout.contract.sink import Sink
from fanout.hooks.specs import hookimpl
from fanout_postgres.sink import PostgresSink


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """Provide the ``postgres`` sink type (:class:`fanout_postgres.PostgresSink`)."""
    return {"postgres": PostgresSink}
