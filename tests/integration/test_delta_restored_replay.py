"""A Delta table restored to before a batch's commit while the batch was unmarked: the
driver (a subprocess) is killed after sink bronze wrote batch 2 and before its mark, the
user RESTOREs the table to the version before that commit (the table as of the ledger's
last mark of it), the restart on the same checkpoint replays batch 2 (the input's last),
and a later run starts after it.

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
FILES, ROWS = 3, 20
KILL_BATCH = FILES - 1  # the run's last batch: the replay writes it again as the last mark
SINKS = ("bronze", "latest", "audit")


def test_a_batch_restored_away_before_its_mark_is_written_again_then_held_at_the_next_start(
    spark: Any, tmp_path: Path
) -> None:
    """One kill for both checks (each kill is a driver subprocess starting Spark): after
    bronze wrote batch 2, the input's last, before its mark. The table restored away from
    it, the replay writes it again, once. The batch written again is then the sink's last
    mark, which the next start asks the table about (the lost-target check): held by its
    second commit, the run goes on, not refused with ``TargetLostError``."""
    rows = write_input(tmp_path / "input", FILES, ROWS)
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill", f"sink_done:{KILL_BATCH}:bronze"]
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert f"KILL at sink_done batch {KILL_BATCH} sink bronze" in killed.stderr
    assert ("bronze", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)
    bronze = DeltaTable(str(tmp_path / "bronze"))
    app_id = txn_app_id(PIPELINE, "bronze")
    assert bronze.transaction_version(app_id) == KILL_BATCH
    assert len(delta_rows(tmp_path / "bronze")) == (KILL_BATCH + 1) * ROWS
    # the user rolls the table back to the ledger's last mark of it (batch 1)
    bronze.restore(_version_before(bronze, app_id, KILL_BATCH))
    assert DeltaTable(str(tmp_path / "bronze")).transaction_version(app_id) == KILL_BATCH  # kept
    assert len(delta_rows(tmp_path / "bronze")) == KILL_BATCH * ROWS

    with FanOut(PIPELINE, str(tmp_path / "ledger"), sinks(tmp_path)) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    _assert_exact(tmp_path, rows, FILES)

    rows += write_input(tmp_path / "input", 1, ROWS, start_file=FILES)
    with FanOut(PIPELINE, str(tmp_path / "ledger"), sinks(tmp_path)) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    _assert_exact(tmp_path, rows, FILES + 1)


def _assert_exact(workdir: Path, rows: list[dict[str, Any]], batches: int) -> None:
    expected = {r["order_id"] for r in rows}
    for sink in ("bronze", "audit"):
        counts = id_counts(delta_rows(workdir / sink))
        assert sorted(expected - set(counts)) == [], f"{sink} lost rows"
        assert [i for i, c in counts.items() if c > 1] == [], f"{sink} holds duplicates"
    assert len(delta_rows(workdir / "bronze")) == len(rows)
    winners: dict[str, int] = {}
    for r in rows:
        winners[str(r["customer"])] = int(r["order_id"])
    latest = {r["customer"]: r["order_id"] for r in delta_rows(workdir / "latest")}
    assert latest == winners
    assert committed_marks(workdir / "ledger", PIPELINE) == {
        (s, b): 1 for s in SINKS for b in range(batches)
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
