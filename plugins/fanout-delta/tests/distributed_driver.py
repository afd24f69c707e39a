"""A pipeline driver run as a subprocess by test_delta_distributed.py, so it can be
SIGKILLed between the executors' file writes and the driver's Delta commit.

usage: python distributed_driver.py WORKDIR [--kill-before-commit BATCH]

Streams three JSON input files of 100 rows (ids 0..299; one file per micro-batch)
through FanOut into a Delta sink appending from the executors. With
``--kill-before-commit N`` the process SIGKILLs itself in batch N after the executors
wrote the batch's Parquet files, right before the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

FILES, ROWS = 3, 100


def write_input(directory: Path) -> None:
    """Input file n (batch n) holds ids n*100 .. n*100+99, each file a second apart."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(FILES):
        path = directory / f"in-{n}.json"
        if not path.exists():
            lines = [json.dumps({"id": n * ROWS + i, "v": f"v{n * ROWS + i}"}) for i in range(ROWS)]
            path.write_text("\n".join(lines) + "\n")
            os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))


def kill_before_commit(batch_id: int) -> None:
    """Replace the distributed append's commit: in batch ``batch_id`` (the transaction
    version it commits), die instead of committing."""
    from fanout.delta_tables import distributed

    real = distributed._commit

    def commit(table: Any, path: str, files: Any, schema: Any, app_id: str, version: int,
               *rest: Any) -> None:  # fmt: skip
        if version == batch_id:
            print(f"KILLED before the commit of batch {version} ({len(files)} files written)",
                  file=sys.stderr, flush=True)  # fmt: skip
            os.kill(os.getpid(), signal.SIGKILL)
        real(table, path, files, schema, app_id, version, *rest)

    distributed._commit = commit  # type: ignore[assignment]


def main() -> None:
    """Run the stream to the end of its input (or die where told)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--kill-before-commit", type=int)
    args = parser.parse_args()
    if args.kill_before_commit is not None:
        kill_before_commit(args.kill_before_commit)
    from fanout.spark import local_session

    spark = local_session("fanout-dist-kill")
    run(spark, args.workdir)
    spark.stop()


def run(spark: Any, workdir: Path) -> None:
    """Stream WORKDIR's input through FanOut with ``spark`` to the end of the input: this
    driver's run, also the test's restart of it in the test's own process."""
    from fanout import FanOut

    write_input(workdir / "input")
    lake = {"type": "delta", "name": "lake", "path": str(workdir / "lake"),
            "write_from": "executors"}  # fmt: skip
    fan = FanOut("dist", str(workdir / "ledger"), [lake])
    query = (
        spark.readStream.schema("id LONG, v STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(workdir / "input"))
        .repartition(3)
        .writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    fan.close()


if __name__ == "__main__":
    main()
