"""fanout-delta: the built-in Delta Lake sink of fanout.

Registered under the ``fanout`` entry-point group as sink type ``delta``::

    {"type": "delta", "name": "events", "path": "/data/events", "mode": "append"}

Appends or upserts each micro-batch exactly once, using Delta's idempotent-write
transactions ``(fanout/<pipeline>/<sink>, batch_id)``, through delta-rs (engine ``rs``, the
default) or delta-spark (engine ``spark``). See :class:`DeltaSink` for the options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fanout.contract.lazy import lazy_names
from fanout_delta.fence import EpochFencedError

if TYPE_CHECKING:
    from fanout_delta.sink import DeltaSink

__getattr__ = lazy_names(
    __name__,
    {
        "DeltaSink": "fanout_delta.sink",
    },
    globals(),
)
"""Imported on first use: importing the package, as the plugin's entry point does, must not
import the sink's driver libraries; a command using no such sink never does."""


__all__ = ["DeltaSink", "EpochFencedError"]
