"""Which kind of Spark session a DataFrame or session belongs to: classic (a JVM behind a
py4j gateway in this process) or Spark Connect (a gRPC client; the JVM is elsewhere).

Under Spark Connect there is no ``sparkContext``, no ``_jvm`` and no ``_jdf``: fanout reads
what it would read from the JVM from files (the checkpoint) or from plan text instead
(docs/architecture.md §15).
"""

from __future__ import annotations

from typing import Any


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a SparkSession or a DataFrame) is a Spark Connect one."""
    module = type(obj).__module__ or ""
    return module.startswith("pyspark.sql.connect.")


def session_of(df: Any) -> Any:
    """The SparkSession a DataFrame belongs to (``None`` for anything else)."""
    return getattr(df, "sparkSession", None)


def spark_master(spark: Any) -> str | None:
    """``spark.master`` of a session, ``None`` when it cannot tell (no session, or a
    Connect server that does not show it)."""
    if spark is None:
        return None
    try:
        master = spark.conf.get("spark.master", None)
    except Exception:  # a Connect server may refuse to show a static setting
        return None
    return str(master) if master else None


def single_machine(spark: Any) -> bool | None:
    """Whether ``spark``'s tasks run inside the driver's JVM, on the driver's cores
    (master ``local`` or ``local[...]``; ``local-cluster`` has executor processes):
    ``None`` when it cannot tell."""
    master = spark_master(spark)
    if master is None:
        return None
    return master == "local" or master.startswith("local[")
