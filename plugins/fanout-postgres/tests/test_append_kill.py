"""Append mode is exactly-once: the driver dies after some partitions of a batch committed
and before the ledger mark; the restart writes only the partitions not yet committed.

A restart with option ``partitions`` changed in between is refused on the driver before
any partition writes, naming the sink, the batch and the change (issue 13, hole 3); with
the old value back, the batch completes exactly once. One kill for both: each driver run
starts Spark in a subprocess (~20 s)."""

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


def _drive(workdir: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, str(DRIVER), str(workdir), url, *extra]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=env, start_new_session=True
    )


def _ids(url: str) -> Counter[int]:
    return Counter(i for (i,) in query(url, "SELECT id FROM events"))


def test_append_killed_between_partition_commits_refuses_new_partitions_then_completes_once(
    pg_url: str, tmp_path: Path
) -> None:
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    killed = _drive(tmp_path, pg_url, "--kill", str(KILL_BATCH))
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

    held_ids = _ids(pg_url)
    changed = _drive(tmp_path, pg_url, "--partitions", str(PARTITIONS + 2))
    after = _ids(pg_url)
    doubled = sorted(i for i, n in after.items() if n > 1)
    assert changed.returncode != 0 and after == held_ids, (
        f"the restart with partitions={PARTITIONS + 2} was not refused before writing (exit "
        f"{changed.returncode}): {sum(after.values()) - held} more rows, "
        f"{len(doubled)} ids doubled {doubled[:8]}\n{changed.stderr[-1500:]}"
    )
    assert "PartitioningError" in changed.stderr, changed.stderr[-3000:]
    assert f"sink 'events', batch {KILL_BATCH}" in changed.stderr
    assert f"partitions {PARTITIONS}, now {PARTITIONS + 2}" in changed.stderr
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    restarted = _drive(tmp_path, pg_url)  # the old partitions: the batch completes once
    assert restarted.returncode == 0, restarted.stderr[-3000:]

    ids = _ids(pg_url)
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
