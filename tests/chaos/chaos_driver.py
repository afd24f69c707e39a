"""The pipeline under chaos, run as a subprocess so it can be SIGKILLed.

usage: python -m tests.chaos.chaos_driver WORKDIR PG_URL BOOTSTRAP [--kill JSON]
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
from tests.integration.streams import run_stream

PIPELINE = "chaos"
PG_TABLE = "chaos_orders"
TOPIC = "chaos-orders"
SINKS = ("lake", "pg", "bus")


def sinks(workdir: Path, pg_url: str, bootstrap: str) -> list[dict[str, object]]:
    """Delta (append), PostgreSQL (upsert) and Kafka (transactional)."""
    return [
        {"type": "delta", "name": "lake", "path": str(workdir / "lake")},
        {"type": "postgres", "name": "pg", "url": pg_url, "table": PG_TABLE,
         "keys": ["order_id"], "create_table": True, "partitions": 4},
        {"type": "kafka", "name": "bus", "bootstrap_servers": bootstrap, "topic": TOPIC,
         "key": "order_id", "partitions": 4},
    ]  # fmt: skip


def main() -> None:
    """Run the stream to the end of its input, unless the chaos plugin kills us first."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("pg_url")
    parser.add_argument("bootstrap")
    parser.add_argument("--kill", help="a KillPlan as JSON")
    args = parser.parse_args()
    plugins = [ChaosKiller(KillPlan(**json.loads(args.kill)))] if args.kill else []
    spark = local_session("fanout-chaos", conf={"spark.sql.shuffle.partitions": "4"})
    fan = FanOut(
        PIPELINE,
        str(args.workdir / "ledger"),
        sinks(args.workdir, args.pg_url, args.bootstrap),
        plugins=plugins,
        backoff_s=0.2,
    )
    run_stream(spark, args.workdir / "input", fan, args.workdir / "checkpoint")
    spark.stop()


if __name__ == "__main__":
    main()
