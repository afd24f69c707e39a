"""A driver run as a subprocess by test_catchup_killed.py, so it can be killed hard in a
catch-up write.

usage: python catchup_driver.py WORKDIR [backfill]

Opens the pipeline of :func:`sinks` (the Delta sink ``silver`` with ``on_failure="lag"``,
its app transactions kept 2 seconds, and ``gold``), or with ``backfill`` that of
:func:`backfill_sinks` (``silver`` added later, backfilled from ``gold``), with its ledger
and spool under ``WORKDIR``, and runs its final catch-up
(:meth:`fanout.FanOut.final_catch_up`): SIGKILL to the driver's process group (Python and
its JVM) right after the catch-up wrote batch 1 to ``silver``, before its ledger mark.
Exits 0 when nothing was caught up on batch 1.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo, for tests.*

from fanout import FanOut, hookimpl
from fanout.spark import local_session

PIPELINE = "catchupkill"
SILVER = {
    "configuration": {"delta.setTransactionRetentionDuration": "interval 2 seconds"},
    "min_txn_retention_hours": 0,
}
"""The Delta options of ``silver``: its transactions forgotten 2 s after their commit."""


def sinks(workdir: Path) -> list[dict[str, Any]]:
    """``silver`` (lags, transactions kept 2 s) and ``gold``."""
    return [
        {"type": "delta", "name": "silver", "path": str(workdir / "silver"),
         "on_failure": "lag", **SILVER},
        {"type": "delta", "name": "gold", "path": str(workdir / "gold")},
    ]  # fmt: skip


def backfill_sinks(workdir: Path) -> list[dict[str, Any]]:
    """``gold``, and ``silver`` (transactions kept 2 s) added later, backfilled from it."""
    return [
        {"type": "delta", "name": "gold", "path": str(workdir / "gold")},
        {"type": "delta", "name": "silver", "path": str(workdir / "silver"),
         "backfill_from": "gold", **SILVER},
    ]  # fmt: skip


def fan_out(workdir: Path, *plugins: object, backfill: bool = False) -> FanOut:
    """The pipeline's ``FanOut`` (``backfill``: of :func:`backfill_sinks`), its catch-up
    thread stopped (the caller drives it)."""
    configured = backfill_sinks(workdir) if backfill else sinks(workdir)
    fan = FanOut(PIPELINE, str(workdir / "ledger"), configured, retries=0, backoff_s=0,
                 parallelism=1, spool=str(workdir / "spool"), probe_interval_s=3600,
                 plugins=plugins)  # fmt: skip
    fan.catchup.stop()
    return fan


class KillAfterCatchUpWrite:
    """SIGKILL to this process group once ``silver`` wrote batch 1, before its mark."""

    @hookimpl
    def fanout_sink_done(self, info: Any, sink: str, result: Any, duration_s: float) -> None:
        """Kill the driver, its JVM with it."""
        if info.batch_id == 1 and sink == "silver":
            print("KILL after the catch-up wrote batch 1 to silver", file=sys.stderr, flush=True)
            os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> int:
    """The final catch-up, killed in its write of batch 1 to silver."""
    workdir = Path(sys.argv[1])
    spark = local_session("fanout-catchup-driver")
    fan = fan_out(workdir, KillAfterCatchUpWrite(), backfill=sys.argv[2:] == ["backfill"])
    try:
        fan.final_catch_up()
    finally:
        fan.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
