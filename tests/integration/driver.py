"""A streaming driver run as a subprocess by the crash tests, so it can be killed hard.

usage: python driver.py WORKDIR [--kill POINT:BATCH[:SINK]] [--sinks SINKS.json]
WORKDIR holds input/; the driver writes checkpoint/, ledger/ and one Delta table per sink
(the sinks of :func:`sinks`, or the list of sink configurations in SINKS.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.*

from fanout import FanOut
from fanout.spark import local_session
from fanout.testing.faults import KillAt
from tests.integration.streams import run_stream

PIPELINE = "crash"


def sinks(workdir: Path) -> list[dict[str, object]]:
    """Three Delta sinks: two appends and a merge."""
    return [
        {"type": "delta", "name": "bronze", "path": str(workdir / "bronze")},
        {
            "type": "delta",
            "name": "latest",
            "path": str(workdir / "latest"),
            "mode": "merge",
            "keys": ["customer"],
            "order_by": "order_id",
        },
        {"type": "delta", "name": "audit", "path": str(workdir / "audit")},
    ]


def main() -> None:
    """Run the stream to the end of its input, or until the fault plugin kills us."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--kill", help="POINT:BATCH[:SINK]")
    parser.add_argument("--sinks", type=Path, help="a JSON list of sink configurations")
    args = parser.parse_args()
    plugins = []
    if args.kill:
        point, batch, *sink = args.kill.split(":")
        plugins.append(KillAt(point, int(batch), sink=sink[0] if sink else None))
    spark = local_session("fanout-crash-driver")
    configured = json.loads(args.sinks.read_text()) if args.sinks else sinks(args.workdir)
    fan = FanOut(PIPELINE, str(args.workdir / "ledger"), configured, plugins=plugins)
    run_stream(spark, args.workdir / "input", fan, args.workdir / "checkpoint")
    spark.stop()


if __name__ == "__main__":
    main()
