"""The Delta sink's append from the executors against the driver-side path: the driver's
peak memory as batches grow, and throughput.

usage: python bench/bench_delta_distributed.py [--master local[2]]
           [--rss-master local-cluster[2,1,1024]] [--small 500000] [--large 5000000]
           [--throughput-rows 1000000] [--batches 2] [--workdir DIR] [--keep]

Every measurement runs in its own subprocess (one SparkSession each), so a peak RSS is
that run's alone: the driver's Python process and the driver's JVM (its child), each
read from ``/proc/<pid>/status`` ``VmHWM`` (the kernel's high-water mark of resident
memory) right before the session stops.

The driver's memory is measured on ``--rss-master`` (``local-cluster``: the executors are
separate JVMs and the driver JVM is the driver alone), and on ``--master`` beside it. On
``local[N]`` the driver JVM also runs the executors' tasks (JVM side), so its peak there
counts the tasks' garbage: G1 grows the heap it commits with their allocation rate, not
with what is live. Each ``local[N]`` run therefore logs the JVM's collections and prints
the largest heap left after a collection (what is live), beside its peak RSS.

Each run writes ``--batches`` batches of one size with the Delta sink (engine ``rs``,
mode ``append``) through ``DeltaSink.write`` (a batch is ``spark.range`` rows with the
columns of bench/common.py's ``SCHEMA``), ``write_from="executors"`` or ``"driver"``, and
verifies the table holds exactly the ids written, once each.

The throughput runs also time a ``mapInArrow`` job over the same batches whose tasks only
read their rows (write nothing, commit nothing): no executor-side writer can beat it, so
its ratio to the driver path bounds ``distributed_vs_driver`` on this master.

Last line: ``driver_rss_ratio=<executors 5M/0.5M, --rss-master>
driver_rss_ratio_driver_path=<same, driver path> driver_rss_ratio_local=<executors 5M/0.5M,
--master> distributed_vs_driver=<rows/s executors / rows/s driver, 1M-row batches,
--master> read_only_vs_driver=<rows/s of the read-only job / rows/s driver>
master=<master> rss_master=<rss master>``.
Targets: ``driver_rss_ratio <= 1.3``, ``distributed_vs_driver >= 1.0``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import BenchFailure, foreign_jvms, report_load, run_with_workdir, verify

COLUMNS = (
    "id AS order_id",
    "concat('cust_', lpad(CAST(id * 7919 % 50000 AS STRING), 5, '0')) AS customer",
    "CAST(id * 31 % 50000 AS DOUBLE) / 100 AS amount",
    "CAST(id % 19 + 1 AS INT) AS qty",
    "element_at(array('new','paid','shipped','delivered','cancelled','refunded'), "
    "CAST(id % 6 + 1 AS INT)) AS status",
    "timestamp_millis(1704067200000 + id * 37) AS ts",
)


def vm_hwm_kib(pid: int) -> int:
    """The peak resident set size of process ``pid`` (``VmHWM``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise BenchFailure(f"no VmHWM for process {pid}")


def driver_jvm_pid() -> int:
    """The Spark driver JVM: this process's ``java`` child (on ``local-cluster`` the
    executor JVMs are the driver JVM's descendants, not ours)."""
    import psutil

    javas = [p for p in psutil.Process().children(recursive=False) if p.name() == "java"]
    if len(javas) != 1:
        raise BenchFailure(f"expected one driver JVM child, found {[p.pid for p in javas]}")
    return int(javas[0].pid)


def child(args: argparse.Namespace) -> None:
    """One measured run: ``--batches`` batches of ``--rows`` rows, one ``write_from``."""
    from fanout_delta import DeltaSink

    from fanout.contract.batch import Batch, BatchInfo, txn_app_id
    from fanout.contract.sink import SinkContext
    from fanout.spark import JVM_GC, local_session

    conf = {"spark.driver.memory": args.driver_memory}
    if args.gc_log:
        gc_log = f"-Xlog:gc:file={args.gc_log}"
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.level=WARN {JVM_GC} {gc_log}"
    spark = local_session("bench-delta-distributed", master=args.master, conf=conf)
    partitions = max(2, spark.sparkContext.defaultParallelism)
    # "nothing": the executors' job without the writing (the warm-up writes from them)
    where = "executors" if args.write_from == "nothing" else args.write_from
    options: dict[str, Any] = {"write_from": where}
    if args.write_from == "merge":  # the merge's driver memory (--merge-rows)
        options = {"mode": "merge", "keys": ["order_id"], "max_merge_rows": None}
    warm = DeltaSink("warm", path=str(args.table) + "-warm", **options)
    warm.open(SinkContext(pipeline="bench"))
    sink = DeltaSink("lake", path=str(args.table), **options)
    sink.open(SinkContext(pipeline="bench"))

    def batch(sink_name: str, batch_id: int, start: int, rows: int) -> Batch:
        df = spark.range(start, start + rows, numPartitions=partitions).selectExpr(*COLUMNS)
        info = BatchInfo(pipeline="bench", batch_id=batch_id)
        return Batch(df, info, sink_name, txn_app_id("bench", sink_name))

    warm.write(batch("warm", 0, 0, 20_000))  # JIT, imports, Python workers
    if args.write_from == "nothing":  # the floor of any executor-side writer
        noop_job(batch("warm", 0, 0, 20_000).df)
        t0 = time.perf_counter()
        for b in range(args.batches):
            seen = noop_job(batch("lake", b, b * args.rows, args.rows).df)
            if seen != args.rows:
                raise BenchFailure(f"batch {b}: the tasks saw {seen} rows, expected {args.rows}")
        seconds = time.perf_counter() - t0
        report = {"python_kib": vm_hwm_kib(os.getpid()), "jvm_kib": vm_hwm_kib(driver_jvm_pid()),
                  "seconds": seconds}  # fmt: skip
        print("RESULT " + json.dumps(report), flush=True)
        spark.stop()
        return
    t0 = time.perf_counter()
    for b in range(args.batches):
        # a merge's second batch updates the second half of the first and inserts as many
        start = b * args.rows if args.write_from != "merge" else b * args.rows // 2
        result = sink.write(batch("lake", b, start, args.rows))
        if result.rows != args.rows:
            raise BenchFailure(f"batch {b}: wrote {result.rows} rows, expected {args.rows}")
    seconds = time.perf_counter() - t0
    jvm = driver_jvm_pid()
    report = {
        "python_kib": vm_hwm_kib(os.getpid()),
        "jvm_kib": vm_hwm_kib(jvm),
        "seconds": seconds,
    }
    spark.stop()
    total = (
        args.rows * args.batches
        if args.write_from != "merge"
        else (args.rows * (args.batches + 1)) // 2
    )
    verify([args.table], total, f"{args.write_from} {args.rows}")
    print("RESULT " + json.dumps(report), flush=True)


def _count_rows(batches: Any) -> Any:
    """A ``mapInArrow`` function that reads its task's rows and writes nothing."""
    import pyarrow as pa

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"file": [str(rows)]})


