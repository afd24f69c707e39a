"""PostgreSQL sink for fanout: upsert or exactly-once append, written from the executors.

- :class:`PostgresSink`: the ``postgres`` sink type (see the package README for options).
- :class:`EmbeddedPostgres`: a throw-away real server for tests and demos (extra
  ``fanout-postgres[embedded]``).
"""

from __future__ import annotations

from fanout_postgres.embedded import EmbeddedPostgres
from fanout_postgres.sink import PostgresSink

__all__ = ["EmbeddedPostgres", "PostgresSink"]
