"""The driver is a subprocess killed (os._exit from a test plugin's hook) at dangerous
points; the restart on the same checkpoint leaves every sink exact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from fanout.contract.batch import txn_app_id
from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.driver import PIPELINE
from tests.integration.streams import committed_marks, delta_rows, id_counts, write_input

DRIVER = Path(__file__).with_name("driver.py")
FILES, ROWS = 5, 30
SINKS = ("bronze", "latest", "audit")


def _drive(workdir: Path, kill: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(DRIVER), str(workdir)] + (["--kill", kill] if kill else [])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _assert_exact(workdir: Path, rows: list[dict[str, object]]) -> None:
    expected = {r["order_id"] for r in rows}
    for sink in ("bronze", "audit"):
        counts = id_counts(delta_rows(workdir / sink))
        assert set(counts) == expected, f"{sink} lost rows"
        assert [i for i, c in counts.items() if c > 1] == [], f"{sink} holds duplicates"
    latest_rows = delta_rows(workdir / "latest")
    latest = {r["customer"]: r["order_id"] for r in latest_rows}
    assert len(latest_rows) == len(latest), "latest holds a key twice"
    winners: dict[str, int] = {}
    for r in rows:
        winners[str(r["customer"])] = int(r["order_id"])  # type: ignore[call-overload]
    assert latest == winners
    assert committed_marks(workdir / "ledger", PIPELINE) == {
        (s, b): 1 for s in SINKS for b in range(FILES)
    }


def test_kill_after_write_before_ledger_mark(tmp_path: Path) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    killed = _drive(tmp_path, kill="sink_done:2:bronze")
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL at sink_done batch 2 sink bronze" in killed.stderr
    # The dangerous window really happened: bronze holds batch 2, the ledger does not know.
    bronze = DeltaTable(str(tmp_path / "bronze"))
    assert bronze.transaction_version(txn_app_id(PIPELINE, "bronze")) == 2
    assert len(delta_rows(tmp_path / "bronze")) == 3 * ROWS
    assert ("bronze", 2) not in committed_marks(tmp_path / "ledger", PIPELINE)

    restarted = _drive(tmp_path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    _assert_exact(tmp_path, rows)


@pytest.mark.parametrize("kill", ["batch_start:1", "batch_end:3"])
def test_kill_before_writes_and_after_marks(tmp_path: Path, kill: str) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    killed = _drive(tmp_path, kill=kill)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    restarted = _drive(tmp_path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    _assert_exact(tmp_path, rows)
