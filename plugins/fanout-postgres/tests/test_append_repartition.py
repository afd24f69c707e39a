"""Append mode: option ``partitions`` changed between a kill (some partitions of a batch
committed) and the restart. The restart is refused on the driver before any partition
writes, naming the sink, the batch and the change; with the old value back, the batch
completes exactly once (issue 13, hole 3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pg_data import run_stream, write_files
from pg_driver import PARTITIONS, PIPELINE
from pgcheck import query

from fanout import FanOut, PartitioningError
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from tests.integration.streams import committed_marks

DRIVER = Path(__file__).with_name("pg_driver.py")
REPO = Path(__file__).resolve().parents[3]
FILES, ROWS = 3, 60
KILL_BATCH = 1


def _drive(workdir: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, str(DRIVER), str(workdir), url, *extra],
        capture_output=True, text=True, timeout=300, env=env, start_new_session=True,
    )  # fmt: skip


def _ids(url: str) -> Counter[int]:
    return Counter(i for (i,) in query(url, "SELECT id FROM events"))


def test_partitions_changed_between_a_kill_and_the_restart_is_refused_before_writing(
    pg_url: str, tmp_path: Path
) -> None:
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    expected = {r["id"] for chunk in files for r in chunk}
    killed = _drive(tmp_path, pg_url, "--kill", str(KILL_BATCH))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    marks = query(
        pg_url,
        "SELECT partition FROM fanout.progress WHERE sink = 'events' AND batch_id = %s",
        (KILL_BATCH,),
    )
    assert 1 <= len(marks) < PARTITIONS, marks
    held = _ids(pg_url)

    changed = _drive(tmp_path, pg_url, "--partitions", str(PARTITIONS + 2))
    after = _ids(pg_url)
    doubled = sorted(i for i, n in after.items() if n > 1)
    assert changed.returncode != 0 and after == held, (
        f"the restart with partitions={PARTITIONS + 2} was not refused before writing (exit "
        f"{changed.returncode}): {sum(after.values()) - sum(held.values())} more rows, "
        f"{len(doubled)} ids doubled {doubled[:8]}\n{changed.stderr[-1500:]}"
    )
    assert "PartitioningError" in changed.stderr, changed.stderr[-3000:]
    assert f"sink 'events', batch {KILL_BATCH}" in changed.stderr
    assert f"partitions {PARTITIONS}, now {PARTITIONS + 2}" in changed.stderr
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    restored = _drive(tmp_path, pg_url)  # the old value back: the batch completes once
    assert restored.returncode == 0, restored.stderr[-3000:]
    ids = _ids(pg_url)
    assert set(ids) == expected and sum(ids.values()) == FILES * ROWS
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("events", b): 1 for b in range(FILES)
    }


def test_keyless_append_with_uuid_in_its_select_is_refused_and_keyed_is_written_once(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Append without keys hashes the whole row: uuid() there is refused at FanOut(...),
    with nothing written; with keys, only the keys must be deterministic."""
    files = write_files(tmp_path / "input", files=2, rows=20, step=20)
    route = Route(select=("*", "uuid() AS event_id"))
    options: dict[str, Any] = {"url": pg_url, "table": "events", "mode": "append",
                               "create_table": True, "partitions": 3}  # fmt: skip
    with pytest.raises(PartitioningError) as refused:
        FanOut("pg-uuid", str(tmp_path / "ledger"),
               [SinkSpec(PostgresSink("events", **options), route)])  # fmt: skip
    message = str(refused.value)
    assert (
        "sink 'events': route select expression 'uuid() AS event_id' is not deterministic"
        in message
    )
    assert "no key" in message
    assert query(pg_url, "SELECT count(*) FROM pg_tables WHERE tablename = 'events'") == [(0,)]

    keyed = PostgresSink("events", keys=["id"], **options)
    fan = FanOut("pg-uuid", str(tmp_path / "ledger"), [SinkSpec(keyed, route)])
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    got = query(pg_url, "SELECT id, length(event_id) FROM events ORDER BY id")
    assert got == [(r["id"], 36) for chunk in files for r in chunk]
