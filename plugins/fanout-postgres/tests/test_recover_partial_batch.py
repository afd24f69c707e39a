"""``fanout recover --config`` and a PostgreSQL upsert batch the driver died in after some
of its partitions committed (ARCHITECTURE §5, "A batch written but never marked"): the
sink holds part of the batch, never recorded as the whole, also when ``partitions`` was
lowered between the kill and the recover. The append case is checked on the kill of
``test_append_kill``. The driver runs in a subprocess and is killed between partition
commits; the restart after ``recover`` runs in the test's process (a restarted driver
knows of the killed one only the checkpoint, the ledger and the database: a second driver
subprocess would only add a Spark start)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pg_data import write_files
from pg_driver import PARTITIONS, PIPELINE, drive, restart
from pgcheck import id_counts, query

from fanout.app.cli import main
from tests.integration.streams import committed_marks

FILES, ROWS, KILL_BATCH = 4, 60, 2


def _config(tmp_path: Path, url: str, mode: str, partitions: int) -> str:
    keys = 'keys = ["id"]\n' if mode == "upsert" else ""
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "{PIPELINE}"\nledger = "{tmp_path / "ledger"}"\n'
        f'checkpoint = "{tmp_path / "checkpoint"}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "postgres"\nname = "events"\nurl = "{url}"\ntable = "events"\n'
        f'mode = "{mode}"\n{keys}create_table = true\npartitions = {partitions}\n'
    )
    return str(file)


def test_an_upsert_batch_held_in_part_stays_a_part_after_partitions_is_lowered(
    spark: Any, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The upsert's records said which partitions committed, not how many the batch was
    written in: ``holds_batch`` counted them against the ``partitions`` option when asked.
    Lowered to the committed count between the kill and ``recover``, part of the batch read
    as the whole: its lost mark was recorded, and the restart skipped the batch, losing the
    rows of the partitions that never committed. Each record now keeps the write's count."""
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    killed = drive(tmp_path, pg_url, "--kill", str(KILL_BATCH), "--mode", "upsert")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    committed = query(
        pg_url,
        "SELECT partition, partitions FROM fanout.upsert_routes WHERE sink = 'events' "
        "AND batch_id = %s",
        (KILL_BATCH,),
    )
    k = len(committed)
    assert 1 <= k < PARTITIONS  # the batch is held in part only
    assert {count for _, count in committed} == {PARTITIONS}

    capsys.readouterr()
    lowered = _config(tmp_path, pg_url, mode="upsert", partitions=k)
    assert main(["recover", "--config", lowered]) == 0
    out = capsys.readouterr().out
    assert (
        f"  events: holds part of batch 2 ({k} of {PARTITIONS} partitions committed), which "
        "the ledger had no mark of: no lost mark recorded"
    ) in out
    assert "Resume after batch 2: every sink" not in out
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    assert restart(spark, tmp_path, pg_url, mode="upsert") == ""  # replays batch 2
    ids = id_counts(pg_url)
    assert ids == Counter(r["id"] for chunk in files for r in chunk)
