"""fanout-sample: a small third-party fanout plugin, used by fanout's own tests.

It shows the whole shape of a plugin distribution: a ``Sink`` subclass, a module with a
``fanout_sink_types`` hook implementation, and an entry point in the ``fanout`` group.
"""

from fanout_sample.plugin import JsonLinesSink

__all__ = ["JsonLinesSink"]
