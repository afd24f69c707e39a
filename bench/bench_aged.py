#!/usr/bin/env python
"""A pipeline's age: fanout's time per batch on a new ledger and Delta table, against the
same pipeline after thousands of batches, with the Delta logs those batches left.

    python bench/bench_aged.py [--age 3000] [--trigger-s 10] [--batches 30] [--rows 200]
                               [--repeat 2] [--workdir DIR] [--keep]

One FanOut with one Delta sink (delta-rs, append) and its Delta ledger reads ``--batches``
JSON files of ``--rows`` rows, one micro-batch each (``local[2]``). delta-rs lists every
file of a table's ``_delta_log`` directory at each commit and scans them for expired ones
(on a local disk ~8 us a file), and Delta keeps 30 days of log unless the table says
otherwise: one file per batch, so a pipeline's commits slow down as it ages. Variants, each
on a copy of the same tables:

  new            a new ledger and a new table
  ledger_before  the ledger after ``--age`` earlier marks (another pipeline's, compacted as
                 the ledger does), as fanout made it before it kept its log short
                 (``DeltaLedger(log_retention=None)``: Delta's default, 30 days), its log
                 files dated ``--trigger-s`` apart back from now, as that many batches leave
                 them; a new table
  ledger_now     the same aged ledger, opened as fanout does now: its log kept to 15 minutes
                 (``delta.logRetentionDuration``, set on open; its first commit removes the
                 older log); a new table
  table_30d      a new ledger; the table after ``--age`` earlier one-row appends of another
                 writer (checkpointed as delta-rs does, compacted every 100 as its owner
                 would), dated the same way, with Delta's default log retention
  table_1h       the same aged table, its owner having set ``delta.logRetentionDuration`` to
                 one hour (README.md, the Delta sink: "A long-running stream's log")

A variant's time per batch is the median of Spark's ``addBatch`` (the FanOut call) over its
batches after the first three, after one untimed run of ``new``. Each run is verified (the
table holds every input row once, the ledger marks the last batch), and the best of
``--repeat`` interleaved runs is kept. The last line is machine-readable:

    ledger_aged_vs_new=<ledger_now / new> ledger_before_vs_new=<ledger_before / new>
    table_30d_vs_new=<table_30d / new> table_1h_vs_new=<table_1h / new>
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchFailure, generate_input, run_with_workdir, start_query

PIPELINE = "aged"
SINK = "bronze"
VARIANTS = ("new", "ledger_before", "ledger_now", "table_30d", "table_1h")
TABLE_LOG_RETENTION = "interval 1 hours"
SKIP = 3  # the first batches: Spark's and the JIT's warm-up, and the aged ledger's cleanup


def _aging_hooks() -> Any:
    from deltalake import PostCommitHookProperties

    # no log cleanup while aging: every file is new, and scanning them at each commit
    # would make aging quadratic
    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--age", type=int, default=3000, help="earlier commits per table")
    parser.add_argument("--trigger-s", type=float, default=10.0, help="time between them")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rows", type=int, default=200, help="rows a batch")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    return run_with_workdir(args, "fanout-aged-", _bench)


def _bench(args: argparse.Namespace, workdir: Path) -> int:
    from fanout.spark import local_session

    source = workdir / "input"
    generate_input(source, args.rows * args.batches, args.batches)
    started = time.perf_counter()
    aged = workdir / "aged"
    _age_ledger(aged / "ledger", args.age, args.trigger_s)
    _age_table(aged / "table", args.age, args.trigger_s)
    print(
        f"aged a ledger and a table by {args.age} commits each in "
        f"{time.perf_counter() - started:.0f} s; their log files: "
        f"{_log_files(aged / 'ledger')} and {_log_files(aged / 'table')}",
        flush=True,
    )
    spark = local_session("fanout-bench-aged")
    spark.sparkContext.setLogLevel("ERROR")
    _run(spark, args, source, aged, workdir / "warm-up", "new")  # the JVM's and Spark's warm-up
    shutil.rmtree(workdir / "warm-up", ignore_errors=True)
    best: dict[str, float] = {}
    for round_number in range(1, args.repeat + 1):
        for variant in VARIANTS:
            run = workdir / f"{variant}-{round_number}"
            ms, logs = _run(spark, args, source, aged, run, variant)
            print(
                f"  round {round_number} {variant:<13} addBatch median {ms:6.1f} ms; log files "
                f"after: ledger {logs[0]}, table {logs[1]}",
                flush=True,
            )
            best[variant] = min(ms, best.get(variant, ms))
            shutil.rmtree(run, ignore_errors=True)
    spark.stop()
    _report(args, best)
    return 0


def _age_ledger(path: Path, age: int, trigger_s: float) -> None:
    """A ledger as fanout made it before keeping its log short, with ``age`` marks of
    another pipeline (each its own commit, with its transactions, compacted every 32 as
    the ledger does), dated as ``age`` batches ``trigger_s`` apart would leave them."""
    from deltalake import DeltaTable, write_deltalake

    from fanout.delta_tables.io import commit_properties
    from fanout.ledger.delta import DeltaLedger
    from fanout.ledger.entry import LedgerEntry, entries_to_arrow, pipeline_app_id

    DeltaLedger(str(path), log_retention=None).open()
    table, hooks = DeltaTable(str(path)), _aging_hooks()
    for batch in range(age):
        mark = entries_to_arrow([LedgerEntry("other", "s", batch, "committed", rows=1)])
        txns = {"fanout/other/s": batch, pipeline_app_id("other", 0): batch}
        write_deltalake(
            table, mark, mode="append", commit_properties=commit_properties(txns),
            post_commithook_properties=hooks,
        )  # fmt: skip
        if batch % 32 == 31:
            table.optimize.compact()
            table.update_incremental()
    _date_log(path, trigger_s)


def _age_table(path: Path, age: int, trigger_s: float) -> None:
    """A Delta table (Delta's default log retention) with ``age`` one-row appends of
    another writer, checkpointed as delta-rs does, dated like the ledger's."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema(
        [
            ("order_id", pa.int64()),
            ("customer", pa.string()),
            ("amount", pa.float64()),
            ("qty", pa.int32()),
            ("status", pa.string()),
            ("ts", pa.timestamp("us", tz="UTC")),
        ]
    )

    def row(n: int) -> pa.Table:
        return pa.table(
            [[-1 - n], ["x"], [0.0], [1], ["new"], [pa.scalar(0, pa.timestamp("us", tz="UTC"))]],
            schema=schema,
        )

    write_deltalake(str(path), row(0))
    table, hooks = DeltaTable(str(path)), _aging_hooks()
    for n in range(1, age):
        write_deltalake(table, row(n), mode="append", post_commithook_properties=hooks)
        if n % 100 == 99:
            table.optimize.compact()
            table.update_incremental()
    _date_log(path, trigger_s)


