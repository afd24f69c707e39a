"""Which writer writes a Delta sink's batch: the engine (``rs``, delta-rs, or ``spark``,
delta-spark; ``auto`` resolved at the sink's open), and for an ``rs`` append whether the
executors write it or the driver (``write_from``, docs/architecture.md §8.1); and the
write through it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from fanout.contract.locations import local_path
from fanout_delta.option_values import config_error

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.sink import SinkResult
    from fanout_delta.target import DeltaTarget

# The sink's logger: its records keep the name users' logging settings give.
logger = logging.getLogger("fanout_delta.sink")


def resolve_engine(sink: str, engine: str, spark: Any) -> Literal["rs", "spark"]:
    """``engine`` with ``"auto"`` decided: ``spark`` when the Delta JVM classes load in
    ``spark``, else ``rs``; ``"spark"`` without them is refused."""
    if engine == "rs":
        return "rs"
    from fanout_delta.spark_engine import delta_jvm_missing

    missing = delta_jvm_missing(spark)
    if missing is None:
        return "spark"
    if engine == "auto":
        logger.info("sink %r: engine auto uses delta-rs: %s", sink, missing)
        return "rs"
    raise config_error(
        sink,
        f"engine 'spark' cannot be used: {missing}. Use engine 'rs' (delta-rs, no jars) or 'auto'",
    )


def resolve_write_from(
    sink: str, write_from: str, path: str | None, spark: Any
) -> Literal["executors", "driver"]:
    """``write_from`` with ``"auto"`` decided (docs/architecture.md §8.1): the driver
    on a ``local[...]`` master or without a session to ask; the executors for a table
    on an object store, or on ``local-cluster`` (one host); the driver for a local
    path on any other cluster, whose executors may run where that path is not."""
    if write_from == "executors":
        return "executors"
    if write_from == "driver" or spark is None:
        return "driver"
    from fanout.contract.sessions import single_machine, spark_master

    if single_machine(spark):
        return "driver"
    if on_object_store(path) or (spark_master(spark) or "").startswith("local-cluster"):
        return "executors"
    logger.info(
        "sink %r: writing from the driver: %s is a local path and the executors may run "
        "on other hosts; set write_from='executors' if every executor mounts it",
        sink, path,
    )  # fmt: skip
    return "driver"


def executors_reach_the_table(write_from: str | None, spark: Any) -> bool:
    """Whether Spark's executors can write the table: they were chosen to
    (``write_from``, resolved), or they run on the driver's machine."""
    if write_from == "executors":
        return True
    if spark is None:
        return False
    from fanout.contract.sessions import single_machine

    return bool(single_machine(spark))


def on_object_store(path: str | None) -> bool:
    """Whether ``path`` is an object-store URI (``s3://``, ``abfss://``...), which every
    executor reaches, rather than a path on a filesystem (``/data``, ``file:///data``)."""
    return path is not None and local_path(path) is None


def write_batch(target: DeltaTarget, batch: Batch, engine: str, from_executors: bool) -> SinkResult:
    """Append or merge ``batch`` into ``target`` with ``engine``: delta-spark, or
    delta-rs from the executors (``from_executors``, an append; a table or batch their
    writer cannot take is written from the driver) or from the driver."""
    if engine == "spark":
        from fanout_delta.spark_engine import write_spark

        return write_spark(target, batch)
    from fanout_delta.rs_engine import write_rs

    done = None
    if from_executors:
        from fanout_delta.rs_executors import append_from_executors

        done = append_from_executors(target, batch)
    return done if done is not None else write_rs(target, batch)
