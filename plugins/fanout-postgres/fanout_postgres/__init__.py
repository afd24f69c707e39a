"""PostgreSQL sink for fanout: upsert or exactly-once append, written from the executors.

- :class:`PostgresSink`: the ``postgres`` sink type (see the package README for options).
- :class:`EmbeddedPostgres`: a throw-away real server for tests and demos (extra
  ``fanout-postgres[embedded]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fanout_postgres.embedded import EmbeddedPostgres
    from fanout_postgres.sink import PostgresSink

_LAZY = {
    "EmbeddedPostgres": "fanout_postgres.embedded",
    "PostgresSink": "fanout_postgres.sink",
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


__all__ = ["EmbeddedPostgres", "PostgresSink"]
