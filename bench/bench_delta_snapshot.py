#!/usr/bin/env python
"""The Delta sink's snapshot kept between batches, against opening the table every batch.

    python bench/bench_delta_snapshot.py [--batches 30] [--rows 200] [--repeat 3]
                                         [--since 1,60] [--workdir DIR]

One ``DeltaSink`` (delta-rs, append) writes ``--batches`` Arrow batches of ``--rows`` rows
through ``DeltaSink.write``, in this process (no Spark: the time is the driver's part of a
batch), from the driver (``write_from="driver"``: ``write_deltalake``) and as the executors'
append does (``"executors"``: Parquet files, then one commit). The table starts with N
commits since its last checkpoint (``--since``; delta-rs checkpoints every 100), where
opening it reads all of them. Variants, on the same batches:

  kept    the sink as it is: each batch starts from the snapshot the last one ended on,
          brought up to date (``fanout.delta_tables.kept``)
  opened  the baseline, the same sink opening the table every batch (no kept snapshot),
          as fanout did before

The time of a batch is the median over the batches of ``--repeat`` interleaved runs, each on
a fresh table; every run is verified (the table holds every row once, each batch's app
transaction). The last line is machine-readable: ``<write_from>_<N>=<opened / kept>`` for
each case.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

PIPELINE, SINK = "snap", "bronze"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rows", type=int, default=200, help="rows a batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--since", default="1,60", help="commits since the last checkpoint")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    since = [int(n) for n in args.since.split(",")]
    if any(n < 1 or n + args.batches >= 100 for n in since):
        parser.error("each --since must be >= 1, and --since + --batches < 100 (no checkpoint)")
    ratios = {}
    print(f"ms a batch, median over {args.batches} batches x {args.repeat} runs, "
          f"{args.rows} rows a batch (DeltaSink.write, no Spark):")  # fmt: skip
    for write_from in ("driver", "executors"):
        for n in since:
            times: dict[str, list[float]] = {"kept": [], "opened": []}
            for run in range(args.repeat):
                order = ("kept", "opened") if run % 2 == 0 else ("opened", "kept")
                for variant in order:
                    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
                        table = Path(work) / "table"
                        times[variant] += _run(table, write_from, n, variant, args)
            kept, opened = (statistics.median(times[v]) for v in ("kept", "opened"))
            ratios[f"{write_from}_{n}"] = opened / kept
            print(f"  {write_from:9s} {n:3d} commits since the checkpoint: kept {kept:6.2f}  "
                  f"opened {opened:6.2f}  opened/kept {opened / kept:5.2f}")  # fmt: skip
    print(" ".join(f"{case}={ratio:.3f}" for case, ratio in ratios.items()))
    return 0


def _run(table: Path, write_from: str, since: int, variant: str, args: Any) -> list[float]:
    from deltalake import DeltaTable, write_deltalake
    from fanout_delta import DeltaSink

    from fanout.contract.batch import txn_app_id
    from fanout.contract.sink import SinkContext
    from fanout.delta_tables import io

    first = pa.table({"id": pa.array([-1], pa.int64()), "v": ["x"]})
    for commit in range(since):
        write_deltalake(str(table), first, mode="append" if commit else "error")
    sink = DeltaSink(name=SINK, path=str(table), write_from=write_from)  # type: ignore[arg-type]
    sink.open(SinkContext(pipeline=PIPELINE))
    if variant == "opened":
        sink._kept = None  # the baseline: every batch opens the table
    times = []
    for batch_id in range(args.batches):
        batch = _batch(batch_id, args.rows)
        start = time.perf_counter()
        sink.write(batch)
        times.append((time.perf_counter() - start) * 1000)
    ids = io.read_delta(str(table), columns=["id"]).column("id").to_pylist()
    expected = [-1] * since + list(range(args.batches * args.rows))
    done = DeltaTable(str(table)).transaction_version(txn_app_id(PIPELINE, SINK))
    if sorted(ids) != expected or done != args.batches - 1:
        raise SystemExit(
            f"{variant} {write_from}: the table is wrong ({len(ids)} rows, txn {done})"
        )
    return times


def _batch(batch_id: int, rows: int) -> Any:
    from fanout import testing

    ids = list(range(batch_id * rows, (batch_id + 1) * rows))
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})
    return testing.make_batch(data, batch_id=batch_id, pipeline=PIPELINE, sink_name=SINK,
                              query_id=None)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