def _date_log(path: Path, trigger_s: float) -> None:
    """Date each log file of version ``v`` ``(last - v) * trigger_s`` seconds back."""
    log = path / "_delta_log"
    files = [(int(f.name[:20]), f) for f in log.iterdir() if f.name[:20].isdigit()]
    last, now = max(v for v, _ in files), time.time()
    for version, file in files:
        then = now - (last - version) * trigger_s
        os.utime(file, (then, then))


def _log_files(path: Path) -> int:
    return sum(1 for f in (path / "_delta_log").iterdir() if f.is_file())


def _run(
    spark: Any, args: argparse.Namespace, source: Path, aged: Path, run: Path, variant: str
) -> tuple[float, tuple[int, int]]:
    """One run of ``variant``: its median addBatch (ms) and the log files left."""
    from deltalake import DeltaTable

    from fanout import FanOut
    from fanout.ledger.delta import DeltaLedger

    ledger, table = run / "ledger", run / "table"
    run.mkdir(parents=True)
    if variant.startswith("ledger_"):
        shutil.copytree(aged / "ledger", ledger)  # copy2 keeps the log files' dates
    if variant.startswith("table_"):
        shutil.copytree(aged / "table", table)
    if variant == "table_1h":
        DeltaTable(str(table)).alter.set_table_properties(
            {"delta.logRetentionDuration": TABLE_LOG_RETENTION}
        )
    fan = FanOut(
        PIPELINE,
        DeltaLedger(str(ledger), log_retention=None) if variant == "ledger_before" else str(ledger),
        [{"type": "delta", "name": SINK, "path": str(table), "engine": "rs", "mode": "append"}],
    )
    query = start_query(spark, source, fan, run / "checkpoint")
    query.awaitTermination()
    fan.close()
    if query.exception() is not None:
        raise BenchFailure(f"{variant}: the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    _verify(variant, table, ledger, args, len(progress))
    ms = statistics.median(float(p["durationMs"]["addBatch"]) for p in progress[SKIP:])
    return ms, (_log_files(ledger), _log_files(table))


def _verify(variant: str, table: Path, ledger: Path, args: argparse.Namespace, seen: int) -> None:
    from fanout.delta_tables.io import read_delta
    from fanout.ledger.delta import DeltaLedger

    n = args.rows * args.batches
    ids = [i for i in read_delta(str(table)).column("order_id").to_pylist() if i >= 0]
    if seen != args.batches or sorted(ids) != list(range(n)):
        raise BenchFailure(
            f"{variant}: {seen} batches of {args.batches}; the table holds {len(ids)} of the "
            f"{n} input rows ({len(set(ids))} distinct)"
        )
    marks = DeltaLedger(str(ledger), log_retention=None).last_committed(PIPELINE, [SINK])
    if marks != {SINK: args.batches - 1}:
        raise BenchFailure(f"{variant}: the ledger's mark is {marks}, not batch {seen - 1}")


def _report(args: argparse.Namespace, best: dict[str, float]) -> None:
    new = best["new"]
    print(
        f"\nfanout's time per batch (median addBatch, best of {args.repeat}), one Delta sink, "
        f"{args.rows} rows a batch, aged by {args.age} batches {args.trigger_s:g} s apart:"
    )
    for variant in VARIANTS:
        print(f"  {variant:<13} {best[variant]:7.1f} ms   {best[variant] / new:5.2f}x new")
    print(
        f"ledger_aged_vs_new={best['ledger_now'] / new:.3f} "
        f"ledger_before_vs_new={best['ledger_before'] / new:.3f} "
        f"table_30d_vs_new={best['table_30d'] / new:.3f} "
        f"table_1h_vs_new={best['table_1h'] / new:.3f}"
    )


if __name__ == "__main__":
    sys.exit(main())
