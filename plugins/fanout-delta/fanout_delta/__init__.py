"""fanout-delta: the built-in Delta Lake sink of fanout.

Registered under the ``fanout`` entry-point group as sink type ``delta``::

    {"type": "delta", "name": "events", "path": "/data/events", "mode": "append"}

Appends or upserts each micro-batch exactly once, using Delta's idempotent-write
transactions ``(fanout/<pipeline>/<sink>, batch_id)``, through delta-rs (engine ``rs``, the
default) or delta-spark (engine ``spark``). See :class:`DeltaSink` for the options.
"""

from __future__ import annotations

from fanout_delta.fence import EpochFencedError
from fanout_delta.sink import DeltaSink

__all__ = ["DeltaSink", "EpochFencedError"]
