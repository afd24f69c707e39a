"""bench_three_sinks' variants: (a) fanout with the three sinks (s_<sink>: one), (b) one
query per sink, (c) one foreachBatch writing the three in turn, and the source alone."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BenchFailure,
    Ctx,
    Run,
    _batch_ms,
    _cleanup,
    _start,
)
from three_checks import finish, timed, verify_all, verify_ledger
from three_services import Services, SinkTimes, make_plan, make_sink

SINKS = ("delta", "pg", "kafka")


def measured(
    variant: str, seconds: float, queries: list[Any], cpu: dict[str, float], sink_s: dict
) -> Run:
    """A verified run's result: its time, its queries' batch times and ids (the ids find
    its batches in Spark's event log), the CPU each process used and the sinks' times."""
    ids = [str(q.id) for q in queries]
    extra = {"sink_s": sink_s, "cpu": cpu, "query_ids": ids}
    return Run(variant, seconds, _batch_ms(queries), extra=extra)


def run_fanout(
    ctx: Ctx, services: Services, variant: str, kinds: tuple[str, ...], *, share_tasks: bool = True
) -> Run:
    """(a) with all three sinks; a_own the same with each sink's tasks its own
    (``share_tasks=False``); s_<sink> with one."""
    from fanout import FanOut
    from fanout.ledger.delta import DeltaLedger

    plan = make_plan(ctx, services, variant)
    times = SinkTimes()
    ledger = DeltaLedger(str(plan.run / "ledger"))
    fan = FanOut(  # builds and opens the sinks and the ledger: before the clock starts
        pipeline=plan.pipeline,
        ledger=ledger,
        sinks=[make_sink(k, plan, services) for k in kinds],
        plugins=(times.observer(),),
        share_tasks=share_tasks,
    )
    try:
        seconds, qs, cpu = timed(ctx, services, [lambda: _start(ctx, fan, plan.run / "ckpt")])
    finally:
        fan.close()
    verify_all(ctx, services, plan, kinds, variant)
    last = max(p["batchId"] for q in qs for p in q.recentProgress if p["numInputRows"] > 0)
    verify_ledger(ledger, plan.pipeline, list(kinds), last, variant)
    finish(ctx, services, plan, kinds)
    return measured(variant, seconds, qs, cpu, dict(times.seconds))


def run_b(ctx: Ctx, services: Services) -> Run:
    """Three queries, each a single-sink FanOut with its own ledger and checkpoint."""
    from fanout import FanOut
    from fanout.ledger.delta import DeltaLedger

    plan = make_plan(ctx, services, "b")
    times = SinkTimes()
    ledgers = {k: DeltaLedger(str(plan.run / f"ledger-{k}")) for k in SINKS}
    fans = {
        k: FanOut(
            pipeline=plan.pipeline,
            ledger=ledgers[k],
            sinks=[make_sink(k, plan, services)],
            plugins=(times.observer(),),
        )
        for k in SINKS
    }
    starters = [(lambda k=k: _start(ctx, fans[k], plan.run / f"ckpt-{k}")) for k in SINKS]
    try:
        seconds, qs, cpu = timed(ctx, services, starters)
    finally:
        for fan in fans.values():
            fan.close()
    verify_all(ctx, services, plan, SINKS, "b")
    for k, q in zip(SINKS, qs, strict=True):
        last = max(p["batchId"] for p in q.recentProgress if p["numInputRows"] > 0)
        verify_ledger(ledgers[k], plan.pipeline, [k], last, "b")
    finish(ctx, services, plan, SINKS)
    return measured("b", seconds, qs, cpu, dict(times.seconds))


def run_c(ctx: Ctx, services: Services) -> Run:
    """The hand-written baseline: one foreachBatch, the three sinks' writes in turn."""
    from fanout.contract.batch import Batch, BatchInfo, txn_app_id
    from fanout.contract.sink import SinkContext
    from fanout.steps.context import query_id_of

    plan = make_plan(ctx, services, "c")
    times = SinkTimes()
    sinks = [make_sink(k, plan, services) for k in SINKS]
    for sink in sinks:
        sink.open(SinkContext(plan.pipeline, ctx.spark))

    def write_all(df: Any, batch_id: int) -> None:
        info = BatchInfo(plan.pipeline, int(batch_id), query_id_of(df))
        for sink in sinks:  # no persist: each write reads and parses the input again
            batch = Batch(df, info, sink.name, txn_app_id(plan.pipeline, sink.name))
            t0 = time.perf_counter()
            sink.write(batch)
            times.add(sink.name, time.perf_counter() - t0)

    try:
        seconds, qs, cpu = timed(ctx, services, [lambda: _start(ctx, write_all, plan.run / "ckpt")])
    finally:
        for sink in sinks:
            sink.close()
    verify_all(ctx, services, plan, SINKS, "c")
    finish(ctx, services, plan, SINKS)
    return measured("c", seconds, qs, cpu, dict(times.seconds))


def run_source(ctx: Ctx, services: Services) -> Run:
    """The source alone: each batch read and parsed in full (Spark's ``noop`` writer), and
    counted by the query's progress. No sink, no cache. Its CPU is the work b repeats per
    sink and a does once."""
    run = ctx.run_dir("s_source")  # a checkpoint only: no table, topic or ledger

    def read_only(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    seconds, qs, cpu = timed(ctx, services, [lambda: _start(ctx, read_only, run / "ckpt")])
    read = sum(p["numInputRows"] for q in qs for p in q.recentProgress)
    if read != ctx.rows:
        raise BenchFailure(f"s_source: the batches held {read} rows, not {ctx.rows}")
    _cleanup(ctx, run)
    return measured("s_source", seconds, qs, cpu, {})


RUNNERS: dict[str, Callable[[Ctx, Services], Run]] = {
    "a": lambda ctx, s: run_fanout(ctx, s, "a", SINKS),
    "a_own": lambda ctx, s: run_fanout(ctx, s, "a_own", SINKS, share_tasks=False),
    "b": run_b,
    "c": run_c,
    "s_delta": lambda ctx, s: run_fanout(ctx, s, "s_delta", ("delta",)),
    "s_pg": lambda ctx, s: run_fanout(ctx, s, "s_pg", ("pg",)),
    "s_kafka": lambda ctx, s: run_fanout(ctx, s, "s_kafka", ("kafka",)),
    "s_source": run_source,
}
