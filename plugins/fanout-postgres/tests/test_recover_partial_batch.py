"""``fanout recover --config`` and a PostgreSQL append batch the driver died in after some
of its partitions committed (ARCHITECTURE §5, "A batch written but never marked").

``holds_batch`` says whether the sink holds *any part* of the batch: right for refusing a
reset (the new epoch would write the committed partitions again), wrong for recording the
sink's lost mark, which says it holds all of it. Recorded, the restart of the same
checkpoint replays the batch, finds the sink marked, and skips it whole: the partitions
that never committed are lost; and ``recover`` prints "resume after batch 2: every sink
holds it", a new checkpoint after which never gives the sink those rows either. The driver
runs in a subprocess and is killed between partition commits (``test_append_kill``)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
import test_append_kill as kill
from pg_data import write_files
from pg_driver import PARTITIONS, PIPELINE
from pgcheck import query

from fanout.app.cli import main
from tests.integration.streams import committed_marks

FILES, ROWS, KILL_BATCH = 4, 60, 2


def _config(tmp_path: Path, url: str, mode: str = "append", partitions: int = PARTITIONS) -> str:
    keys = 'keys = ["id"]\n' if mode == "upsert" else ""
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "{PIPELINE}"\nledger = "{tmp_path / "ledger"}"\n'
        f'checkpoint = "{tmp_path / "checkpoint"}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "postgres"\nname = "events"\nurl = "{url}"\ntable = "events"\n'
        f'mode = "{mode}"\n{keys}create_table = true\npartitions = {partitions}\n'
    )
    return str(file)


def test_recover_after_a_partly_committed_batch_loses_no_row_on_restart(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    killed = kill._drive(tmp_path, pg_url, "--kill", str(KILL_BATCH))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    committed = query(
        pg_url,
        "SELECT partition FROM fanout.progress WHERE sink = 'events' AND batch_id = %s",
        (KILL_BATCH,),
    )
    assert 1 <= len(committed) < PARTITIONS  # the batch is held in part only

    capsys.readouterr()
    assert main(["recover", "--config", _config(tmp_path, pg_url)]) == 0
    out = capsys.readouterr().out
    # the sink holds part of batch 2: a resume after it is no resume "where every sink
    # holds it"; before, it said so, and recorded a lost mark of the whole batch
    assert "Resume after batch 2: every sink" not in out
    k = len(committed)
    assert (
        f"  events: holds part of batch 2 ({k} of {PARTITIONS} partitions committed), which "
        "the ledger had no mark of: no lost mark recorded"
    ) in out
    assert f"committed partitions and writes the other {PARTITIONS - k} of {PARTITIONS}" in out
    assert "Sink events holds part of batch 2 (above): restart the old checkpoint" in out
    assert "nothing is written twice" not in out

    restarted = kill._drive(tmp_path, pg_url)  # the same checkpoint: it replays batch 2
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    ids = Counter(i for (i,) in query(pg_url, "SELECT id FROM events"))
    assert ids == Counter(r["id"] for chunk in files for r in chunk)


def test_an_upsert_batch_held_in_part_stays_a_part_after_partitions_is_lowered(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The upsert's records said which partitions committed, not how many the batch was
    written in: ``holds_batch`` counted them against the ``partitions`` option when asked.
    Lowered to the committed count between the kill and ``recover``, part of the batch read
    as the whole: its lost mark was recorded, and the restart skipped the batch, losing the
    rows of the partitions that never committed. Each record now keeps the write's count."""
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    killed = kill._drive(tmp_path, pg_url, "--kill", str(KILL_BATCH), "--mode", "upsert")
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

    restarted = kill._drive(tmp_path, pg_url, "--mode", "upsert")  # replays batch 2
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    ids = Counter(i for (i,) in query(pg_url, "SELECT id FROM events"))
    assert ids == Counter(r["id"] for chunk in files for r in chunk)
