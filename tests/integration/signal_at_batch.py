"""``fanout run PIPELINE.toml`` in a process of its own, with SIGTERM placed at the start
of a chosen batch, in the window in which Spark has begun the batch and ``fanout run`` has
not seen it (its tracker idle): a window no hook of fanout's reaches.

usage: python signal_at_batch.py PIPELINE.toml BATCH entry|context

As batch BATCH enters the foreachBatch function (``entry``), or once fanout read the
batch's context, its first step (``context``), the process sends itself SIGTERM and waits
until ``fanout run`` reacted: it calls Spark's ``query.stop()`` (its ``fanout-stop``
thread; then half a second for Spark to interrupt the query), or it waits for the batch (a
fanout whose stop gate, closed, holds the batch). Then the batch goes on as it would have:
the order a signal arriving right after Spark began the batch gives, made certain. Every
other batch, and the run's exit code, are ``fanout run``'s own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.*

from fanout.app.cli import main as cli_main
from fanout.fan_out import FanOut
from fanout.steps.context import ContextReader

WAIT_S = 60.0
AFTER_STOP_S = 0.5  # Spark's stop() interrupts the query's thread right after


def _reacted(fan: FanOut) -> bool:
    """Whether ``fanout run`` reacted to the signal. Asked of Python only: a call into the
    JVM from the batch's thread would run in the query's thread, which ``query.stop()``
    interrupts, and could end it before the batch does."""
    gate = getattr(fan, "stop_gate", None)
    if gate is not None and gate.closed and gate.inside is not None:
        return True
    return any(t.name == "fanout-stop" for t in threading.enumerate())


def stopped_run(config: Path, batch: int, point: str = "entry") -> str:
    """Run this driver on ``config`` (``fanout run`` signalled at ``point`` of ``batch``), in
    a process of its own, and check that the signal came there and the run ended cleanly
    (exit 0): its output, stdout then the end of stderr."""
    done = subprocess.run(
        [sys.executable, __file__, str(config), str(batch), point],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr[-6000:]
    assert f"SIGNAL at {point} of batch {batch}" in out, out
    assert done.returncode == 0, out
    return out


def main() -> int:
    """Run ``fanout run`` with the signal placed; its exit code."""
    config, at, point = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    call, read = FanOut.__call__, ContextReader.read
    running: list[FanOut] = []

    def signal_and_wait(batch_df: Any, batch_id: int) -> None:
        print(f"SIGNAL at {point} of batch {batch_id}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + WAIT_S
        while not _reacted(running[0]):
            assert time.monotonic() < deadline, "fanout run did not react to SIGTERM"
            time.sleep(0.05)
        time.sleep(AFTER_STOP_S)

    def entered(self: FanOut, batch_df: Any, batch_id: int) -> None:
        running[:] = [self]
        if batch_id == at and point == "entry":
            signal_and_wait(batch_df, batch_id)
        call(self, batch_df, batch_id)

    def context_read(self: ContextReader, batch_df: Any, batch_id: int) -> Any:
        info = read(self, batch_df, batch_id)
        if batch_id == at and point == "context":
            signal_and_wait(batch_df, batch_id)
        return info

    FanOut.__call__ = entered  # type: ignore[method-assign]
    ContextReader.read = context_read  # type: ignore[method-assign]
    return cli_main(["run", config])


if __name__ == "__main__":
    sys.exit(main())
