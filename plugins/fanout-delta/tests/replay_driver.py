"""A streaming driver run as a subprocess by test_replay_crash.py, so it can be killed hard.

usage: python replay_driver.py WORKDIR [--kill-after-write BATCH]

Reads the JSON files of ``WORKDIR/input`` (one column ``id``), one file per batch, available
now (:func:`tests.integration.streams.run_stream`), into the Delta append sink ``silver``
at ``WORKDIR/silver``, whose table keeps app transactions 2 seconds
(``delta.setTransactionRetentionDuration``; the sink's ``min_txn_retention_hours`` set to 0
to allow it), with the ledger and checkpoint under ``WORKDIR``. ``--kill-after-write N``:
SIGKILL to the driver's process group (Python and its JVM) right after ``silver`` wrote
batch N, before its ledger mark. Exits 0 once the input is consumed; 3 with the query's
error on stderr when the query fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo, for tests.*

from fanout import FanOut, hookimpl
from fanout.spark import local_session
from tests.integration.streams import run_to_end

PIPELINE = "replaycrash"


def sinks(workdir: Path) -> list[dict[str, Any]]:
    """The Delta append sink ``silver``, its transactions kept 2 seconds."""
    return [
        {
            "type": "delta",
            "name": "silver",
            "path": str(workdir / "silver"),
            "configuration": {"delta.setTransactionRetentionDuration": "interval 2 seconds"},
            "min_txn_retention_hours": 0,
        }
    ]


class KillAfterWrite:
    """SIGKILL to this process group once ``silver`` wrote batch ``batch``, before its mark."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    @hookimpl
    def fanout_sink_done(self, info: Any, sink: str, result: Any, duration_s: float) -> None:
        """Kill the driver, its JVM with it."""
        if info.batch_id == self.batch and sink == "silver":
            print(f"KILL after silver wrote batch {info.batch_id}", file=sys.stderr, flush=True)
            os.killpg(os.getpgid(0), signal.SIGKILL)


def run(spark: Any, workdir: Path, kill_after_write: int | None = None) -> str:
    """Run the stream of ``workdir/input`` to its end (:func:`run_to_end`): ``""``, or the
    text of the error the query ended with."""
    plugins = [] if kill_after_write is None else [KillAfterWrite(kill_after_write)]
    fan = FanOut(PIPELINE, str(workdir / "ledger"), sinks(workdir), plugins=plugins, retries=0)
    return run_to_end(spark, fan, workdir, "id LONG")


def main() -> int:
    """Run the stream to the end of its input, or until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--kill-after-write", type=int)
    args = parser.parse_args()
    spark = local_session("fanout-replay-driver")
    try:
        error = run(spark, args.workdir, args.kill_after_write)
    finally:
        spark.stop()
    if error:
        print(f"QUERY FAILED: {error}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
