"""The README's local loop on the shipped example: ``fanout dev up``, ``validate``, ``run``,
``status``, ``fanout dev down`` (issue 14, item 7)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.integration.streams import delta_rows, write_input
from tests.integration.test_run_pipeline import EXAMPLE, _terminate, _wait_for_marks

FILES, ROWS = 2, 10


def fanout(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fanout.app.cli", *args],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_dev_up_validate_run_status_down(tmp_path: Path) -> None:
    state = tmp_path / "dev"
    up = fanout("dev", "up", "--state", str(state))
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        exported = dict(
            shlex.split(line.removeprefix("export "))[0].split("=", 1)
            for line in (state / "env").read_text().splitlines()
        )
        assert sorted(exported) == ["FANOUT_DATA", "FANOUT_KAFKA_BOOTSTRAP", "FANOUT_PG_URL"]
        assert up.stdout.startswith((state / "env").read_text())
        env = {**os.environ, **exported, "FANOUT_METRICS_PORT": "0"}
        data = Path(exported["FANOUT_DATA"])
        assert (data / "input").is_dir()

        checked = fanout("validate", str(EXAMPLE), env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
        assert "pipeline 'orders' is valid" in checked.stdout

        rows = write_input(data / "input", FILES, ROWS)
        log = tmp_path / "run.log"
        with log.open("wb") as out:
            run = subprocess.Popen(
                [sys.executable, "-m", "fanout.app.cli", "run", str(EXAMPLE)],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait_for_marks(data, FILES, run, log)
        _terminate(run, log)
        assert sorted(r["order_id"] for r in delta_rows(data / "bronze")) == sorted(
            r["order_id"] for r in rows
        )

        status = fanout("status", "--ledger", str(data / "_fanout" / "ledger"), env=env)
        assert status.returncode == 0, status.stderr[-2000:]
        assert all(sink in status.stdout for sink in ("bronze", "orders_pg", "order_events"))
        assert fanout("dev", "status", "--state", str(state)).returncode == 0
    finally:
        down = fanout("dev", "down", "--state", str(state))
    assert down.returncode == 0 and "dev services stopped" in down.stdout
    after = fanout("dev", "status", "--state", str(state))
    assert after.returncode == 1 and "no dev services running" in after.stdout
    assert not (state / "env").exists()
