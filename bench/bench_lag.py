#!/usr/bin/env python
"""What ``on_failure="lag"`` costs: the healthy sinks' speed during a PostgreSQL outage,
the catch-up's speed once it is back, and the steady-state overhead with no failure.

    .venv/bin/python bench/bench_lag.py [--rows 300000] [--batches 6] [--repeat 3]

One local SparkSession (``local[2]``), one embedded PostgreSQL server and one embedded
Kafka broker (Tansu) serve every run. The input is ``--rows`` JSON lines in ``--batches``
files, written once and read by every run with ``maxFilesPerTrigger=1`` and
``availableNow``: one micro-batch per file. Sinks: ``lake`` (Delta, delta-rs, append),
``pg`` (PostgreSQL upsert on order_id, 4 partitions), ``bus`` (Kafka, transactional, 4
partitions). Every run has its own checkpoint, ledger, spool, Delta path, table and topics,
and is verified (each sink holds the N rows once, the ledger marks the last batch).

  base      lake + bus, no PostgreSQL sink at all
  outage    lake + pg + bus, pg ``on_failure="lag"`` (retries=0, probe_interval_s=30); the
            server is stopped before the stream starts, so every batch fails pg once and
            is spooled while lake and bus are written
  catchup   then the server is started again and ``fan.catch_up()`` on the same FanOut
            writes every spooled batch to pg (timed alone)
  pg_alone  pg alone (a 1-sink FanOut), fresh table, same batches
  stop/lag  lake + pg + bus with pg ``on_failure="stop"`` / ``"lag"`` (spool configured,
            server up)

Every variant runs ``--repeat`` times, interleaved; each ratio uses the best time of each.

  ratio_outage  = rows/s of outage / rows/s of base             (target >= 0.9)
  catchup_ratio = rows/s of catchup / rows/s of pg_alone        (target >= 0.8)
  lag_overhead  = (best lag - best stop) / best stop, seconds   (target <= 0.02)

Before the timed runs every variant runs once on 20k rows (warm-up, not counted). A missed
target does not change the exit code; a verification failure exits 1. The last line is:

    ratio_outage=<x> catchup_ratio=<y> lag_overhead=<z>
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    SCHEMA,
    BenchFailure,
    Ctx,
    _start,
    _timed,
    foreign_jvms,
    fresh_inputs,
    report_load,
    run_with_workdir,
)
from lag_timeline import Timeline
from three_checks import finish, verify_all, verify_ledger
from three_services import PARTITIONS, Plan, Services, make_plan

PROBE_INTERVAL_S = 30.0
CATCHUP_TIMEOUT_S = 1800.0
WARMUP_ROWS, WARMUP_BATCHES = 20_000, 2
NAMES = {"delta": "lake", "pg": "pg", "kafka": "bus"}  # bench kind -> sink name
ALL3, HEALTHY = ("delta", "pg", "kafka"), ("delta", "kafka")
LAST_TIMELINE: list[Timeline] = []  # the last outage run's, printed with the report
TARGETS = {"ratio_outage": (">=", 0.9), "catchup_ratio": (">=", 0.8), "lag_overhead": ("<=", 0.02)}


@dataclass
class Timing:
    """One timed run: its name, seconds, and what it holds worth a note."""

    variant: str
    seconds: float
    note: str = ""


def build_fan(
    plan: Plan,
    services: Services,
    kinds: tuple[str, ...],
    on_failure: str = "stop",
    retries: int | None = None,
    plugins: tuple[object, ...] = (),
) -> Any:
    """A FanOut over ``kinds`` (it opens the sinks and the ledger: before the clock starts),
    pg with ``on_failure`` (and ``retries`` when given), a spool when pg lags."""
    from fanout import FanOut

    pg = {"on_failure": on_failure, **({} if retries is None else {"retries": retries})}
    configs: dict[str, dict[str, Any]] = {
        "delta": {"type": "delta", "path": str(plan.delta_path), "engine": "rs", "mode": "append"},
        "pg": {
            "type": "postgres",
            "url": services.pg_url,
            "table": plan.table,
            "keys": ["order_id"],
            "create_table": True,
            "partitions": PARTITIONS,
            "batch_schema": SCHEMA,  # table created at its first write (timed)
            **pg,
        },
        "kafka": {
            "type": "kafka",
            "bootstrap_servers": services.bootstrap,
            "topic": plan.topic,
            "key": "order_id",
            "partitions": PARTITIONS,
            "marker_topic": plan.marker_topic,
        },
    }
    lags = "pg" in kinds and on_failure == "lag"
    return FanOut(
        pipeline=plan.pipeline,
        ledger=str(plan.run / "ledger"),
        sinks=[{"name": NAMES[k], **configs[k]} for k in kinds],
        spool=str(plan.run / "spool") if lags else None,
        probe_interval_s=PROBE_INTERVAL_S,
        plugins=plugins,
    )


def run_stream(ctx: Ctx, fan: Any, plan: Plan) -> tuple[float, int]:
    """Time the file stream through ``fan`` from start to termination; return the seconds
    and the last batch id that read rows."""
    seconds, queries = _timed(ctx, [lambda: _start(ctx, fan, plan.run / "ckpt")])
    progress = [p for q in queries for p in q.recentProgress if p["numInputRows"] > 0]
    read = sum(p["numInputRows"] for p in progress)
    if read != ctx.rows:
        raise BenchFailure(f"{plan.pipeline}: the batches held {read} rows, not {ctx.rows}")
    return seconds, max(p["batchId"] for p in progress)


def check(
    ctx: Ctx, services: Services, plan: Plan, fan: Any, kinds: tuple[str, ...], last: int
) -> None:
    """Verify every sink holds the rows once and the ledger marks the last batch, then
    drop the run's table, topics and directory."""
    verify_all(ctx, services, plan, kinds, plan.pipeline)
    verify_ledger(fan.ledger, plan.pipeline, [NAMES[k] for k in kinds], last, plan.pipeline)
    finish(ctx, services, plan, kinds)


