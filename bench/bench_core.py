#!/usr/bin/env python
"""fanout's core benchmark: one streaming query fanned out to three Delta tables, against
the ways people do it without fanout.

    python bench/bench_core.py [--rows 1000000] [--files 10] [--workdir DIR] [--keep]
                               [--repeat 2] [--no-diagnose]

Variants (every Delta write is delta-rs from the driver, toArrow + write_deltalake with
the target's idempotent-write transaction, so the only difference is how the batch
reaches the writers):

  a   fanout: FanOut(pipeline, ledger=<Delta path>, sinks=[3 x delta, engine rs, append])
  a0  the same FanOut with the ledger in memory (MemoryLedger): the ledger's cost
  b   three independent streaming queries, one per target, each its own checkpoint
  c   one foreachBatch writing the three targets in turn: three toArrow, no persist
  d   floor: one streaming query writing one target

Every run starts on fresh output directories and a fresh checkpoint, is timed from the
first start() to the last awaitTermination(), and is verified: every target must hold
exactly N rows with N distinct order_ids (0..N-1), or the script exits non-zero.
The last line printed is machine-readable:

    ratio_a_b=<x> ratio_a_c=<y> ratio_a_d=<z> ledger_overhead=<fraction>
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    PIPELINE,
    TARGETS,
    BenchFailure,
    Ctx,
    Run,
    _batch_ms,
    _cleanup,
    _fanout,
    _last_batch_id,
    _start,
    _targets,
    _timed,
    fresh_inputs,
    interleaved_rounds,
    run_with_workdir,
    verify,
)
from core_diagnosis import diagnose_a, print_diagnosis
from core_micro import micro_writes
from deltawriter import DeltaTarget, Timings

ORDER = ("d", "a", "a0", "a1", "b", "c")
LABELS = {
    "a": "a  fanout (3 delta sinks, Delta ledger)",
    "a0": "a0 fanout, MemoryLedger (no ledger I/O)",
    "a1": "a1 fanout, parallelism=1 (sinks in turn)",
    "b": "b  3 independent queries",
    "c": "c  1 foreachBatch, 3 sequential toArrow+write",
    "d": "d  floor: 1 query, 1 target",
}
TARGET_RATIOS = {"a_b": 1.7, "a_c": 1.5, "a_d": 0.8}
LEDGER_OVERHEAD_MAX = 0.05


# -- input ------------------------------------------------------------------------------


# -- runs -------------------------------------------------------------------------------


def run_d(ctx: Ctx) -> Run:
    run = ctx.run_dir("d")
    timings = Timings()
    target = DeltaTarget(str(run / "t0"), "bench/d/t0", timings)
    seconds, qs = _timed(ctx, [lambda: _start(ctx, target.write_df, run / "ckpt")])
    verify([run / "t0"], ctx.rows, "d")
    _cleanup(ctx, run)
    return Run("d", seconds, _batch_ms(qs), timings)


def run_b(ctx: Ctx) -> Run:
    run = ctx.run_dir("b")
    timings = Timings()
    targets = [DeltaTarget(str(p), f"bench/b/{p.name}", timings) for p in _targets(run)]
    starters = [
        (lambda t=t, i=i: _start(ctx, t.write_df, run / f"ckpt{i}")) for i, t in enumerate(targets)
    ]
    seconds, qs = _timed(ctx, starters)
    verify(_targets(run), ctx.rows, "b")
    _cleanup(ctx, run)
    return Run("b", seconds, _batch_ms(qs), timings)


def run_c(ctx: Ctx) -> Run:
    run = ctx.run_dir("c")
    timings = Timings()
    targets = [DeltaTarget(str(p), f"bench/c/{p.name}", timings) for p in _targets(run)]

    def write_all(df: Any, batch_id: int) -> None:
        for t in targets:  # no persist: every toArrow reads and parses the input again
            t.write_df(df, batch_id)

    seconds, qs = _timed(ctx, [lambda: _start(ctx, write_all, run / "ckpt")])
    verify(_targets(run), ctx.rows, "c")
    _cleanup(ctx, run)
    return Run("c", seconds, _batch_ms(qs), timings)


def _check_ledger(ledger: Any, sinks: list[str], last_batch: int, variant: str) -> None:
    marks = ledger.last_committed(PIPELINE, sinks)
    if any(v != last_batch for v in marks.values()):
        raise BenchFailure(f"variant {variant}: ledger marks {marks}, expected {last_batch} each")


def run_a(ctx: Ctx, memory_ledger: bool = False, parallelism: int | None = None) -> Run:
    from fanout.ledger.delta import DeltaLedger
    from fanout.ledger.memory import MemoryLedger

    variant = "a0" if memory_ledger else "a1" if parallelism == 1 else "a"
    run = ctx.run_dir(variant)
    ledger = MemoryLedger() if memory_ledger else DeltaLedger(str(run / "ledger"))
    fan = _fanout(
        run, ledger, parallelism=parallelism
    )  # builds and opens sinks and ledger: before the clock starts
    try:
        seconds, qs = _timed(ctx, [lambda: _start(ctx, fan, run / "ckpt")])
    finally:
        fan.close()
    verify(_targets(run), ctx.rows, variant)
    _check_ledger(ledger, [p.name for p in _targets(run)], _last_batch_id(qs), variant)
    _cleanup(ctx, run)
    return Run(variant, seconds, _batch_ms(qs))


RUNNERS: dict[str, Callable[[Ctx], Run]] = {
    "a": run_a,
    "a0": lambda ctx: run_a(ctx, memory_ledger=True),
    "a1": lambda ctx: run_a(ctx, parallelism=1),
    "b": run_b,
    "c": run_c,
    "d": run_d,
}


# -- the instrumented run of (a): where the time goes ------------------------------------


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10, help="input files = micro-batches")
    parser.add_argument("--workdir", help="input and outputs go here (default: a new /tmp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir and outputs")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per variant (best kept)")
    parser.add_argument("--no-diagnose", action="store_true", help="skip the instrumented run")
    args = parser.parse_args(argv)

    return run_with_workdir(args, "fanout-bench-", _bench)


def _bench(args: argparse.Namespace, workdir: Path) -> int:
    t_all = time.perf_counter()
    source, warm = fresh_inputs(workdir, args.rows, args.files, 20_000, 2)

    from fanout.spark import local_session

    t0 = time.perf_counter()
    spark = local_session("fanout-bench")
    import deltalake
    import pyspark

    print(
        f"spark {pyspark.__version__} {spark.sparkContext.master}, deltalake "
        f"{deltalake.__version__}, session in {time.perf_counter() - t0:.1f} s"
    )

    warm_ctx = Ctx(spark, warm, 20_000, workdir / "runs" / "warmup", keep=False)
    t0 = time.perf_counter()
    for variant in ORDER:  # every code path once, untimed, on 20k rows
        RUNNERS[variant](warm_ctx)
    print(
        f"warm-up: every variant once on 20k rows in 2 batches ({time.perf_counter() - t0:.1f} s, "
        "not counted)"
    )

    ctx = Ctx(spark, source, args.rows, workdir / "runs" / "timed", keep=args.keep)
    runs, best = interleaved_rounds(
        ORDER,
        args.repeat,
        lambda variant: RUNNERS[variant](ctx),
        lambda variant, r: (
            f"{variant:<2} {r.seconds:7.2f} s  (verified: {args.rows} rows, "
            "unique order_ids, in every target)"
        ),
    )

    n = args.rows
    print(
        f"\n{n} rows, {args.files} micro-batches, {TARGETS} Delta targets (delta-rs, append, "
        f"txn per batch); best of {args.repeat} interleaved runs per variant"
    )
    print(f"{'variant':<48} {'seconds':>8} {'rows/s':>10} {'batch ms':>9}   all runs (s)")
    for v in ORDER:
        r = best[v]
        all_s = ", ".join(f"{x.seconds:.2f}" for x in runs[v])
        print(
            f"{LABELS[v]:<48} {r.seconds:8.2f} {n / r.seconds:10,.0f} "
            f"{r.batch_mean_ms:9.0f}   {all_s}"
        )
    print(
        "(batch ms: mean Spark triggerExecution per micro-batch; for b, over the 3 queries' "
        "batches, each writing one target; a1 is informational, not in the ratios)"
    )

    tput = {v: n / r.seconds for v, r in best.items()}
    ratios = {
        "a_b": tput["a"] / tput["b"],
        "a_c": tput["a"] / tput["c"],
        "a_d": tput["a"] / tput["d"],
    }
    ledger_overhead = (best["a"].seconds - best["a0"].seconds) / best["a"].seconds

    if not args.no_diagnose:
        diag_run, diag = diagnose_a(ctx)
        print_diagnosis(diag_run, diag, best)
        micro_writes(ctx)

    print("\nthroughput ratios (rows/s of a / rows/s of x):")
    for key, target in TARGET_RATIOS.items():
        verdict = "PASS" if ratios[key] >= target else "MISS"
        print(f"  a/{key[2]} = {ratios[key]:.3f}   target >= {target}   {verdict}")
    per_round = ", ".join(
        f"{(x.seconds - y.seconds) / x.seconds:.3f}"
        for x, y in zip(runs["a"], runs["a0"], strict=True)
    )
    verdict = "PASS" if ledger_overhead <= LEDGER_OVERHEAD_MAX else "MISS"
    print(
        f"  ledger overhead (t_a - t_a0) / t_a = {ledger_overhead:.3f}   target <= "
        f"{LEDGER_OVERHEAD_MAX}   {verdict}   "
        f"(best a vs best a0; a vs a0 of each round: {per_round})"
    )
    print(f"total benchmark time {time.perf_counter() - t_all:.0f} s")
    print(
        f"ratio_a_b={ratios['a_b']:.3f} ratio_a_c={ratios['a_c']:.3f} "
        f"ratio_a_d={ratios['a_d']:.3f} ledger_overhead={ledger_overhead:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
