"""The pluggy plugin module registered under the ``fanout`` entry-point group."""

from __future__ import annotations

from fanout.contract.sink import Sink
from fanout.hooks.specs import hookimpl


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink] | str]:
    """Provide the ``delta`` sink type (:class:`fanout_delta.DeltaSink`), as a lazy
    reference: its module (delta-rs, pyarrow) is imported only when a Delta sink is used."""
    return {"delta": "fanout_delta.sink:DeltaSink"}
