"""A Spark session that reports another master: the Delta sink's ``write_from="auto"``
decides from ``spark.master``, and the tests try every kind of master on one session."""

from __future__ import annotations

from typing import Any


class SessionOnMaster:
    """A session wrapper that reports ``master`` as ``spark.master`` (everything else is
    the wrapped session's)."""

    def __init__(self, spark: Any, master: str | None) -> None:
        self._spark, self.master = spark, master
        self.conf = self

    def get(self, key: str, default: Any = None) -> Any:
        """``spark.conf.get``: the reported master, or the wrapped session's value."""
        return self.master if key == "spark.master" else self._spark.conf.get(key, default)
