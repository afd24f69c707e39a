"""The driver is a subprocess killed (os._exit from a test plugin's hook) at dangerous
points; the restart on the same checkpoint leaves every sink exact. A restart after a
kill between the marks and Spark's commit log is a plain crash replay, never taken for a
checkpoint rolled back (test_checkpoint_reset's refusals). The last run, which no kill
ends, runs in the test's own session: a Spark start less, and the same restart on the
killed runs' checkpoint, ledger and tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from fanout import FanOut
from fanout.contract.batch import txn_app_id
from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.driver import PIPELINE, sinks
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    run_stream,
    write_input,
)

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


def test_kills_before_writes_after_a_write_before_its_mark_and_after_marks(
    spark: Any, tmp_path: Path
) -> None:
    """Three kills in a row on one checkpoint, each run restarting from the one before:
    at the start of batch 1 (before any write), after bronze wrote batch 2 and before its
    mark, after every mark of batch 3 (before Spark's commit log); the last run finishes.
    One sequence rather than a test per kill: each run starts Spark in a subprocess."""
    rows = write_input(tmp_path / "input", FILES, ROWS)
    killed = _drive(tmp_path, kill="batch_start:1")
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL at batch_start batch 1" in killed.stderr, killed.stderr[-3000:]
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {(s, 0): 1 for s in SINKS}

    killed = _drive(tmp_path, kill="sink_done:2:bronze")
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL at sink_done batch 2 sink bronze" in killed.stderr
    # The dangerous window really happened: bronze holds batch 2, the ledger does not know.
    bronze = DeltaTable(str(tmp_path / "bronze"))
    assert bronze.transaction_version(txn_app_id(PIPELINE, "bronze")) == 2
    assert len(delta_rows(tmp_path / "bronze")) == 3 * ROWS
    assert ("bronze", 2) not in committed_marks(tmp_path / "ledger", PIPELINE)

    killed = _drive(tmp_path, kill="batch_end:3")
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL at batch_end batch 3" in killed.stderr, killed.stderr[-3000:]
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        (s, b): 1 for s in SINKS for b in range(4)
    }
    # every sink marked batch 3, Spark did not commit it: the restart replays it from the
    # same offsets/3 (same offsets, same planning time), which match the ledger's, so it
    # is a plain crash replay (every sink skips), not a checkpoint rolled back
    assert not (tmp_path / "checkpoint" / "commits" / "3").exists()
    planned = json.loads((tmp_path / "checkpoint" / "offsets" / "3").read_text().splitlines()[1])
    recorded = [r for r in delta_rows(tmp_path / "ledger") if r["batch_id"] == 3]
    assert {(r["sink"], r["source_offsets"]) for r in recorded} == {
        (s, '[{"logOffset": 3}]') for s in SINKS
    }
    assert {r["batch_timestamp_ms"] for r in recorded} == {planned["batchTimestampMs"]}

    # the restart: a CheckpointRollbackError (or any error) would fail the query, and
    # run_stream raises the query's exception
    with FanOut(PIPELINE, str(tmp_path / "ledger"), sinks(tmp_path)) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    _assert_exact(tmp_path, rows)
