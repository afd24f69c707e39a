"""A local SparkSession set up the way fanout's tests, demo and benchmarks need it."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from fanout.contract.sessions import LOCAL_CLUSTER


def cluster_master(executors: int = 2, cores: int = 1, memory_mb: int = 1024) -> str:
    """A ``local-cluster[N,cores,memMB]`` master: ``executors`` executor JVMs (other
    processes than the driver, each with its own Python workers), started by an in-driver
    standalone master and workers."""
    return f"local-cluster[{executors},{cores},{memory_mb}]"


def cluster_conf(master: str) -> dict[str, str]:
    """What a ``local-cluster`` master needs beyond a ``local[N]`` one (empty for others).

    - ``spark.executor.memory`` = the workers' memory (Spark's default, 1g, would never be
      granted by a smaller worker: the application would wait for executors forever);
    - ``spark.task.maxFailures`` = 4, said explicitly (it is the default on a cluster,
      1 on ``local[N]``): a task whose executor died is retried on another one (or on a
      new one: the in-driver worker relaunches a dead executor);
    - ``spark.deploy.maxExecutorRetries`` high, so the application survives many executor
      deaths (chaos runs kill executors again and again).
    """
    found = LOCAL_CLUSTER.fullmatch(master.strip())
    if found is None:
        return {}
    return {
        "spark.executor.memory": f"{found.group(3)}m",
        "spark.task.maxFailures": "4",
        "spark.deploy.maxExecutorRetries": "100",
    }


ARROW_MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
# Spark 4 measures the Arrow batch it sends a Python task after every row it adds, unless
# the limit is INT_MAX: the row count (maxRecordsPerBatch, 10,000) still bounds a batch.
ARROW_UNCHECKED_BATCH_BYTES = 2**31 - 1
# The throughput collector: G1's concurrent marking took 1-1.4 of the JVM's ~9 CPU s in
# bench/bench_three_sinks.py's fan-out, the parallel collector ~0.15, with short pauses
# on a local session's small heap.
JVM_GC = "-XX:+UseParallelGC"
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
# Spark's default manager for a local checkpoint (FileContext over Hadoop's LocalFs) renames
# every log file through getFileLinkStatus, which, without Hadoop's native library (none
# ships with pyspark), forks `readlink` eight times per rename: ~24 processes and ~55 ms of
# every micro-batch. The FileSystem-based manager renames with one rename(2), as atomic on
# a local disk. It still forks `chmod` twice per log file written (~6 per batch).
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
LOCAL_FILE_SYSTEM = "spark.hadoop.fs.file.impl"
# Hadoop's local file system, without its native library, also forks a `chmod` process for
# every file it creates, and one more for the file's checksum file: six a micro-batch for
# the three log files of a file source's checkpoint (sources, offsets, commits), ~4-5 ms each
# on the query's one thread, ~30 ms of every micro-batch. fanout's subclass sets the same bits
# through java.nio (fanout/jvm/NioRawLocalFileSystem.java).
NIO_LOCAL_FILE_SYSTEM = "fanout.hadoop.NioLocalFileSystem"
CLASS_PATHS = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")


def local_file_system_conf() -> dict[str, str]:
    """The settings that serve ``file:`` paths with fanout's :data:`NIO_LOCAL_FILE_SYSTEM`
    (Hadoop's local file system, setting permissions without forking ``chmod``) and put its
    classes on the driver's and executors' class path; empty when the classes cannot be
    compiled here (:func:`fanout.jvm.classes.classes_jar`) or a SparkContext already
    runs in this process (its JVM's class path is fixed: the setting would name a class it
    cannot load). For a session of your own, add them to its builder before it starts."""
    from fanout.jvm.classes import classes_jar

    try:
        from pyspark import SparkContext
    except ImportError:
        return {}
    if SparkContext._active_spark_context is not None:
        return {}
    classes = classes_jar()
    if classes is None:
        return {}
    return {LOCAL_FILE_SYSTEM: NIO_LOCAL_FILE_SYSTEM, **dict.fromkeys(CLASS_PATHS, str(classes))}


def master_settings(master: str | None) -> dict[str, str]:
    """What :func:`local_session` adds for ``master``: :func:`cluster_conf`, and for a master
    whose executors run on this machine (``local``, ``local[N]``, ``local-cluster[...]``)
    :func:`local_file_system_conf`. Other masters' executors would not find its classes."""
    settings = cluster_conf(master or "")
    if master is not None and master.strip().startswith("local"):
        settings.update(local_file_system_conf())
    return settings


def _merged(settings: Mapping[str, str], conf: Mapping[str, str]) -> dict[str, str]:
    """``settings`` overridden by the caller's ``conf``, except class paths, which join."""
    merged = dict(settings)
    for key, value in conf.items():
        if key in CLASS_PATHS and key in merged:
            merged[key] = f"{value}{os.pathsep}{merged[key]}"
        else:
            merged[key] = value
    return merged


def local_session(
    app_name: str = "fanout",
    *,
    master: str | None = "local[2]",
    conf: Mapping[str, str] | None = None,
) -> Any:
    """Start (or return) a local SparkSession.

    Executors start ``python3`` from PATH unless told otherwise, which misses the
    virtualenv's packages; this points them at the running interpreter. The FAIR scheduler
    lets the Spark jobs of sinks written in parallel share the cores. Three settings save
    CPU and time on a small machine: the JVMs use the parallel garbage collector, Arrow
    batches sent to Python tasks are bounded by their row count only (Spark 4 otherwise
    measures the batch after every row it adds, ~10% of the JVM's CPU in a fan-out), and
    checkpoint files are renamed through Hadoop's FileSystem API (its FileContext API forks
    ``readlink`` ~24 times a micro-batch on a local disk: ~55 ms a batch). Local files are
    served by fanout's :data:`NIO_LOCAL_FILE_SYSTEM` (:func:`local_file_system_conf`), which
    sets their permissions without forking ``chmod``: ~30 ms of every micro-batch whose
    checkpoint is on a local disk (local masters only: :func:`master_settings`).

    ``master`` may be a ``local-cluster[N,cores,memMB]`` (:func:`cluster_master`): the
    executors are then separate JVMs, children of the driver's JVM, which inherit this
    process's environment (``PYSPARK_PYTHON``, ``PYTHONPATH``), and :func:`cluster_conf` is
    added. The executors' logs are where Spark's in-driver workers put them,
    ``<SPARK_HOME>/work/app-*/<executor>/stderr`` (the pyspark package's directory).

    The session has no Delta jars (the Delta sink's default engine, delta-rs, needs none):
    read a Delta table back with ``deltalake.DeltaTable(path).to_pyarrow_table()``, not
    ``spark.read.format("delta")`` (``DATA_SOURCE_NOT_FOUND``).

    Only one session per process: start a cluster session in a process of its own (the
    chaos drivers do).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local session needs no LAN
    extra = master_settings(master)
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
        .config(ARROW_MAX_BYTES_PER_BATCH, str(ARROW_UNCHECKED_BATCH_BYTES))
        .config(CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.level=WARN {JVM_GC}")
        .config("spark.executor.extraJavaOptions", JVM_GC)
    )
    for key, value in _merged(extra, conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
