"""A streaming driver with a postgres append (or upsert by ``id``) sink, run as a subprocess
so it can be killed.

usage: python pg_driver.py WORKDIR URL [--kill BATCH] [--partitions N] [--mode upsert]
                          [--dead-letter TARGET] [--kill-at-letters BATCH]
                          [--kill-after-write BATCH]

Run it in a session of its own (``start_new_session=True``): ``--kill`` ends the whole
process group.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

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
    parser.add_argument(
        "--kill-at-letters", type=int, default=-1,
        help="kill as the driver writes this batch's refused rows to a Delta dead-letter table",
    )  # fmt: skip
    parser.add_argument(
        "--kill-after-write", type=int, default=-1,
        help="kill once the sink wrote this batch (its dead letters too), before its mark",
    )  # fmt: skip
    args = parser.parse_args()
    killer = KillAt(
        "partition_committed",
        args.kill,
        driver_pid=os.getpid(),
        group=True,
        note=str(args.workdir / "killed.txt"),
    )
    if args.kill_after_write >= 0:
        killer = KillAt("sink_done", args.kill_after_write, sink="events",
                        note=str(args.workdir / "killed.txt"))  # fmt: skip
    sink = {"type": "postgres", "name": "events", "url": args.url, "table": "events",
            "mode": args.mode, "create_table": True, "partitions": args.partitions}  # fmt: skip
    if args.mode == "upsert":
        sink["keys"] = ["id"]
    if args.dead_letter:
        sink["dead_letter"] = args.dead_letter
    if args.kill_at_letters >= 0:
        _kill_at_letters(args.kill_at_letters, args.workdir / "killed.txt")
    spark = local_session("fanout-pg-crash-driver")
    fan = FanOut(PIPELINE, str(args.workdir / "ledger"), [sink], plugins=[killer])
    run_stream(spark, args.workdir / "input", fan, args.workdir / "checkpoint")
    spark.stop()


def _kill_at_letters(batch_id: int, note: Path) -> None:
    """Kill this process group (the driver and its Spark) when the driver is about to write
    batch ``batch_id``'s refused rows to a Delta dead-letter table: every partition of the
    batch committed, its ledger mark not written."""
    from fanout.deadletters.delta import DeltaDeadLetters

    real = DeltaDeadLetters.write

    def write(self: DeltaDeadLetters, batch: Any, letters: Any, **kwargs: Any) -> int:
        if batch.batch_id == batch_id and kwargs.get("source") == "refused":
            note.write_text(f"KILL driver at batch {batch_id}'s dead letters\n")
            os.killpg(os.getpid(), signal.SIGKILL)
        return real(self, batch, letters, **kwargs)

    DeltaDeadLetters.write = write  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
