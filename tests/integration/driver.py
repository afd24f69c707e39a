"""A streaming driver run as a subprocess by the crash tests, so it can be killed hard.

usage: python driver.py WORKDIR [--kill POINT:BATCH[:SINK]] [--sinks SINKS.json]
                        [--kill-spooling BATCH:SINK] [--kill-after-letters BATCH]
                        [--plugin MODULE]
WORKDIR holds input/; the driver writes checkpoint/, ledger/ and one Delta table per sink
(the sinks of :func:`sinks`, or the list of sink configurations in SINKS.json), and with
SINKS.json its spool in spool/. ``--kill-spooling N:S`` kills the driver while it spools
batch N, after the batch's index row and before its rows, once sink S marked batch N.
``--kill-after-letters N`` kills it right after a sink wrote batch N's refused rows to a
Delta dead-letter table (a Delta sink: before its own commit). ``--plugin M`` registers
module M (imported by name) as a plugin, for a sink type of a test's own.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.*

from fanout import FanOut
from fanout.spark import local_session
from fanout.testing.faults import KILL_EXIT_CODE, KillAt
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
    parser.add_argument("--kill-spooling", help="BATCH:SINK")
    parser.add_argument("--kill-after-letters", type=int, help="BATCH")
    parser.add_argument("--plugin", help="a module to register as a plugin")
    args = parser.parse_args()
    plugins: list[object] = []
    if args.plugin:
        plugins.append(importlib.import_module(args.plugin))
    if args.kill:
        point, batch, *sink = args.kill.split(":")
        plugins.append(KillAt(point, int(batch), sink=sink[0] if sink else None))
    if args.kill_spooling:
        batch, sink = args.kill_spooling.split(":")
        _kill_spooling(int(batch), sink, args.workdir / "ledger")
    if args.kill_after_letters is not None:
        _kill_after_letters(args.kill_after_letters)
    spark = local_session("fanout-crash-driver")
    configured = json.loads(args.sinks.read_text()) if args.sinks else sinks(args.workdir)
    spool = str(args.workdir / "spool") if args.sinks else None
    fan = FanOut(PIPELINE, str(args.workdir / "ledger"), configured, plugins=plugins, spool=spool)
    run_stream(spark, args.workdir / "input", fan, args.workdir / "checkpoint")
    spark.stop()


def _kill_spooling(batch_id: int, marked: str, ledger: Path) -> None:
    """Die (no cleanup) when the spool is about to append batch ``batch_id``'s rows (its
    index row committed) and sink ``marked`` has marked the batch (waited for, at most a
    minute: it writes in a thread of its own)."""
    import time

    from deltalake import DeltaTable

    from fanout.contract.batch import txn_app_id
    from fanout.spool.table import Spool

    append_rows = Spool._append_rows

    def dying(self: Spool, arrow: object, info: object, *rest: object) -> object:
        if getattr(info, "batch_id", None) == batch_id:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                done = DeltaTable(str(ledger)).transaction_version(txn_app_id(PIPELINE, marked))
                if done is not None and done >= batch_id:
                    break
                time.sleep(0.05)
            print(f"KILL while spooling batch {batch_id}", file=sys.stderr, flush=True)
            os._exit(KILL_EXIT_CODE)
        return append_rows(self, arrow, info, *rest)  # type: ignore[arg-type]

    Spool._append_rows = dying  # type: ignore[method-assign,assignment]


def _kill_after_letters(batch_id: int) -> None:
    """Die (no cleanup) right after batch ``batch_id``'s refused rows were written to a
    Delta dead-letter table."""
    from fanout.deadletters.delta import DeltaDeadLetters

    real = DeltaDeadLetters.write

    def write(self: DeltaDeadLetters, batch: object, letters: object, **kwargs: object) -> int:
        count = real(self, batch, letters, **kwargs)  # type: ignore[arg-type]
        if getattr(batch, "batch_id", None) == batch_id and kwargs.get("source") == "refused":
            print(f"KILL after batch {batch_id}'s dead letters", file=sys.stderr, flush=True)
            os._exit(KILL_EXIT_CODE)
        return count

    DeltaDeadLetters.write = write  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    main()