def plain_run(
    ctx: Ctx, services: Services, variant: str, kinds: tuple[str, ...], on_failure: str = "stop"
) -> Timing:
    """One healthy run over ``kinds`` (base, pg_alone, stop, lag)."""
    plan = make_plan(ctx, services, variant)
    fan = build_fan(plan, services, kinds, on_failure)
    try:
        seconds, last = run_stream(ctx, fan, plan)
        if on_failure == "lag" and (state := fan.lagging.lags()["pg"].state) != "live":
            raise BenchFailure(f"{variant}: pg is {state} with the server up")
    finally:
        fan.close()
    check(ctx, services, plan, fan, kinds, last)
    return Timing(variant, seconds)


def outage_run(ctx: Ctx, services: Services, server: Any) -> tuple[Timing, Timing]:
    """The outage run (server down from before the start) and the catch-up after it."""
    plan = make_plan(ctx, services, "outage")
    timeline = Timeline()
    fan = build_fan(plan, services, ALL3, "lag", retries=0, plugins=(timeline,))
    try:
        server.stop()
        try:
            seconds, last = run_stream(ctx, fan, plan)
            fan.catchup.stop()  # the catch-up below is timed alone, in this thread
            lag = fan.lagging.lags()["pg"]
        finally:
            if server.start() != services.pg_url:
                raise BenchFailure("the restarted PostgreSQL server has another URL")
        if lag.batches != last + 1 or lag.rows != ctx.rows:
            raise BenchFailure(
                f"outage: pg missed {lag.batches} batches ({lag.rows} rows), expected "
                f"{last + 1} ({ctx.rows}): the server was not down for every batch"
            )
        t0 = time.perf_counter()
        timeline.catching_up()
        after = fan.catch_up(timeout_s=CATCHUP_TIMEOUT_S)["pg"]
        caught = time.perf_counter() - t0
        if after.state != "live" or fan.spool.size()[0] != 0:
            raise BenchFailure(f"catch-up: pg is {after.state} ({after.error}), spool not empty")
    finally:
        fan.close()
    check(ctx, services, plan, fan, ALL3, last)
    LAST_TIMELINE[:] = [timeline]
    return (
        Timing("outage", seconds, f"pg down: {lag.batches} batches spooled, lake+bus written"),
        Timing("catchup", caught, f"{lag.batches} spooled batches written to pg"),
    )


def all_runs(ctx: Ctx, services: Services, server: Any, repeat: int) -> list[Timing]:
    """Every variant ``repeat`` times, interleaved (the order alternates each round): base,
    outage + catch-up, pg_alone, stop and lag."""
    runs: list[Timing] = []
    for rep in range(repeat):
        round_ = [
            lambda: [plain_run(ctx, services, "base", HEALTHY)],
            lambda: list(outage_run(ctx, services, server)),
            lambda: [plain_run(ctx, services, "pg_alone", ("pg",))],
            lambda: [plain_run(ctx, services, "stop", ALL3, on_failure="stop")],
            lambda: [plain_run(ctx, services, "lag", ALL3, on_failure="lag")],
        ]
        for run in round_ if rep % 2 == 0 else reversed(round_):
            runs.extend(run())
    return runs


