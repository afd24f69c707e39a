"""A streaming driver with a postgres append (or upsert by ``id``) sink, run as a subprocess
so it can be killed.

usage: python pg_driver.py WORKDIR URL [--kill BATCH] [--partitions N] [--mode upsert]
                          [--dead-letter TARGET] [--kill-at-letters BATCH]
                          [--kill-after-write BATCH]

Run it in a session of its own (``start_new_session=True``, as :func:`drive` does): ``--kill``
ends the whole process group. :func:`restart` runs the same stream in the test's process.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo, for tests.*

from pg_data import SCHEMA, run_stream

from fanout import FanOut
from fanout.spark import local_session
from fanout.testing.faults import KillAt
from tests.integration.streams import run_to_end

PIPELINE = "pg-crash"
PARTITIONS = 4
REPO = Path(__file__).resolve().parents[3]


def sink_config(
    url: str, partitions: int = PARTITIONS, mode: str = "append", dead_letter: str | None = None
) -> dict[str, Any]:
    """The driver's sink ``events``: table ``events`` (created when missing) written in
    ``mode`` (an upsert keyed by ``id``) over ``partitions`` partitions, its refused rows
    sent to ``dead_letter`` when given."""
    sink: dict[str, Any] = {"type": "postgres", "name": "events", "url": url,
                            "table": "events", "mode": mode, "create_table": True,
                            "partitions": partitions}  # fmt: skip
    if mode == "upsert":
        sink["keys"] = ["id"]
    if dead_letter is not None:
        sink["dead_letter"] = dead_letter
    return sink


def drive(workdir: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run this driver in a subprocess of a session of its own (``extra``: its options), to
    its end or its kill."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, str(Path(__file__)), str(workdir), url, *extra]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=env, start_new_session=True
    )


def restart(spark: Any, workdir: Path, url: str, **sink: Any) -> str:
    """Restart a killed driver's stream in this process, as :func:`main` runs it, with the
    sink :func:`sink_config` makes of ``sink``: the text of the error it ended with, ``""``
    when it ran to the end of its input."""
    fan = FanOut(PIPELINE, str(workdir / "ledger"), [sink_config(url, **sink)])
    return run_to_end(spark, fan, workdir, SCHEMA)


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
    sink = sink_config(args.url, args.partitions, args.mode, args.dead_letter)
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
