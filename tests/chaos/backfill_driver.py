"""A pipeline that gains a sink: run as a subprocess so it can be SIGKILLed.

usage: python -m tests.chaos.backfill_driver WORKDIR PG_URL (--before | --after) [--kill JSON]

``--before``: one Delta sink, ``lake``. ``--after``: ``lake`` and a PostgreSQL upsert sink
``pg`` with ``backfill_from="lake"``: it first receives every batch ``lake`` holds, in
order, then the live ones; the run ends by catching up whatever ``pg`` still misses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.*

from fanout import FanOut
from fanout.spark import local_session
from tests.chaos.killer import ChaosKiller, KillPlan
from tests.chaos.lag_input import LAG_SCHEMA
from tests.integration.streams import run_stream

PIPELINE = "grows"
PG_TABLE = "grown_orders"
SHUFFLE = "spark.sql.shuffle.partitions"


def main() -> None:
    """Run the stream to the end of its input, then catch up; unless killed first."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("pg_url")
    phase = parser.add_mutually_exclusive_group(required=True)
    phase.add_argument("--before", action="store_true")
    phase.add_argument("--after", action="store_true")
    parser.add_argument("--kill", help="a KillPlan as JSON")
    args = parser.parse_args()
    plugins = [ChaosKiller(KillPlan(**json.loads(args.kill)))] if args.kill else []
    spark = local_session("fanout-backfill", conf={SHUFFLE: "2"})
    run_pipeline(spark, args.workdir, args.pg_url, after=args.after, plugins=plugins)
    spark.stop()


def run_pipeline(
    spark: Any, workdir: Path, pg_url: str, *, after: bool, plugins: list[object] | None = None
) -> None:
    """One run of the pipeline in ``spark``, then its catch-up: the driver's run, and the
    runs a test makes in its own session where no kill is planned (two shuffle partitions,
    as in the driver's session, while it runs)."""
    sinks: list[dict[str, object]] = [
        {"type": "delta", "name": "lake", "path": str(workdir / "lake")}
    ]
    if after:
        sinks.append(
            {"type": "postgres", "name": "pg", "url": pg_url, "table": PG_TABLE,
             "keys": ["order_id"], "create_table": True, "partitions": 2,
             "backfill_from": "lake"}
        )  # fmt: skip
    shuffle = spark.conf.get(SHUFFLE)
    spark.conf.set(SHUFFLE, "2")
    fan = FanOut(
        PIPELINE,
        str(workdir / "ledger"),
        sinks,
        plugins=plugins or [],
        spool=str(workdir / "spool"),
        probe_interval_s=0.3,
    )
    try:
        run_stream(spark, workdir / "input", fan, workdir / "checkpoint", LAG_SCHEMA)
        fan.catch_up(timeout_s=120)
    finally:
        fan.close()
        spark.conf.set(SHUFFLE, shuffle)


if __name__ == "__main__":
    main()
