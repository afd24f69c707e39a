#!/usr/bin/env python
"""Three sinks of three kinds: the same rows to Delta + PostgreSQL + Kafka, with fanout and
without.

    python bench/bench_three_sinks.py [--rows 1000000] [--files 10] [--repeat 2]
                                      [--variants a,b,...] [--master local[2]]
                                      [--workdir DIR] [--keep]

One local SparkSession (``--master``, default ``local[2]``: one task slot per core), one
embedded PostgreSQL server and one embedded Kafka broker (Tansu) serve every run. The
input is ``--rows`` JSON lines in ``--files`` files (bench_core's generator), read with
``maxFilesPerTrigger=1`` and ``availableNow``: one micro-batch per file. Every variant
writes through fanout's own sink classes, built the same way (so the per-sink work is
identical):

  delta  DeltaSink(engine="rs", mode="append"): toArrow on the driver, delta-rs commit
  pg     PostgresSink(keys=order_id, upsert, partitions=4): from the executors, COPY into
         a staging table, then MERGE (INSERT ... ON CONFLICT as the fallback), one
         transaction per partition
  kafka  KafkaSink(key=order_id, partitions=4): from the executors, one transactional
         producer per partition, markers in a marker topic of the run's own

Variants:

  a        fanout: FanOut(pipeline, ledger=<Delta path>, sinks=[delta, pg, kafka]): the sinks
           in parallel threads; from the second batch on, one shared job writes all three
           (each task writes its partition to PostgreSQL and Kafka and into Delta files of
           its own; the driver commits Delta's files once) and the batch is not cached
  a_own    a with ``share_tasks=False``: each sink its own job (Delta from the driver,
           toArrow), the batch persisted for them (informational: what sharing the tasks
           saves; no target uses it)
  b        three independent streaming queries started together, each a FanOut with ONE
           sink and its own ledger and checkpoint; timed from the first start to the last
           termination
  c        one foreachBatch calling delta.write, pg.write, kafka.write in turn (hand-written
           baseline: no persist, no ledger; each Batch has its own Arrow conversion)
  s_delta  / s_pg / s_kafka: one sink alone, as a single-sink FanOut (the "slowest single
           sink alone" of the latency target)

Every run uses a fresh Delta path, table, topic, marker topic, pipeline name, ledger and
checkpoint, and is verified: Delta holds exactly N rows with order_ids 0..N-1 (delta-rs);
PostgreSQL the same (SQL); Kafka exactly N records with N distinct keys (a read_committed
consumer reading until N arrive, then 1 s more for extras); fanout's ledger marks the last
batch for every sink. A wrong run makes the script exit 1.

Per-batch latency is Spark's ``durationMs.triggerExecution`` of every micro-batch that read
rows (``StreamingQuery.recentProgress``), of the best run of each variant (for b: the
batches of its three queries pooled).

The ceilings are what any fan-out of these sinks could reach on this machine, from the CPU
every process used (``three_report.ceilings``): the least CPU a fan-out needs, spread over
every core, is the soonest variant a could end (its floor). Targets: a/c >= 1.5; a/b >=
0.9 x its ceiling; a's p50 batch time <= 1.2 x the slowest single sink's; ``efficiency``
= a's floor / a's time >= 0.85. An informational line adds to the floor the idle the
source alone left (s_source's time x cores - its CPU: Spark's loop between batches, its
scan's last task alone), an estimate of the idle no fan-out avoids, and prints a/b's
ceiling and a's efficiency against that. The last line printed is machine-readable:

    ratio_a_b=<x> ratio_a_b_ceiling=<c> ratio_a_c=<y> latency_vs_slowest=<z> efficiency=<e>

``--timeline`` also writes Spark's event log and prints, per variant, where the best run's
batches spent their time: Spark's own part, the time before the first task, and the time
with no task, one, or two and more running, the batch's stages (the scan, the wait for the
sinks' job, the sinks' tasks: ``batch_timeline``), and, from the machine's CPU sampled
every 5 ms (``cpu_sampler.py``), how busy the cores were in each of those states and how
many core-ms a batch they idled. The event log slows every variant; use it to find
idle time, not to judge the targets.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_timeline import (
    EventLog,
    event_log_conf,
    print_idle,
    print_timeline,
    read_cpu_samples,
)
from common import (
    Ctx,
    Run,
    fresh_inputs,
    interleaved_rounds,
    run_with_workdir,
)
from three_checks import find_postmaster
from three_report import (
    A_B_SHARE_OF_CEILING,
    EFFICIENCY_MIN,
    LATENCY_MAX,
    RATIO_A_C_MIN,
    mean_ms,
    median_ratios,
    percentile,
    print_ceilings,
    ratios,
    with_source_idle,
)
from three_services import PARTITIONS, Services
from three_variants import RUNNERS, SINKS

ORDER = ("s_source", "s_delta", "s_pg", "s_kafka", "a", "a_own", "b", "c")
LABELS = {
    "a": "a  fanout, 3 sinks in parallel",
    "a_own": "a_own  a, each sink its own tasks",
    "b": "b  3 independent queries, 1 sink each",
    "c": "c  1 foreachBatch, 3 writes in turn",
    "s_delta": "s_delta  Delta alone (1-sink FanOut)",
    "s_pg": "s_pg     PostgreSQL alone",
    "s_kafka": "s_kafka  Kafka alone",
    "s_source": "s_source the source alone, no sink",
}
WARMUP_ROWS = 20_000
WARMUP_FILES = 10  # each batch runs Spark's per-batch code once more: the JIT's warm-up


# -- the services and the sinks ----------------------------------------------------------


# -- per-sink write times ----------------------------------------------------------------


# -- CPU accounting ----------------------------------------------------------------------

CPU_GROUPS = ("driver", "spark_jvm", "py_workers", "postgres", "tansu")
CPU_LABELS = {
    "driver": "driver Python (fanout, toArrow, delta-rs)",
    "spark_jvm": "Spark JVM (scan, JSON parse, shuffle)",
    "py_workers": "Spark Python workers (pg + kafka tasks)",
    "postgres": "PostgreSQL server",
    "tansu": "Kafka broker (Tansu)",
}


# -- verification ------------------------------------------------------------------------


# -- the variants ------------------------------------------------------------------------


# -- statistics --------------------------------------------------------------------------


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10, help="input files = micro-batches")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per variant (best kept)")
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="untimed rounds of every variant on the full input before the timed ones "
        "(default 1: the JVM's JIT compiler still used ~0.5-2 CPU s a run in the timed "
        "rounds after the short warm-up alone)",
    )
    parser.add_argument("--workdir", help="input and outputs go here (default: a new /tmp dir)")
    parser.add_argument("--keep", action="store_true", help="keep outputs, tables and topics")
    parser.add_argument(
        "--variants",
        default=",".join(ORDER),
        help="comma-separated variants to run, in this order (default: all; the ratios and "
        "the latency target are printed only when their variants ran)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="write Spark's event log, sample the machine's CPU, and print where each "
        "variant's batch time went and where the cores idled (the event log slows every "
        "variant: for finding idle time, not for the targets)",
    )
    parser.add_argument(
        "--source-open-cost",
        type=int,
        help="the source's spark.sql.files.openCostInBytes (Spark's default 4 MB splits each "
        "12 MB input file 8 + 4 MB on 2 cores: one core idles while the longer scan task "
        "ends; 0 splits it evenly). The source's setting, not fanout's: for finding how much "
        "of a batch that split costs, not for the targets",
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master of the one session every variant shares (default local[2]); "
        "local[4] gives the sinks' tasks more slots than cores, for tasks that wait on a "
        "service",
    )
    args = parser.parse_args(argv)
    args.variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = [v for v in args.variants if v not in RUNNERS]
    if unknown or not args.variants:
        parser.error(f"--variants: unknown {unknown or 'none given'}; choose from {list(RUNNERS)}")

    return run_with_workdir(args, "fanout-bench3-", _bench)


def _bench(args: argparse.Namespace, workdir: Path) -> int:
    t_all = time.perf_counter()
    source, warm = fresh_inputs(workdir, args.rows, args.files, WARMUP_ROWS, WARMUP_FILES)

    from fanout_postgres.embedded import EmbeddedPostgres

    with contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        pg_url = stack.enter_context(
            EmbeddedPostgres(workdir / "pgdata", database="bench", delete=True)
        )
        from sqlalchemy import create_engine

        engine = create_engine(pg_url)
        stack.callback(engine.dispose)
        services = Services(pg_url, "", engine, pg_pid=find_postmaster(workdir / "pgdata"))
        services.fresh_broker()  # and again before every run
        stack.callback(lambda: services.kafka.stop())
        print(
            f"embedded PostgreSQL ({pg_url.split('?')[0]}) and Kafka (Tansu, "
            f"{services.bootstrap}; a new broker for every run) up in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        return _measure(args, workdir, source, warm, services, t_all)


def run_on_fresh_broker(variant: str, ctx: Ctx, services: Services) -> Run:
    """One verified run of ``variant`` on a new Kafka broker."""
    services.fresh_broker()
    return RUNNERS[variant](ctx, services)


def _measure(
    args: argparse.Namespace,
    workdir: Path,
    source: Path,
    warm: Path,
    services: Services,
    t_all: float,
) -> int:
    from fanout.spark import local_session

    t0 = time.perf_counter()
    events = workdir / "eventlog"
    shutil.rmtree(events, ignore_errors=True)
    conf = event_log_conf(events) if args.timeline else {}
    cpu_samples = workdir / "cpu-samples.txt"
    if args.timeline:  # the machine's CPU, beside the event log (a process of its own)
        cpu_samples.unlink(missing_ok=True)
        sampler = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("cpu_sampler.py")), str(cpu_samples)]
        )
        atexit.register(sampler.terminate)
    if args.source_open_cost is not None:
        conf["spark.sql.files.openCostInBytes"] = str(args.source_open_cost)
    spark = local_session("fanout-bench-three-sinks", master=args.master, conf=conf)
    import pyspark

    print(
        f"spark {pyspark.__version__} {spark.sparkContext.master}, session in "
        f"{time.perf_counter() - t0:.1f} s"
        + (
            f"; the source's spark.sql.files.openCostInBytes={args.source_open_cost} "
            "(not Spark's default)"
            if args.source_open_cost is not None
            else ""
        )
    )

    warm_ctx = Ctx(spark, warm, WARMUP_ROWS, workdir / "runs" / "warmup", keep=False)
    t0 = time.perf_counter()
    selected: tuple[str, ...] = args.variants
    for variant in selected:  # every code path once, untimed, on 20k rows
        run_on_fresh_broker(variant, warm_ctx, services)
    print(
        f"warm-up: every variant once on {WARMUP_ROWS // 1000}k rows in {WARMUP_FILES} batches "
        f"({time.perf_counter() - t0:.1f} s, not counted)",
        flush=True,
    )

    ctx = Ctx(spark, source, args.rows, workdir / "runs" / "timed", keep=args.keep)
    for rep in range(args.warmup_rounds):  # full size: what the timed rounds run, compiled
        last_first = (args.warmup_rounds - rep) % 2 == 1  # timed round 1 starts reversed
        for variant in tuple(reversed(selected)) if last_first else selected:
            r = run_on_fresh_broker(variant, ctx, services)
            print(
                f"  warm-up round {rep + 1}: {variant:<7} {r.seconds:7.2f} s  (not counted; "
                f"JIT compiler threads {r.extra['cpu']['jit']:.2f} CPU s)",
                flush=True,
            )
    runs, best = interleaved_rounds(
        selected,
        args.repeat,
        lambda variant: run_on_fresh_broker(variant, ctx, services),
        lambda variant, r: (
            f"{variant:<7} {r.seconds:7.2f} s  batch p50 "
            f"{percentile(r.batch_ms, 0.5):6.0f} ms  JIT {r.extra['cpu']['jit']:.2f} CPU s  "
            f"(verified: {args.rows} rows once each in every sink, ledger marks)"
        ),
    )

    n = args.rows
    p50 = {v: percentile(r.batch_ms, 0.5) for v, r in best.items()}
    p95 = {v: percentile(r.batch_ms, 0.95) for v, r in best.items()}
    print(
        f"\n{n} rows, {args.files} micro-batches, sinks Delta (delta-rs) + PostgreSQL (upsert, "
        f"{PARTITIONS} partitions) + Kafka (transactional, {PARTITIONS} partitions); best of "
        f"{args.repeat} interleaved runs per variant"
    )
    print(
        f"{'variant':<40} {'seconds':>8} {'rows/s':>9} {'p50 ms':>7} {'p95 ms':>7}   all runs (s)"
    )
    for v in selected:
        r = best[v]
        all_s = ", ".join(f"{x.seconds:.2f}" for x in runs[v])
        print(
            f"{LABELS.get(v, v):<40} {r.seconds:8.2f} {n / r.seconds:9,.0f} {p50[v]:7.0f} "
            f"{p95[v]:7.0f}   {all_s}"
        )
    print(
        "(p50/p95: Spark triggerExecution of each micro-batch of the best run, from "
        "recentProgress; for b over the 3 queries' batches pooled, each writing one sink)"
    )

    print("\nmean sink.write time per batch, ms (best run; a and s_*: fanout_sink_done hook,")
    print("b: the same inside each query, c: timed around each write):")
    print(f"  {'variant':<9} {'delta':>7} {'pg':>7} {'kafka':>7} {'sum':>7}")
    for v in selected:
        sink_s = best[v].extra.get("sink_s", {})
        total = sum(statistics.fmean(x) for x in sink_s.values() if x)
        cells = " ".join(mean_ms(sink_s.get(k)) for k in SINKS)
        print(f"  {v:<9} {cells} {1000 * total:7.0f}")

    cores = os.cpu_count() or 1
    print(f"\nCPU seconds during the best run (from /proc; {cores} cores = {cores} CPU s per s):")
    print(f"  {'':<42}" + "".join(f"{v:>9}" for v in selected))
    for group in CPU_GROUPS:
        cells = "".join(f"{best[v].extra['cpu'][group]:9.1f}" for v in selected)
        print(f"  {CPU_LABELS[group]:<42}{cells}")
        if group == "spark_jvm":
            cells = "".join(f"{best[v].extra['cpu']['jit']:9.1f}" for v in selected)
            print(f"  {'  of it, the JIT compiler threads':<42}{cells}")
    ours = {v: cpu_of(best[v]) for v in selected}
    print(f"  {'= this benchmark':<42}" + "".join(f"{ours[v]:9.1f}" for v in selected))
    print(
        f"  {'other processes on the machine':<42}"
        + "".join(f"{best[v].extra['cpu']['machine'] - ours[v]:9.1f}" for v in selected)
    )
    print(
        f"  {'wall s x cores (capacity)':<42}"
        + "".join(f"{best[v].seconds * cores:9.1f}" for v in selected)
    )
    print(
        f"  {'machine busy / capacity':<42}"
        + "".join(
            f"{best[v].extra['cpu']['machine'] / (best[v].seconds * cores):9.0%}" for v in selected
        )
    )

    if args.timeline:  # the runs are over: stopping the session writes out the event log
        spark.stop()
        sampler.terminate()
        sampler.wait()
        log, query_ids = EventLog.read(events), {v: best[v].extra["query_ids"] for v in selected}
        print_timeline(log, query_ids)
        print_idle(log, query_ids, read_cpu_samples(cpu_samples), cores)
    print(f"total benchmark time {time.perf_counter() - t_all:.0f} s")
    if services.lso_stuck:
        print(
            f"\n{len(services.lso_stuck)} run(s) verified on read_uncommitted only (Tansu's "
            "stuck last stable offset; every record present exactly once):"
        )
        for line in services.lso_stuck:
            print(f"  {line}")
    if {"a", "a_own"} <= set(selected):
        print(
            "sharing tasks (a: Delta, PostgreSQL and Kafka written by one task per partition; "
            "a_own: each by its own job): "
            f"a_own/a time {best['a_own'].seconds / best['a'].seconds:.3f}, "
            f"p50 {p50['a_own'] / p50['a']:.3f}"
        )
    singles = ("s_delta", "s_pg", "s_kafka")
    if not {"a", "b", "c", "s_source", *singles} <= set(selected):
        print("(the ratios, ceilings and targets need every variant: not all of them ran)")
        return 0
    found, top = ratios(best, ours, singles, cores, args.files)
    print_ceilings(top, cores)
    a_b, a_c, latency, efficiency = found.a_b, found.a_c, found.latency, found.efficiency
    slowest = found.slowest
    slowest95 = max(singles, key=lambda v: p95[v])
    latency95 = p95["a"] / p95[slowest95]
    a_b_min = A_B_SHARE_OF_CEILING * top.a_b

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    print("\ntargets:")
    print(
        f"  a/b = {a_b:.3f}   ceiling {top.a_b:.3f}; target >= {A_B_SHARE_OF_CEILING} x ceiling "
        f"= {a_b_min:.3f}   {verdict(a_b >= a_b_min)}"
    )
    print(
        f"  a/c = {a_c:.3f}   ceiling {top.a_c:.3f}; target >= {RATIO_A_C_MIN}   "
        f"{verdict(a_c >= RATIO_A_C_MIN)}"
    )
    print(
        f"  batch latency of a / slowest single sink ({slowest}), p50: {latency:.3f}   "
        f"target <= {LATENCY_MAX}   {verdict(latency <= LATENCY_MAX)}"
    )
    print(
        f"  efficiency: the fastest a fan-out could end ({top.fastest_a:.2f} s) / a's time "
        f"({best['a'].seconds:.2f} s) = {efficiency:.3f}   target >= {EFFICIENCY_MIN}   "
        f"{verdict(efficiency >= EFFICIENCY_MIN)}"
    )
    print(
        f"  (informational: the batch latency at p95, slowest {slowest95}: {latency95:.3f}; "
        f"the single sinks' p50 summed: {sum(p50[v] for v in singles) / p50['a']:.2f}x a's p50)"
    )
    idle = with_source_idle(best, ours, top, cores)
    print(
        f"  (informational: the source alone, with no sink, left the cores idle "
        f"{idle.idle:.2f} core-s: Spark's loop between batches, its scan's last task alone. "
        f"Idling that much and no more, a fan-out could end no sooner than "
        f"{idle.fastest_a:.2f} s: a/b <= {idle.a_b:.3f} "
        f"({A_B_SHARE_OF_CEILING} x = {A_B_SHARE_OF_CEILING * idle.a_b:.3f}), "
        f"that / a's time = {idle.efficiency:.3f})"
    )
    if args.repeat > 1:
        print_rounds(runs, singles, cores, args.files)
    print(found.line())
    return 0


def print_rounds(
    runs: dict[str, list[Run]], singles: tuple[str, ...], cores: int, files: int
) -> None:
    """Each round's ratios (every variant's run of that round) and their medians: on a
    machine whose speed drifts between runs, one best run per variant can pair a fast
    run of one variant with a slow run of another."""
    print("\neach round's ratios (the targets above use each variant's best run):")
    found = []
    for rep in range(min(len(rs) for rs in runs.values())):
        round_runs = {v: rs[rep] for v, rs in runs.items()}
        ours = {v: cpu_of(r) for v, r in round_runs.items()}
        found.append(ratios(round_runs, ours, singles, cores, files)[0])
        print(f"  round {rep + 1}: {found[-1].line()}")
    print(f"  median:  {median_ratios(found).line()}")


def cpu_of(run: Run) -> float:
    """The CPU seconds the benchmark's own processes used during ``run``."""
    return sum(run.extra["cpu"][g] for g in CPU_GROUPS)


if __name__ == "__main__":
    sys.exit(main())
