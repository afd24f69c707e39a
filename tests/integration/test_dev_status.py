"""``fanout dev status`` asks each service whether it answers: an embedded PostgreSQL
stopped by hand, while the process that started it runs on, is reported stopped."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.integration.test_dev_loop import fanout


def _postmaster(state: Path) -> int:
    found = list((state / "postgres").rglob("postmaster.pid"))
    assert len(found) == 1, found
    return int(found[0].read_text().splitlines()[0])


def test_dev_status_says_stopped_after_postgres_was_stopped_by_hand(tmp_path: Path) -> None:
    state = tmp_path / "dev"
    up = fanout("dev", "up", "--state", str(state))
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        running = fanout("dev", "status", "--state", str(state))
        assert running.returncode == 0, running.stdout + running.stderr[-2000:]
        assert running.stdout.startswith("dev services running (pid ")

        server = _postmaster(state)
        os.kill(server, signal.SIGINT)  # pg_ctl stop -m fast, by hand
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(server, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the postmaster {server} did not stop")

        stopped = fanout("dev", "status", "--state", str(state))
        assert stopped.returncode == 1, stopped.stdout + stopped.stderr[-2000:]
        pid = (state / "pid").read_text()
        assert stopped.stdout.startswith(
            f"dev services stopped: their process (pid {pid}) runs, but PostgreSQL "
            "(FANOUT_PG_URL): OperationalError: "
        ), stopped.stdout
        assert stopped.stdout.rstrip("\n").endswith(
            f". Start them again: fanout dev down --state {state} && fanout dev up --state {state}"
        )
        assert "Kafka" not in stopped.stdout  # the broker still answers
    finally:
        down = fanout("dev", "down", "--state", str(state))
    assert down.returncode == 0, down.stdout + down.stderr[-2000:]
