"""A Delta table restored to before a batch's commit while the batch was unmarked: the
driver (a subprocess) is killed after sink bronze wrote batch 2 and before its mark, the
user RESTOREs the table to the version before that commit (the table as of the ledger's
last mark of it), and the restart on the same checkpoint replays batch 2.

A RESTORE keeps the app transaction, so the sink found ``(app id, 2)`` recorded and
skipped the batch: its rows were not in the table while the ledger marked it committed.
The replay must write it again, once."""

from __future__ import annotations

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
FILES, ROWS = 4, 20
SINKS = ("bronze", "latest", "audit")


def test_a_batch_restored_away_before_its_mark_is_written_again_by_the_replay(
    spark: Any, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill", "sink_done:2:bronze"]
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL at sink_done batch 2 sink bronze" in killed.stderr
    assert ("bronze", 2) not in committed_marks(tmp_path / "ledger", PIPELINE)
    bronze = DeltaTable(str(tmp_path / "bronze"))
    app_id = txn_app_id(PIPELINE, "bronze")
    assert bronze.transaction_version(app_id) == 2
    assert len(delta_rows(tmp_path / "bronze")) == 3 * ROWS
    # the user rolls the table back to the ledger's last mark of it (batch 1)
    bronze.restore(_version_before(bronze, app_id, 2))
    assert DeltaTable(str(tmp_path / "bronze")).transaction_version(app_id) == 2  # kept
    assert len(delta_rows(tmp_path / "bronze")) == 2 * ROWS

    with FanOut(PIPELINE, str(tmp_path / "ledger"), sinks(tmp_path)) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    expected = {r["order_id"] for r in rows}
    for sink in ("bronze", "audit"):
        counts = id_counts(delta_rows(tmp_path / sink))
        assert sorted(expected - set(counts)) == [], f"{sink} lost rows"
        assert [i for i, c in counts.items() if c > 1] == [], f"{sink} holds duplicates"
    winners: dict[str, int] = {}
    for r in rows:
        winners[str(r["customer"])] = int(r["order_id"])
    latest = {r["customer"]: r["order_id"] for r in delta_rows(tmp_path / "latest")}
    assert latest == winners
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        (s, b): 1 for s in SINKS for b in range(FILES)
    }


def test_the_last_batch_written_again_counts_as_held_at_the_next_start(
    spark: Any, tmp_path: Path
) -> None:
    """The batch restored away is the run's last: written again by the replay, it is the
    sink's last mark, which the next start asks the table about (the lost-target check):
    held by its second commit, the run goes on, not refused with ``TargetLostError``."""
    rows = write_input(tmp_path / "input", FILES, ROWS)
    last = FILES - 1
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill", f"sink_done:{last}:bronze"]
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    bronze = DeltaTable(str(tmp_path / "bronze"))
    app_id = txn_app_id(PIPELINE, "bronze")
    bronze.restore(_version_before(bronze, app_id, last))
    with FanOut(PIPELINE, str(tmp_path / "ledger"), sinks(tmp_path)) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    assert len(delta_rows(tmp_path / "bronze")) == FILES * ROWS

    rows += write_input(tmp_path / "input", 1, ROWS, start_file=FILES)
    with FanOut(PIPELINE, str(tmp_path / "ledger"), sinks(tmp_path)) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    counts = id_counts(delta_rows(tmp_path / "bronze"))
    assert sorted({r["order_id"] for r in rows} - set(counts)) == []
    assert [i for i, c in counts.items() if c > 1] == []
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        (s, b): 1 for s in SINKS for b in range(FILES + 1)
    }


def _version_before(table: DeltaTable, app_id: str, batch_id: int) -> int:
    """The newest version of ``table`` whose app transaction ``app_id`` is before
    ``batch_id``, walking back from the latest."""
    version = table.version()
    while version >= 0:
        done = DeltaTable(table.table_uri, version=version).transaction_version(app_id)
        if done is None or done < batch_id:
            return version
        version -= 1
    raise AssertionError(f"no version of {table.table_uri} before batch {batch_id}")
