"""fanout-delta: the built-in Delta Lake sink of fanout.

Registered under the ``fanout`` entry-point group as sink type ``delta``::

    {"type": "delta", "name": "events", "path": "/data/events", "mode": "append"}

Appends or upserts each micro-batch exactly once, using Delta's idempotent-write
transactions ``(fanout/<pipeline>/<sink>, batch_id)``, through delta-rs (engine ``rs``, the
default) or delta-spark (engine ``spark``). See :class:`DeltaSink` for the options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fanout_delta.fence import EpochFencedError

if TYPE_CHECKING:
    from fanout_delta.sink import DeltaSink

_LAZY = {
    "DeltaSink": "fanout_delta.sink",
}
"""Names imported on first use (PEP 562): importing the package, as the plugin's entry point
does, must not import the sink's driver libraries; a command using no such sink never does."""


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY``, imported from its module when first asked for."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DeltaSink", "EpochFencedError"]
