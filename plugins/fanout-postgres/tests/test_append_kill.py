"""Append mode is exactly-once: the driver dies after some partitions of a batch committed
and before the ledger mark; the restart writes only the partitions not yet committed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from pg_data import write_files
from pg_driver import PARTITIONS, PIPELINE
from pgcheck import query

from tests.integration.streams import committed_marks

DRIVER = Path(__file__).with_name("pg_driver.py")
REPO = Path(__file__).resolve().parents[3]
FILES, ROWS = 4, 60
KILL_BATCH = 2


def _drive(workdir: Path, url: str, kill: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, str(DRIVER), str(workdir), url] + (["--kill", kill] if kill else [])
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=env, start_new_session=True
    )


def test_append_exactly_once_after_a_kill_between_partition_commits_and_the_mark(
    pg_url: str, tmp_path: Path
) -> None:
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    killed = _drive(tmp_path, pg_url, kill=str(KILL_BATCH))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    note = (tmp_path / "killed.txt").read_text()
    found = re.fullmatch(rf"KILL driver after batch {KILL_BATCH} partition (\d+)\n", note)
    assert found, note

    # The window really happened: some partitions of batch 2 committed, not all, no mark.
    marks = query(
        pg_url,
        "SELECT partition, rows FROM fanout.progress WHERE pipeline = %s "
        "AND sink = 'events' AND batch_id = %s",
        (PIPELINE, KILL_BATCH),
    )
    committed = {p for p, _ in marks}
    assert int(found.group(1)) in committed
    assert 1 <= len(committed) < PARTITIONS, marks
    held = query(pg_url, "SELECT count(*) FROM events")[0][0]
    assert held == 2 * ROWS + sum(rows for _, rows in marks)
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    restarted = _drive(tmp_path, pg_url)
    assert restarted.returncode == 0, restarted.stderr[-3000:]

    ids = Counter(i for (i,) in query(pg_url, "SELECT id FROM events"))
    expected = {r["id"] for chunk in files for r in chunk}
    assert set(ids) == expected, "rows lost"
    assert [i for i, n in ids.items() if n > 1] == [], "rows duplicated"
    assert sum(ids.values()) == FILES * ROWS
    content = sorted(query(pg_url, "SELECT id, customer, amount, version FROM events"))
    assert content == sorted(
        (r["id"], r["customer"], r["amount"], r["version"]) for chunk in files for r in chunk
    )
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("events", b): 1 for b in range(FILES)
    }
    progress = query(
        pg_url,
        "SELECT batch_id, count(*), sum(rows) FROM fanout.progress "
        "GROUP BY batch_id ORDER BY batch_id",
    )
    assert [(b, total) for b, _, total in progress] == [(b, ROWS) for b in range(FILES)]
