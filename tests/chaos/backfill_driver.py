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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.*

from fanout import FanOut
from fanout.spark import local_session
from tests.chaos.killer import ChaosKiller, KillPlan
from tests.chaos.lag_input import LAG_SCHEMA
from tests.integration.streams import run_stream

PIPELINE = "grows"
PG_TABLE = "grown_orders"


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
    sinks: list[dict[str, object]] = [
        {"type": "delta", "name": "lake", "path": str(args.workdir / "lake")}
    ]
    if args.after:
        sinks.append(
            {"type": "postgres", "name": "pg", "url": args.pg_url, "table": PG_TABLE,
             "keys": ["order_id"], "create_table": True, "partitions": 2,
             "backfill_from": "lake"}
        )  # fmt: skip
    spark = local_session("fanout-backfill", conf={"spark.sql.shuffle.partitions": "2"})
    fan = FanOut(
        PIPELINE,
        str(args.workdir / "ledger"),
        sinks,
        plugins=plugins,
        spool=str(args.workdir / "spool"),
        probe_interval_s=0.3,
    )
    run_stream(spark, args.workdir / "input", fan, args.workdir / "checkpoint", LAG_SCHEMA)
    fan.catch_up(timeout_s=120)
    fan.close()
    spark.stop()


if __name__ == "__main__":
    main()
