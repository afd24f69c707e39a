"""The pluggy plugin module registered under the ``fanout`` entry-point group."""

from __future__ import annotations

from fanout.contract.sink import Sink
from fanout.hooks.specs import hookimpl


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """Provide the ``delta`` sink type (:class:`fanout_delta.DeltaSink`)."""
    from fanout_delta.sink import DeltaSink

    return {"delta": DeltaSink}
