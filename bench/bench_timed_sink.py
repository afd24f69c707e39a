#!/usr/bin/env python
"""What ``write_timeout_s`` costs a healthy PostgreSQL sink: its write with and without it.

    python bench/bench_timed_sink.py [--rows 400000] [--partitions 4] [--master local[2]]
                                     [--repeat 3] [--url URL]

One batch (``bench_postgres.batch_sql``: 6 columns, ids 0..rows-1, 20% of them updating
rows already in the table), a cached Spark DataFrame, upserted by
``PostgresSink(mode="upsert", order_by="ts", partitions=P)``:

  untimed  ``sink.write(batch)``: one Spark job of P tasks, all cores.
  timed    the write as a sink with ``write_timeout_s`` runs it (``steps/timeout.py:
           TimedWrite``: a thread of its own, a job tag, ``Batch.task_budget`` = cores - 1),
           so the kit runs the P partitions in jobs of at most that many tasks
           (``partitioned/waves.py``): on ``local[2]`` one partition at a time.

Before every run the table is reset to the 20% existing rows; every run is verified by
checksum (exit 1 otherwise). Each run writes a batch id of its own (no replay skip). The
variants alternate; best of ``--repeat``. On a machine shared with other work the
numbers are indicative only. The last line is machine-readable:
``untimed_rows_s=<u> timed_rows_s=<t> ratio_timed_untimed=<t/u>``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_postgres import DDL, TABLE, Database, batch_sql, checksum_of, to_csv
from common import exit_on_sigterm

UPDATE_FRACTION = 0.2


def main() -> int:
    """Start the server (unless ``--url``), measure, print the table and the ratio."""
    args = parse_args()
    from fanout_postgres import EmbeddedPostgres

    exit_on_sigterm()
    server, url = None, args.url
    if url is None:
        server_dir = Path(tempfile.mkdtemp(prefix="fanout-bench-timed-"))
        server = EmbeddedPostgres(server_dir / "pg", delete=True)
        url = server.start()
    try:
        code, result = measure(args, url)
    finally:  # a failed check, an error or SIGTERM too: no server left behind
        if server is not None:
            server.stop()
            server_dir.rmdir()
    if result:
        print(result)
    return code


def measure(args: argparse.Namespace, url: str) -> tuple[int, str]:
    """Both variants on the server at ``url``: the exit code and the last line."""
    from fanout_postgres import PostgresSink

    from fanout.contract.batch import Batch, BatchInfo
    from fanout.contract.sessions import spark_threads
    from fanout.contract.sink import Sink, SinkContext
    from fanout.spark import local_session
    from fanout.steps.cores import task_budget
    from fanout.steps.timeout import AbandonedWrites, TimedWrite

    spark = local_session("fanout-bench-timed", master=args.master)
    existing = int(args.rows * UPDATE_FRACTION)
    batch_df = spark.sql(batch_sql(args.rows, 1)).persist()
    old_csv = to_csv(spark.sql(batch_sql(existing, 0)).toArrow())
    expected = checksum_of(batch_df.toArrow())
    db = Database(url)
    db.execute(DDL)
    sink = PostgresSink("bench", url=url, table=TABLE, order_by="ts", partitions=args.partitions)
    sink.open(SinkContext("bench", spark))
    batch_ids = itertools.count()
    abandoned = AbandonedWrites("bench")

    class Runner:
        """The sink's write of one batch, once (what steps/write.py's SinkRunner runs,
        without retries or ledger marks)."""

        def __init__(self, batch: Batch) -> None:
            self.sink: Sink = sink
            self.batch = batch
            self.claim: Any = None
            self.attempt = 1

        def run(self) -> Any:
            return self.sink.write(self.batch)

        def timed_out(self, error: Exception) -> None:
            raise AssertionError(f"the healthy write timed out: {error}")

    def run(timed: bool) -> float:
        db.reset(old_csv)
        info = BatchInfo("bench", next(batch_ids), "bench")
        batch = Batch(batch_df, info, "bench", "fanout/bench/timed")
        started = time.perf_counter()
        if timed:
            write = TimedWrite.start(Runner(batch), 3600.0, abandoned, spark_threads(batch_df))
            write.outcome()
        else:
            sink.write(batch)
        return time.perf_counter() - started

    print(
        f"batch: {args.rows} rows ({existing} updates), {args.partitions} partitions, "
        f"master {args.master}, task budget of a timed write: {task_budget(spark)}",
        flush=True,
    )
    run(False)  # warm-up (Python workers, codegen), not timed
    run(True)
    best: dict[str, float] = {}
    for round_number in range(args.repeat):
        order = [False, True] if round_number % 2 == 0 else [True, False]
        for timed in order:
            name = "timed" if timed else "untimed"
            seconds = run(timed)
            if db.checksum() != expected:
                print(f"VERIFY FAILED for {name}: table content differs from the batch")
                spark.stop()
                return 1, ""
            best[name] = min(best.get(name, seconds), seconds)
            print(f"  round {round_number + 1} {name:8s} {seconds:7.2f} s", flush=True)
    sink.close()
    spark.stop()
    rates = {name: args.rows / seconds for name, seconds in best.items()}
    print(f"\n{'variant':10s} {'best s':>8s} {'rows/s':>10s}")
    for name in ("untimed", "timed"):
        print(f"{name:10s} {best[name]:8.2f} {rates[name]:10.0f}")
    ratio = rates["timed"] / rates["untimed"]
    print(f"\ntimed / untimed throughput: {ratio:.2f} (indicative on a shared machine)")
    return 0, (
        f"untimed_rows_s={rates['untimed']:.0f} timed_rows_s={rates['timed']:.0f} "
        f"ratio_timed_untimed={ratio:.3f}"
    )


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--url", help="SQLAlchemy URL of a server to use instead of embedded")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(main())
