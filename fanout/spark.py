"""A local SparkSession set up the way fanout's tests, demo and benchmarks need it."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any


def local_session(
    app_name: str = "fanout",
    *,
    master: str | None = "local[2]",
    conf: Mapping[str, str] | None = None,
) -> Any:
    """Start (or return) a local SparkSession.

    Executors start ``python3`` from PATH unless told otherwise, which misses the
    virtualenv's packages; this points them at the running interpreter. The FAIR scheduler
    lets the Spark jobs of sinks written in parallel share the cores.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local session needs no LAN
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder if master is None else SparkSession.builder.master(master)
    builder = (
        builder.appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
