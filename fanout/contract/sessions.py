"""Which kind of Spark session a DataFrame or session belongs to: classic (a JVM behind a
py4j gateway in this process) or Spark Connect (a gRPC client; the JVM is elsewhere).

Under Spark Connect there is no ``sparkContext``, no ``_jvm`` and no ``_jdf``: fanout reads
what it would read from the JVM from files (the checkpoint) or from plan text instead
(docs/architecture.md §15).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]")
"""A ``local-cluster[N,cores,memMB]`` master: ``N`` executor JVMs of ``cores`` cores."""


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a SparkSession or a DataFrame) is a Spark Connect one."""
    module = type(obj).__module__ or ""
    return module.startswith("pyspark.sql.connect.")


def is_classic(df: Any) -> bool:
    """Whether ``df`` is a classic DataFrame, with its JVM object here (not Spark Connect,
    nor anything else DataFrame-like)."""
    return not is_connect(df) and hasattr(df, "_jdf")


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


ADAPTIVE = "spark.sql.adaptive.enabled"

_SETTINGS = threading.Lock()


@contextmanager
def session_settings(conf: Any, settings: Mapping[str, str]) -> Iterator[None]:
    """Set these session options for the block, then restore what the session had
    (unsetting an option it had not set). Spark reads them when it plans, so a block
    planning a query sees them; fanout's threads (the sinks' writes, the catch-up) take
    turns, so none restores another's setting as the session's own. A query planned
    meanwhile by a thread of the application's may see them too."""
    with _SETTINGS:
        before = {key: conf.get(key, None) for key in settings}
        for key, value in settings.items():
            conf.set(key, value)
        try:
            yield
        finally:
            for key, value in before.items():
                if value is None:
                    conf.unset(key)
                else:
                    conf.set(key, value)


def plan_without_adaptive(df: Any) -> None:
    """Plan ``df`` now, without adaptive execution; its next action runs that plan.

    For a job whose partitions are fixed (a sink's ``repartition`` into its partitions,
    then one task per partition), adaptive execution has nothing to adapt and costs
    ~30 ms a job: a query stage per shuffle, planned again after each (a small batch's
    Kafka write took ~155 ms of Spark time with it, ~125 without). Under Spark Connect,
    and for anything but a classic DataFrame, nothing happens.
    """
    if not is_classic(df):
        return
    with session_settings(df.sparkSession.conf, {ADAPTIVE: "false"}):
        df._jdf.queryExecution().executedPlan()


def in_spark_thread(fn: Any, df: Any) -> Any:
    """Wrap ``fn`` so Spark jobs it starts inherit this thread's local properties (job
    group, streaming query id), as jobs started by foreachBatch itself do."""
    return spark_threads(df)(fn)


ThreadWrapper = Callable[[Callable[..., Any]], Callable[..., Any]]
"""Wraps a function to run in another thread (:func:`spark_threads`)."""


def spark_threads(df: Any) -> ThreadWrapper:
    """A wrapper for any number of functions, each to run in a thread of its own, so that
    the Spark jobs they start inherit this thread's local properties (job group,
    streaming query id) and the session's tags, as jobs started by foreachBatch itself do.
    They are captured once, now (a handful of py4j calls, ~1-2 ms before a batch's first
    job each time on two busy cores), for every function wrapped with it; each thread then
    runs with its own copy of them.

    pyspark's wrapper hands every function it wraps the very JVM ``Properties`` it
    captured, so threads wrapped by one capture would share one: a property one thread set
    (the task a shared job carries, :mod:`fanout.partitioned.shared_udf`) would reach the
    jobs another thread starts. Each call therefore replaces it with a clone first (one
    py4j call)."""
    session = getattr(df, "sparkSession", None)
    if session is None:
        return _unwrapped
    from pyspark.util import inheritable_thread_target

    inherit = inheritable_thread_target(session)
    if not is_classic(df):  # Spark Connect: no JVM properties here
        return inherit  # type: ignore[no-any-return]
    context = session.sparkContext

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def with_own_properties(*args: Any, **kwargs: Any) -> Any:
            own_local_properties(context)
            return fn(*args, **kwargs)

        return inherit(with_own_properties)  # type: ignore[no-any-return]

    return wrap


def own_local_properties(context: Any) -> None:
    """Give this thread its own copy of the Spark local properties it has now, so that what
    it sets reaches only the jobs it starts (a no-op where there are none to copy)."""
    jvm_context = context._jsc.sc()
    properties = jvm_context.getLocalProperties()
    if properties is not None:
        jvm_context.setLocalProperties(properties.clone())


def _unwrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


_RESULT_TYPES = {"INT": "IntegerType", "STRING": "StringType"}


@functools.cache
def result_schema(ddl: str) -> Any:
    """A ``mapInArrow`` result schema in DDL (``name TYPE, ...`` of ``INT`` and ``STRING``)
    as a ``StructType`` built in Python: given the text, pyspark parses it in the JVM, a
    few py4j round trips (~3 ms) before every job."""
    from pyspark.sql import types

    fields = []
    for field in ddl.split(","):
        name, kind = field.split()
        fields.append(types.StructField(name, getattr(types, _RESULT_TYPES[kind.upper()])()))
    return types.StructType(fields)
