"""bench_core's micro benchmark: one batch written to three Delta tables by fanout's sinks
and by hand, without Spark streaming around it."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PIPELINE, SCHEMA, TARGETS, Ctx, _cleanup
from deltawriter import DeltaTarget


class _Prebuilt:
    """Stands in for a batch DataFrame whose Arrow table is already there."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def toArrow(self) -> Any:
        return self.table


def micro_writes(ctx: Ctx, reps: int = 5) -> None:
    """The write side alone, on one batch already in Arrow: how much of (a)'s extra time
    is three delta-rs writes sharing two cores, the Delta sink's own checks, the ledger."""
    from concurrent.futures import ThreadPoolExecutor

    from fanout_delta.sink import DeltaSink

    from fanout.contract.batch import Batch, BatchInfo, SharedArrow, txn_app_id
    from fanout.contract.sink import SinkContext
    from fanout.ledger.delta import DeltaLedger
    from fanout.ledger.entry import LedgerEntry

    first = sorted(ctx.source.glob("part-*.json"))[0]
    table = ctx.spark.read.schema(SCHEMA).json(str(first)).toArrow()
    root = ctx.run_dir("micro")
    results: list[tuple[str, float]] = []

    def bench(label: str, fn: Callable[[int], Any]) -> None:
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - t0)
        results.append((label, 1000 * statistics.median(times)))

    def sinks(prefix: str) -> list[DeltaSink]:
        out = [DeltaSink(f"{prefix}{k}", path=str(root / f"{prefix}{k}")) for k in range(TARGETS)]
        for s in out:
            s.open(SinkContext(PIPELINE, ctx.spark))
        return out

    def sink_write(sink: DeltaSink, i: int, shared: SharedArrow) -> Any:
        info = BatchInfo(PIPELINE, i)
        return sink.write(
            Batch(None, info, sink.name, txn_app_id(PIPELINE, sink.name), _arrow=shared)
        )

    hand = [DeltaTarget(str(root / f"h{k}"), f"m/h{k}") for k in range(TARGETS)]
    hand3 = [DeltaTarget(str(root / f"p{k}"), f"m/p{k}") for k in range(TARGETS)]
    one, par = sinks("s"), sinks("q")
    ledger = DeltaLedger(str(root / "ledger"))
    ledger.open()
    shared = SharedArrow(_Prebuilt(table))
    with ThreadPoolExecutor(TARGETS) as pool:
        bench(
            "hand writer (txn check + write_deltalake), 1 target",
            lambda i: hand[0].write_arrow(table, i),
        )
        bench(
            "hand writer, 3 targets one after another",
            lambda i: [t.write_arrow(table, i) for t in hand],
        )
        bench(
            "hand writer, 3 targets in 3 threads",
            lambda i: list(pool.map(lambda t: t.write_arrow(table, i), hand3)),
        )
        bench("DeltaSink.write (rs), 1 target", lambda i: sink_write(one[0], i, shared))
        bench(
            "DeltaSink.write (rs), 3 targets in 3 threads",
            lambda i: list(pool.map(lambda s: sink_write(s, i, shared), par)),
        )
        bench(
            "DeltaLedger.mark_committed x 3 (one batch)",
            lambda i: [
                ledger.mark_committed(
                    LedgerEntry(PIPELINE, f"s{k}", i, "committed", rows=table.num_rows)
                )
                for k in range(TARGETS)
            ],
        )
    _cleanup(ctx, root)
    print(
        f"\nThe write side alone: one {table.num_rows}-row batch already in Arrow, "
        f"median of {reps}:"
    )
    for label, ms in results:
        print(f"  {label:<72} {ms:8.1f} ms")
