"""PostgreSQL sink for fanout: upsert or exactly-once append, written from the executors.

- :class:`PostgresSink`: the ``postgres`` sink type (see the package README for options).
- :class:`EmbeddedPostgres`: a throw-away real server for tests and demos (extra
  ``fanout-postgres[embedded]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fanout.contract.lazy import lazy_names

if TYPE_CHECKING:
    from fanout_postgres.embedded import EmbeddedPostgres
    from fanout_postgres.sink import PostgresSink

__getattr__ = lazy_names(
    __name__,
    {
        "EmbeddedPostgres": "fanout_postgres.embedded",
        "PostgresSink": "fanout_postgres.sink",
    },
    globals(),
)
"""Imported on first use: importing the package, as the plugin's entry point does, must not
import the sink's driver libraries; a command using no such sink never does."""


__all__ = ["EmbeddedPostgres", "PostgresSink"]
