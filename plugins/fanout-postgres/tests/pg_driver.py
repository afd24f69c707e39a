"""A streaming driver with a postgres append (or upsert by ``id``) sink, run as a subprocess
so it can be killed.

usage: python pg_driver.py WORKDIR URL [--kill BATCH] [--partitions N] [--mode upsert]
                          [--dead-letter TARGET]

Run it in a session of its own (``start_new_session=True``): ``--kill`` ends the whole
process group.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo, for tests.*

from pg_data import run_stream

from fanout import FanOut
from fanout.spark import local_session
from fanout.testing.faults import KillAt

PIPELINE = "pg-crash"
PARTITIONS = 4


def main() -> None:
    """Write every input file to the table ``events`` until the input ends (or death)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("url")
    parser.add_argument("--kill", type=int, default=-1, help="kill during this batch")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--mode", choices=("append", "upsert"), default="append")
    parser.add_argument("--dead-letter", help="the sink's dead_letter option")
    args = parser.parse_args()
    killer = KillAt(
        "partition_committed",
        args.kill,
        driver_pid=os.getpid(),
        group=True,
        note=str(args.workdir / "killed.txt"),
    )
    sink = {"type": "postgres", "name": "events", "url": args.url, "table": "events",
            "mode": args.mode, "create_table": True, "partitions": args.partitions}  # fmt: skip
    if args.mode == "upsert":
        sink["keys"] = ["id"]
    if args.dead_letter:
        sink["dead_letter"] = args.dead_letter
    spark = local_session("fanout-pg-crash-driver")
    fan = FanOut(PIPELINE, str(args.workdir / "ledger"), [sink], plugins=[killer])
    run_stream(spark, args.workdir / "input", fan, args.workdir / "checkpoint")
    spark.stop()


if __name__ == "__main__":
    main()