@contextlib.contextmanager
def embedded_services(workdir: Path) -> Iterator[tuple[Services, Any]]:
    """The PostgreSQL server (not ``delete=True``: it restarts with the same URL) and the
    Kafka broker every run shares."""
    import sqlalchemy as sa
    from fanout_postgres.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(workdir / "pgdata", database="bench")
    services = Services(server.start(), "")
    try:
        services.engine = sa.create_engine(services.pg_url, poolclass=sa.NullPool)
        services.fresh_broker()  # once: every run uses this broker, with its own topics
        yield services, server
    finally:
        if services.kafka is not None:
            services.kafka.stop()
        if services.engine is not None:
            services.engine.dispose()
        server.stop()


def verdict(key: str, value: float) -> str:
    """``ok`` or ``target missed`` for one ratio."""
    op, target = TARGETS[key]
    met = value >= target if op == ">=" else value <= target
    return f"target {op} {target}  {'ok' if met else 'target missed'}"


def report(runs: list[Timing], rows: int, batches: int, repeat: int) -> dict[str, float]:
    """Print every run and the ratios; return the ratios."""
    print(f"\n{rows} rows in {batches} batches; every run verified")
    print(f"{'run':<10} {'seconds':>8} {'rows/s':>10}  note")
    for r in runs:
        print(f"{r.variant:<10} {r.seconds:8.2f} {rows / r.seconds:10,.0f}  {r.note}")
    best = {v: min(r.seconds for r in runs if r.variant == v) for v in {r.variant for r in runs}}
    ratios = {
        "ratio_outage": best["base"] / best["outage"],
        "catchup_ratio": best["pg_alone"] / best["catchup"],
        "lag_overhead": (best["lag"] - best["stop"]) / best["stop"],
    }
    print(f"\nbest of {repeat}: " + ", ".join(f"{v} {t:.2f} s" for v, t in sorted(best.items())))
    print(
        f"ratio_outage  = {ratios['ratio_outage']:6.3f}  (outage vs base, rows/s)   "
        f"{verdict('ratio_outage', ratios['ratio_outage'])}"
    )
    print(
        f"catchup_ratio = {ratios['catchup_ratio']:6.3f}  (catchup vs pg_alone)     "
        f"{verdict('catchup_ratio', ratios['catchup_ratio'])}"
    )
    print(
        f"lag_overhead  = {ratios['lag_overhead']:6.3f}  (lag vs stop, no failure) "
        f"{verdict('lag_overhead', ratios['lag_overhead'])}"
    )
    return ratios


def bench(args: argparse.Namespace, workdir: Path) -> int:
    """Write the input once, start the services and Spark, warm up, run, report."""
    from fanout.spark import local_session

    source, warm = fresh_inputs(workdir, args.rows, args.batches, WARMUP_ROWS, WARMUP_BATCHES)
    with embedded_services(workdir) as (services, server):
        t0 = time.perf_counter()
        spark = local_session("fanout-bench-lag", master="local[2]")
        print(
            f"spark {spark.sparkContext.master}, embedded PostgreSQL and Kafka (Tansu) up; "
            f"session in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        t0 = time.perf_counter()
        all_runs(
            Ctx(spark, warm, WARMUP_ROWS, workdir / "runs" / "warmup", False), services, server, 1
        )
        print(
            f"warm-up: every variant once on {WARMUP_ROWS} rows "
            f"({time.perf_counter() - t0:.1f} s, not counted)",
            flush=True,
        )
        load, jvms = os.getloadavg()[0], foreign_jvms()
        ctx = Ctx(spark, source, args.rows, workdir / "runs" / "timed", False)
        runs = all_runs(ctx, services, server, args.repeat)
        report_load(load, jvms)
        for stuck in services.lso_stuck:
            print(f"Kafka verified on read_uncommitted only (Tansu): {stuck}")
    if LAST_TIMELINE:
        LAST_TIMELINE[0].print(("lake", "bus", "pg"))
    ratios = report(runs, args.rows, args.batches, args.repeat)
    print(" ".join(f"{k}={v:.3f}" for k, v in ratios.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the benchmark in a temporary work directory."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="input rows")
    parser.add_argument("--batches", type=int, default=6, help="input files = micro-batches")
    parser.add_argument("--repeat", type=int, default=3, help="runs of stop and of lag (best kept)")
    parser.set_defaults(workdir=None, keep=False)
    args = parser.parse_args(argv)
    if args.rows < args.batches or args.batches < 1 or args.repeat < 1:
        parser.error("need --rows >= --batches >= 1 and --repeat >= 1")
    return run_with_workdir(args, "fanout-bench-lag-", bench)


if __name__ == "__main__":
    sys.exit(main())