def noop_job(df: Any) -> int:
    """The Spark job of the executors' append without the writing: ``mapInArrow`` over
    the batch, each task reading its rows and yielding one row; returns the rows seen."""
    return sum(int(r[0]) for r in df.mapInArrow(_count_rows, "file string").collect())


def live_heap_mib(gc_log: Path) -> float | None:
    """The largest heap a young or full collection left (``Pause Young ... 569M->61M(850M)``:
    61), MiB: an upper bound of what was live."""
    after = [
        int(m.group(1))
        for m in re.finditer(r"Pause (?:Young|Full).*?->(\d+)M\(", gc_log.read_text())
    ]
    return float(max(after)) if after else None


def measure(
    args: argparse.Namespace,
    workdir: Path,
    write_from: str,
    rows: int,
    batches: int,
    master: str | None = None,
) -> dict[str, Any]:
    """Run :func:`child` in a subprocess on ``master`` (``--master`` by default); its
    peak RSS figures and write time (and on ``local[N]``, the live heap its GC log shows)."""
    master = master or args.master
    stamp = time.monotonic_ns()
    table = workdir / f"{write_from}-{rows}-{stamp}"
    command = [
        sys.executable, __file__, "--child", "--master", master,
        "--write-from", write_from, "--rows", str(rows), "--batches", str(batches),
        "--table", str(table), "--driver-memory", args.driver_memory,
    ]  # fmt: skip
    gc_log = workdir / f"gc-{stamp}.log"
    if master.startswith("local["):
        command += ["--gc-log", str(gc_log)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise BenchFailure(
            f"{write_from}, {rows} rows: exit {done.returncode}\n{done.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    result.update(write_from=write_from, rows=rows, batches=batches)
    result["rows_per_s"] = rows * batches / result["seconds"]
    mib = (result["python_kib"] + result["jvm_kib"]) / 1024
    live = live_heap_mib(gc_log) if gc_log.exists() else None
    heap = f"; JVM heap live after GC <= {live:,.0f} MiB" if live is not None else ""
    print(
        f"  {write_from:9s} {rows:>9,} rows x {batches}: {result['seconds']:7.2f} s "
        f"({result['rows_per_s']:>10,.0f} rows/s); driver peak RSS: Python "
        f"{result['python_kib'] / 1024:7.1f} MiB + JVM {result['jvm_kib'] / 1024:7.1f} MiB "
        f"= {mib:7.1f} MiB{heap}",
        flush=True,
    )
    return result


def peak(result: dict[str, Any]) -> int:
    return int(result["python_kib"] + result["jvm_kib"])


def bench(args: argparse.Namespace, workdir: Path) -> int:
    load_before, foreign_before = os.getloadavg()[0], foreign_jvms()
    print(f"master {args.master}, driver memory {args.driver_memory}, work dir {workdir}")
    print(f"driver peak RSS on {args.rss_master} (each size in its own process):")
    rss: dict[tuple[str, int], dict[str, Any]] = {}
    for write_from in ("executors", "driver"):
        for rows in (args.small, args.large):
            rss[write_from, rows] = measure(args, workdir, write_from, rows, args.batches,
                                            args.rss_master)  # fmt: skip
    print(f"driver peak RSS on {args.master}, where the driver JVM runs the tasks too:")
    local = {
        rows: measure(args, workdir, "executors", rows, args.batches)
        for rows in (args.small, args.large)
    }
    print(f"throughput, {args.throughput_rows:,}-row batches x {args.throughput_batches}:")
    speed: dict[str, list[float]] = {"executors": [], "driver": [], "nothing": []}
    for round_ in range(args.repeat):
        order = ("executors", "driver", "nothing") if round_ % 2 == 0 else (
            "nothing", "driver", "executors")  # fmt: skip
        for write_from in order:
            result = measure(args, workdir, write_from, args.throughput_rows,
                             args.throughput_batches)  # fmt: skip
            speed[write_from].append(result["rows_per_s"])
    if args.merge_rows:
        small, large = args.merge_rows
        print(f"merge (on the driver), {small:,} and {large:,}-row batches x 2:")
        merged = [measure(args, workdir, "merge", rows, 2) for rows in (small, large)]
        per_row = (peak(merged[1]) - peak(merged[0])) * 1024 / (large - small)
        print(f"merge: driver peak RSS grows by {per_row:,.0f} bytes per batch row "
              "(Python + JVM)")  # fmt: skip
    report_load(load_before, foreign_before)
    ratio = peak(rss["executors", args.large]) / peak(rss["executors", args.small])
    ratio_driver = peak(rss["driver", args.large]) / peak(rss["driver", args.small])
    ratio_local = peak(local[args.large]) / peak(local[args.small])
    python_only = {
        w: rss[w, args.large]["python_kib"] / rss[w, args.small]["python_kib"]
        for w in ("executors", "driver")
    }
    print(
        f"driver Python process alone, {args.large:,} / {args.small:,} rows: executors "
        f"{python_only['executors']:.2f}, driver path {python_only['driver']:.2f}"
    )
    versus = max(speed["executors"]) / max(speed["driver"])
    floor = max(speed["nothing"]) / max(speed["driver"])
    print(
        f"a mapInArrow job that only reads the batch in the tasks (writes nothing): "
        f"{floor:.2f}x the driver path's whole write; an executor-side writer's ceiling "
        "here"
    )
    print(f"driver_rss_ratio (executors, {args.rss_master}) {ratio:.2f} (target <= 1.3): "
          f"{'PASS' if ratio <= 1.3 else 'MISS'}; driver path: {ratio_driver:.2f}; "
          f"on {args.master}: {ratio_local:.2f}")  # fmt: skip
    print(f"distributed_vs_driver {versus:.2f} (target >= 1.0): "
          f"{'PASS' if versus >= 1.0 else 'MISS'}")  # fmt: skip
    print(
        f"driver_rss_ratio={ratio:.3f} driver_rss_ratio_driver_path={ratio_driver:.3f} "
        f"driver_rss_ratio_local={ratio_local:.3f} distributed_vs_driver={versus:.3f} "
        f"read_only_vs_driver={floor:.3f} master={args.master} rss_master={args.rss_master}"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", default="local[2]", help="the throughput runs' master")
    parser.add_argument(
        "--rss-master",
        default="local-cluster[2,1,1024]",
        help="the master of driver_rss_ratio's runs (a driver of its own)",
    )
    parser.add_argument("--small", type=int, default=500_000)
    parser.add_argument("--large", type=int, default=5_000_000)
    parser.add_argument("--batches", type=int, default=2, help="batches per RSS run")
    parser.add_argument("--throughput-rows", type=int, default=1_000_000)
    parser.add_argument("--throughput-batches", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2, help="throughput runs, best kept")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument(
        "--merge-rows",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[200_000, 1_000_000],
        help="two batch sizes for the merge's driver memory per row ('' to skip)",
    )
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--write-from", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--gc-log", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    return run_with_workdir(args, "fanout-bench-dist-", bench)


if __name__ == "__main__":
    sys.exit(main())
