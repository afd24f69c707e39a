#!/usr/bin/env python
"""The Kafka sink's encoder alone: records built column-wise with Arrow against the
row-by-row path, on the benchmarks' own columns. No Spark, no broker.

    python bench/bench_kafka_encode.py [--rows 200000] [--repeat 7]

The rows are those of ``common.generate_input`` (``order_id BIGINT, customer STRING,
amount DOUBLE, qty INT, status STRING, ts TIMESTAMP``; the timestamp in UTC, as a Spark
session on UTC hands it to ``mapInArrow``), in Arrow batches of 10,000 rows, the size
Spark hands a task. Two ways to encode them, with the sink's own ``Encoder`` (key
``order_id``, the value the row's JSON, fanout's three headers):

  arrow  ``Encoder.encode_arrow``: the sink's path (``fanout_kafka.vector``)
  row    ``Encoder.encode_all`` over ``to_pylist()``: ``json.dumps`` per row, the
         baseline the column-wise path must equal byte for byte (checked every run)

The process's long-lived objects are frozen first, as in the sink's tasks. Each is timed
``--repeat`` times, interleaved, with ``time.process_time``; the medians are
printed in µs a record, with each column's share of the JSON value (its fragment alone)
and ``json_rows`` (every column joined into the value). bench_kafka measures the same
encoding inside Spark's tasks beside the producer, where the machine's other work moves
it; this one measures it alone, so one change to the encoder shows in one run. The last
line is machine-readable::

    encode_us_per_record=<arrow> row_us_per_record=<row> ratio_vs_row=<row / arrow>
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import STATUSES

SPARK_BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
TARGET_RATIO = 10.0  # vector.py's claim: about a tenth of the row-by-row cost


def bench_table(rows: int, seed: int = 7) -> pa.Table:
    """``rows`` rows with generate_input's values, typed as Spark reads them."""
    rng = random.Random(seed)
    base = datetime(2024, 1, 1, tzinfo=UTC)
    customers, amounts, quantities, statuses = [], [], [], []
    for _ in range(rows):  # generate_input's draws, in its order
        customers.append(f"cust_{rng.randrange(50_000):05d}")
        amounts.append(round(rng.random() * 500, 2))
        quantities.append(rng.randrange(1, 20))
        statuses.append(STATUSES[rng.randrange(len(STATUSES))])
    return pa.table(
        {
            "order_id": pa.array(range(rows), pa.int64()),
            "customer": pa.array(customers, pa.string()),
            "amount": pa.array(amounts, pa.float64()),
            "qty": pa.array(quantities, pa.int32()),
            "status": pa.array(statuses, pa.string()),
            "ts": pa.array(
                [base + timedelta(milliseconds=i * 37) for i in range(rows)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


def fragments(arrays: list[pa.Array]) -> list[Any]:
    """Each array's JSON fragments (one column of every batch)."""
    from fanout_kafka import vector

    return [vector.json_fragments(a) for a in arrays]


def median_us(work: Callable[[], Any], rows: int, repeat: int) -> float:
    """The median process CPU of ``work`` over ``repeat`` runs, in µs a row."""
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        work()
        runs.append(time.process_time() - start)
    return 1e6 * statistics.median(runs) / rows


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark; returns the last line's figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each path")
    args = parser.parse_args(argv)

    from fanout_kafka import vector
    from fanout_kafka.records import Encoder, batch_headers

    from fanout.partitioned.worker_gc import freeze_long_lived_objects

    encoder = Encoder(
        ("order_id",),
        value_column=None,
        header_columns=(),
        headers=batch_headers("bench", "kafka", 0),
        max_record_bytes=1_000_000,
    )
    table = bench_table(args.rows)
    batches = table.to_batches(max_chunksize=SPARK_BATCH_ROWS)
    pylist = table.to_pylist()
    freeze_long_lived_objects()  # as the sink's tasks do (fanout.partitioned.worker_gc)
    arrow_records, arrow_bad = encoder.encode_arrow(batches)
    if (arrow_records, arrow_bad) != encoder.encode_all(pylist) or arrow_bad:
        print("the column-wise records differ from the row-by-row ones", file=sys.stderr)
        raise SystemExit(1)

    times: dict[str, list[float]] = {"arrow": [], "row": []}
    paths: dict[str, Callable[[], Any]] = {
        "arrow": lambda: encoder.encode_arrow(batches),
        "row": lambda: encoder.encode_all(table.to_pylist()),
    }
    for r in range(args.repeat):  # interleaved, the order reversed every other round
        for name in ("arrow", "row") if r % 2 == 0 else ("row", "arrow"):
            times[name].append(median_us(paths[name], args.rows, 1))
    arrow_us, row_us = (statistics.median(times[k]) for k in ("arrow", "row"))

    print(f"{args.rows:,} rows in batches of {SPARK_BATCH_ROWS:,}, median of {args.repeat}")
    print(f"{'part':24s} {'us/record':>10s}")
    for name in table.column_names:
        column = [b.column(name) for b in batches]
        us = median_us(partial(fragments, column), args.rows, args.repeat)
        print(f"  column {name:15s} {us:10.3f}")
    tables = [pa.Table.from_batches([b]) for b in batches]
    rows_us = median_us(lambda: [vector.json_rows(t) for t in tables], args.rows, args.repeat)
    print(f"  json_rows (the values)  {rows_us:10.3f}")
    print(f"{'arrow (the sink path)':24s} {arrow_us:10.3f}   runs: "
          + ", ".join(f"{t:.3f}" for t in times["arrow"]))  # fmt: skip
    print(f"{'row (json.dumps a row)':24s} {row_us:10.3f}   runs: "
          + ", ".join(f"{t:.3f}" for t in times["row"]))  # fmt: skip
    ratio = row_us / arrow_us
    verdict = "PASS" if ratio >= TARGET_RATIO else "MISS"
    print(f"row / arrow: {ratio:.1f}x (target >= {TARGET_RATIO:.0f}) {verdict}; records equal")
    result = {"encode_us_per_record": arrow_us, "row_us_per_record": row_us,
              "ratio_vs_row": ratio}  # fmt: skip
    print(" ".join(f"{k}={v:.3f}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
