"""Append mode is exactly-once: the driver dies after some partitions of a batch committed
and before the ledger mark; the restart writes only the partitions not yet committed.

A restart with option ``partitions`` changed in between is refused on the driver before
any partition writes, naming the sink, the batch and the change (issue 13, hole 3); with
the old value back, the batch completes exactly once.

``fanout recover --config`` run in between (ARCHITECTURE §5, "A batch written but never
marked") must not record the sink's lost mark: ``holds_batch`` says whether the sink holds
*any part* of the batch: right for refusing a reset (the new epoch would write the
committed partitions again), wrong for recording the sink's lost mark, which says it holds
all of it. Recorded, the restart of the same checkpoint replays the batch, finds the sink
marked, and skips it whole: the partitions that never committed are lost; and ``recover``
printed "resume after batch 2: every sink holds it", a new checkpoint after which never
gives the sink those rows either.

One kill for all, of a driver subprocess; the restarts run in the test's process, which
shares nothing with the killed driver but the checkpoint, the ledger and the database (a
driver subprocess starts Spark, ~20 s)."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

from pg_data import write_files
from pg_driver import PARTITIONS, PIPELINE, drive, restart
from pgcheck import id_counts, query

from tests.in_process_cli import Cli
from tests.integration.streams import committed_marks

FILES, ROWS = 4, 60
KILL_BATCH = 2


def _config(tmp_path: Path, url: str) -> str:
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "{PIPELINE}"\nledger = "{tmp_path / "ledger"}"\n'
        f'checkpoint = "{tmp_path / "checkpoint"}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "postgres"\nname = "events"\nurl = "{url}"\ntable = "events"\n'
        f'mode = "append"\ncreate_table = true\npartitions = {PARTITIONS}\n'
    )
    return str(file)


def _recover_records_no_lost_mark(k: int, out: str) -> None:
    """What ``fanout recover`` printed (``out``) with ``k`` partitions of the killed batch
    committed."""
    # the sink holds part of batch 2: a resume after it is no resume "where every sink
    # holds it"; before, it said so, and recorded a lost mark of the whole batch
    assert "Resume after batch 2: every sink" not in out
    assert (
        f"  events: holds part of batch 2 ({k} of {PARTITIONS} partitions committed), which "
        "the ledger had no mark of: no lost mark recorded"
    ) in out
    assert f"committed partitions and writes the other {PARTITIONS - k} of {PARTITIONS}" in out
    assert "Sink events holds part of batch 2 (above): restart the old checkpoint" in out
    assert "nothing is written twice" not in out


def test_append_killed_between_partition_commits_refuses_new_partitions_then_completes_once(
    spark: Any, pg_url: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    killed = drive(tmp_path, pg_url, "--kill", str(KILL_BATCH))
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

    ran = fanout_cli("recover", "--config", _config(tmp_path, pg_url))
    assert ran.returncode == 0, ran
    _recover_records_no_lost_mark(len(committed), ran.stdout)
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    held_ids = id_counts(pg_url)
    changed = restart(spark, tmp_path, pg_url, partitions=PARTITIONS + 2)
    after = id_counts(pg_url)
    doubled = sorted(i for i, n in after.items() if n > 1)
    assert changed and after == held_ids, (
        f"the restart with partitions={PARTITIONS + 2} was not refused before writing: "
        f"{sum(after.values()) - held} more rows, "
        f"{len(doubled)} ids doubled {doubled[:8]}\n{changed[-1500:]}"
    )
    assert "PartitioningError" in changed, changed[-3000:]
    assert f"sink 'events', batch {KILL_BATCH}" in changed
    assert f"partitions {PARTITIONS}, now {PARTITIONS + 2}" in changed
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    restarted = restart(spark, tmp_path, pg_url)  # the old partitions: it completes once
    assert restarted == "", restarted[-3000:]

    ids = id_counts(pg_url)
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
