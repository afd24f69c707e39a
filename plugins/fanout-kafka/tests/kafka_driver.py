"""A streaming driver into Kafka, run as a subprocess so an executor can SIGKILL it.

usage: python driver.py WORKDIR BOOTSTRAP TOPIC PIPELINE [--kill BATCH:PARTITION]
       [--partitions N] [--keyless] [--select EXPR ...] [--dead-letter TARGET]
       [--max-record-bytes N]

Runs on local[1]: partitions are written one after another, so "killed after partition
k committed" means partitions 0..k hold the batch and the others do not. Prints one JSON
line per sink result ("RESULT {...}").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo, for tests.*

from fanout_kafka import KafkaSink

from fanout import FanOut, hookimpl
from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkResult
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.spark import local_session
from fanout.testing import faults
from tests.integration.streams import run_stream

PARTITIONS = 4


class PrintResults:
    """Prints each sink result for the test to read."""

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """One line per written batch."""
        print("RESULT " + json.dumps({"batch": info.batch_id, **result.details}), flush=True)


def main() -> None:
    """Run the stream to the end of its input, or until an executor kills us."""
    parser = argparse.ArgumentParser()
    for name in ("workdir", "bootstrap", "topic", "pipeline"):
        parser.add_argument(name)
    parser.add_argument("--kill", help="BATCH:PARTITION")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--keyless", action="store_true", help="no key: hash the whole row")
    parser.add_argument("--select", nargs="+", help="the sink's route: select expressions")
    parser.add_argument("--dead-letter", help="the sink's dead_letter option")
    parser.add_argument("--max-record-bytes", type=int, help="the sink's max_record_bytes")
    args = parser.parse_args()
    options = {"bootstrap_servers": args.bootstrap, "topic": args.topic,
               "key": None if args.keyless else "order_id",
               "partitions": args.partitions, "dead_letter": args.dead_letter}  # fmt: skip
    if args.max_record_bytes is not None:
        options["max_record_bytes"] = args.max_record_bytes
    plugins: list[object] = [PrintResults()]
    if args.kill:
        batch, partition = map(int, args.kill.split(":"))
        plugins.append(faults.KillAt("partition_committed", batch, partition=partition,
                                     driver_pid=os.getpid()))  # fmt: skip
    sink = KafkaSink("events", **options)
    spark = local_session("fanout-kafka-driver", master="local[1]")
    workdir = Path(args.workdir)
    spec = SinkSpec(sink, Route(select=tuple(args.select) if args.select else None))
    fan = FanOut(args.pipeline, str(workdir / "ledger"), [spec], plugins=plugins)
    run_stream(spark, workdir / "input", fan, workdir / "checkpoint")
    spark.stop()


if __name__ == "__main__":
    main()
