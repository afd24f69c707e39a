"""A fanout compaction killed (SIGKILL, in a process of its own) between its commit and
its check, after another program's ``OPTIMIZE`` of the same files committed first: its
rows are in the table twice, and the next fanout run that compacts the table (or opens
its Delta sink) takes it back, on real delta-rs tables (ARCHITECTURE §4,
:func:`fanout.delta_tables.compaction.repair_unchecked`). Before, nothing ever looked:
the rows stayed twice."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from fanout.contract.sink import SinkContext
from fanout.delta_tables.compaction import compact
from fanout.delta_tables.compaction.tags import COMMIT_TAG
from fanout.delta_tables.io import numbered_history, read_arrow
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, now_utc
from tests.kill_at import KILLED

CHECK = "fanout.delta_tables.compaction.take_back:committed_version"
"""Called first right after the compaction committed: killed before it, the compaction
is committed and unchecked."""


def _killed(kind: str, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.compaction_driver", kind, path, CHECK, "before", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )


def _ids(path: str) -> list[int]:
    return sorted(read_arrow(DeltaTable(path)).column("id").to_pylist())


def _tags(path: str) -> list[str]:
    """The fanout tags of the table's commits, oldest first."""
    infos = reversed(numbered_history(DeltaTable(path)))
    return [str(info[COMMIT_TAG]).split(" ")[0] for info in infos if COMMIT_TAG in info]


def _killed_table(tmp_path: Path) -> str:
    path = str(tmp_path / "t")
    for i in range(4):
        write_deltalake(path, pa.table({"id": [i]}), mode="append")
    run = _killed("table", path)
    assert run.returncode == KILLED, run.stderr
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3]  # both rewrites stay, unchecked
    assert _tags(path) == ["compactions", "compaction"]  # the table's mark; no taking back
    write_deltalake(path, pa.table({"id": [4]}), mode="append")  # the next run's batch
    return path


def test_the_next_compaction_takes_back_a_compaction_killed_before_its_check(
    tmp_path: Path,
) -> None:
    path = _killed_table(tmp_path)

    done = compact(DeltaTable(path), "sink 'orders' table /t", None)

    assert _ids(path) == [0, 1, 2, 3, 4]
    assert not done.taken_back and done.files_added == 1  # its own compaction stays
    assert _tags(path) == ["compactions", "compaction", "take", "compaction"]
    assert len(DeltaTable(path).file_uris()) == 1


@pytest.mark.parametrize("every", [10, None], ids=["compacting", "compact_every-removed"])
def test_the_delta_sinks_open_takes_back_a_compaction_killed_before_its_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, every: int | None
) -> None:
    """Also when the user removed ``compact_every`` after the crash: the compaction is
    among the table's newest commits."""
    from fanout_delta import DeltaSink

    path = _killed_table(tmp_path)

    sink = DeltaSink(name="orders", path=path, engine="rs", compact_every=every)
    with caplog.at_level(logging.WARNING):
        sink.open(SinkContext(pipeline="p"))

    assert _ids(path) == [0, 1, 2, 3, 4]
    assert _tags(path) == ["compactions", "compaction", "take"]
    assert "was never checked (its process ended after committing it)" in caplog.text
    # the taking back is no data change: a reader streaming the table skips it
    log = Path(path, "_delta_log", f"{DeltaTable(path).version():020d}.json").read_text()
    assert '"dataChange":true' not in log.replace(" ", "")


def test_a_sink_no_longer_compacting_takes_back_a_compaction_killed_26_commits_before(
    tmp_path: Path,
) -> None:
    """Killed, then 26 appends by other writers before the restart, and ``compact_every``
    removed: the open finds the compaction (the table holds fanout's mark of its
    compactions) and takes it back. Before, it looked at the 20 newest commits only: the
    rows stayed twice."""
    from fanout_delta import DeltaSink

    path = _killed_table(tmp_path)  # with the next run's append of id 4
    for i in range(5, 30):
        write_deltalake(path, pa.table({"id": [i]}), mode="append")

    DeltaSink(name="orders", path=path, engine="rs").open(SinkContext(pipeline="p"))

    assert _ids(path) == list(range(30))
    assert _tags(path) == ["compactions", "compaction", "take"]


def test_the_ledgers_next_compaction_takes_back_its_compaction_killed_before_its_check(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "ledger")
    ledger = DeltaLedger(path, compact_after_files=None)
    ledger.open()
    for batch_id in range(4):  # sink "a" of pipeline "orders" marks batches 0-3
        entry = LedgerEntry("orders", "a", batch_id, "committed", "q", started_at=now_utc())
        ledger.mark_committed(entry)

    run = _killed("ledger", path)

    assert run.returncode == KILLED, run.stderr
    assert sorted(r["batch_id"] for r in DeltaLedger(path).read().to_pylist()) == [
        0, 0, 1, 1, 2, 2, 3, 3
    ]  # fmt: skip
    DeltaLedger(path).maintain(vacuum_retention_hours=None, checkpoint=False, cleanup_logs=False)
    rows = DeltaLedger(path).read().to_pylist()
    assert sorted(r["batch_id"] for r in rows) == [0, 1, 2, 3]
    assert DeltaLedger(path).last_committed("orders", ["a"]) == {"a": 3}


def test_validate_tells_the_taking_back_of_a_compaction_killed_before_its_check(
    tmp_path: Path,
) -> None:
    """``fanout validate`` opens the sink changing nothing: it says what the run takes
    back; the run's open then does."""
    from fanout_delta import DeltaSink

    path = _killed_table(tmp_path)
    version = DeltaTable(path).version()
    sink = DeltaSink(name="orders", path=path, engine="rs", compact_every=10)

    checking = SinkContext(pipeline="p", checking=True)
    sink.open(checking)

    assert checking.changes == [
        f"take back the compaction committed at version 6 of {path} (its process was "
        "killed before checking it: rows are in the table twice)"
    ]
    assert DeltaTable(path).version() == version
    assert _ids(path) == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    DeltaSink(name="orders", path=path, engine="rs", compact_every=10).open(
        SinkContext(pipeline="p")
    )
    assert _ids(path) == [0, 1, 2, 3, 4]
