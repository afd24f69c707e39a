#!/usr/bin/env python
"""Spark's own micro-batch loop: what a streaming query's driver does for every micro-batch
besides calling its foreachBatch function, measured with a function that does nothing.

    python bench/bench_spark_loop.py [--batches 200] [--master local[2]] [--workdir DIR] [--keep]

A file source reads one small file per micro-batch (``maxFilesPerTrigger=1``, the schema of
the other benchmarks, 100 rows a file); the function returns at once, so no task ever
runs. Everything between two calls of the function is Spark's: the commit of the last
batch, its progress report, the next batch's offsets, its plan, and ``foreachBatch``'s own
preparation of the DataFrame it hands over. Every micro-batch of every ``foreachBatch``
query pays it, fanout's or not, on the driver's one query thread, with no task running:
on a machine of few cores, it is time the cores idle whatever the function does.

Printed, over the batches after the first fifth (the JIT's warm-up):

- the time between two calls of the function (median and p90);
- Spark's ``durationMs`` parts of a batch (medians, from ``recentProgress``);
- the CPU ms a batch of the driver JVM's threads, by kind (``/proc``, Linux).

The last line is machine-readable::

    loop_ms=<median between calls> query_thread_cpu_ms=<a batch> jit_cpu_ms=<a batch>
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import generate_input, run_with_workdir, start_query
from proc_cpu import children_of, proc_table, spark_jvms, thread_cpu_by_kind
from three_report import percentile

from fanout.spark import local_session

ROWS_PER_FILE = 100
WARM_UP_SHARE = 0.2  # the first fifth of the batches is left out: the JIT still compiles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200, help="micro-batches (input files)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", help="input and checkpoint go here (default: a new /tmp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the input and checkpoint")
    args = parser.parse_args(argv)
    if args.batches < 10:
        parser.error("--batches: at least 10")
    return run_with_workdir(args, "fanout-spark-loop-", _bench)


def _bench(args: argparse.Namespace, workdir: Path) -> int:
    source = workdir / "input"
    generate_input(source, args.batches * ROWS_PER_FILE, args.batches)
    spark = local_session("fanout-bench-spark-loop", master=args.master)
    table = proc_table()
    jvm = spark_jvms(table, children_of(table))[0]
    first = int(args.batches * WARM_UP_SHARE)
    calls: list[float] = []
    cpu: dict[int, Mapping[str, float]] = {}

    def nothing(_df: Any, batch_id: int) -> None:
        calls.append(time.perf_counter())
        if batch_id in (first, args.batches - 1):
            cpu[batch_id] = thread_cpu_by_kind(jvm)

    query = start_query(spark, source, nothing, workdir / "checkpoint")
    query.awaitTermination()
    if len(calls) != args.batches or len(cpu) != 2:
        print(f"expected {args.batches} batches, the function ran {len(calls)} times")
        return 1
    gaps = [1000 * (b - a) for a, b in zip(calls[first:], calls[first + 1 :], strict=False)]
    counted = args.batches - 1 - first
    per_batch = {
        kind: 1000 * (cpu[args.batches - 1].get(kind, 0.0) - seconds) / counted
        for kind, seconds in cpu[first].items()
    }
    parts = _duration_medians(query.recentProgress, first)
    spark.stop()

    print(
        f"spark {spark.version} {args.master}: {args.batches} micro-batches of "
        f"{ROWS_PER_FILE} rows, a foreachBatch function that returns at once; the last "
        f"{counted} counted"
    )
    print(
        f"time between two calls of the function: median {statistics.median(gaps):.1f} ms, "
        f"p90 {percentile(gaps, 0.9):.1f} ms"
    )
    print("Spark's durationMs parts of a batch (medians, ms):")
    for name, value in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:18} {value:6.1f}")
    print("CPU of the driver JVM's threads, ms a batch (/proc):")
    for kind, ms in sorted(per_batch.items(), key=lambda kv: -kv[1]):
        if ms >= 0.05:
            print(f"  {kind:30} {ms:6.1f}")
    print(
        f"loop_ms={statistics.median(gaps):.1f} "
        f"query_thread_cpu_ms={per_batch.get('query thread', 0.0):.1f} "
        f"jit_cpu_ms={per_batch.get('JIT compiler', 0.0):.1f}"
    )
    return 0


def _duration_medians(progress: list[Any], first: int) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for report in progress:
        if report["batchId"] < first:  # (no row is read: numInputRows is 0 throughout)
            continue
        for name, ms in report["durationMs"].items():
            values.setdefault(name, []).append(float(ms))
    return {name: statistics.median(ms) for name, ms in values.items()}


if __name__ == "__main__":
    sys.exit(main())
