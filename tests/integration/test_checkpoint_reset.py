"""A deleted or rolled-back checkpoint makes fanout refuse to write, saying what the
ledger knows; a plain crash replay of the same batch still skips what was written (the
killed driver's replay: test_hard_kill, its kill after the marks of batch 3)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from fanout import FanOut
from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.driver import PIPELINE, sinks
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    run_stream,
    write_input,
)

SINKS = tuple(str(s["name"]) for s in sinks(Path(".")))


def _fan(tmp_path: Path) -> FanOut:
    return FanOut(
        "reset",
        str(tmp_path / "ledger"),
        [
            {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze")},
            {"type": "delta", "name": "silver", "path": str(tmp_path / "silver")},
        ],
    )


def test_deleted_checkpoint_is_refused(spark: Any, tmp_path: Path) -> None:
    write_input(tmp_path / "input", 3, 10)
    run_stream(spark, tmp_path / "input", _fan(tmp_path), tmp_path / "checkpoint")
    first_query = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    assert len(delta_rows(tmp_path / "bronze")) == 30

    shutil.rmtree(tmp_path / "checkpoint")
    write_input(tmp_path / "input", 1, 10, start_file=3)
    with pytest.raises(StreamingQueryException) as refused:
        run_stream(spark, tmp_path / "input", _fan(tmp_path), tmp_path / "checkpoint")

    message = str(refused.value)
    assert "CheckpointResetError" in message
    assert "checkpoint reset detected" in message
    assert "Spark handed batch 0 of query" in message
    for sink in ("bronze", "silver"):
        assert f"- {sink}: batch 2, query id {first_query}, source offsets " in message
    assert 'source offsets [{"logOffset": 2}]' in message
    assert "How to proceed" in message and "Restore the original checkpoint" in message
    # nothing was written under the new checkpoint
    assert len(delta_rows(tmp_path / "bronze")) == 30
    assert len(delta_rows(tmp_path / "silver")) == 30
    assert committed_marks(tmp_path / "ledger", "reset") == {
        (s, b): 1 for s in ("bronze", "silver") for b in range(3)
    }


def test_new_epoch_continues_after_the_old_offsets(spark: Any, tmp_path: Path) -> None:
    old = write_input(tmp_path / "input", 3, 10)
    run_stream(spark, tmp_path / "input", _fan(tmp_path), tmp_path / "checkpoint")
    shutil.rmtree(tmp_path / "checkpoint")
    # the new query starts after what the old one read: here, only the new files
    shutil.move(tmp_path / "input", tmp_path / "input-done")
    new = write_input(tmp_path / "input", 2, 10, start_file=3)

    fan = FanOut(
        "reset",
        str(tmp_path / "ledger"),
        [
            {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze")},
            {"type": "delta", "name": "silver", "path": str(tmp_path / "silver")},
        ],
        on_checkpoint_reset="new_epoch",
    )
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    expected = sorted(r["order_id"] for r in old + new)
    for sink in ("bronze", "silver"):
        assert sorted(r["order_id"] for r in delta_rows(tmp_path / sink)) == expected
    ledger = delta_rows(tmp_path / "ledger")
    first_query = next(r["query_id"] for r in ledger if r["epoch"] == 0)
    epochs = sorted(
        (r["epoch"], r["batch_id"], r["query_id"] == first_query)
        for r in ledger
        if r["status"] == "epoch"
    )
    assert epochs == [(0, 0, True), (1, 0, False)]  # the first query's claim, the reset
    marks = sorted(
        (r["epoch"], r["sink"], r["batch_id"]) for r in ledger if r["status"] == "committed"
    )
    assert marks == sorted(
        [(0, s, b) for s in ("bronze", "silver") for b in range(3)]
        + [(1, s, b) for s in ("bronze", "silver") for b in range(2)]
    )


# -- a rolled-back checkpoint: same query id, batches re-planned (issue 13, hole 2) ------


def _run_all_new_files(spark: Any, input_dir: Path, fan: FanOut, checkpoint: Path) -> None:
    """One batch for every file not yet read: a re-planned batch then takes in more than
    the batch of the same id did the first time."""
    run_stream(spark, input_dir, fan, checkpoint, files_per_batch=None)


def _run_batches(spark: Any, tmp_path: Path, first: int, count: int) -> list[dict[str, Any]]:
    """``count`` batches of one new input file each, ``first`` the first file's number."""
    rows: list[dict[str, Any]] = []
    for n in range(first, first + count):
        rows += write_input(tmp_path / "input", 1, 10, start_file=n)
        _run_all_new_files(spark, tmp_path / "input", _fan(tmp_path), tmp_path / "checkpoint")
    return rows


def _refusal(spark: Any, tmp_path: Path) -> str:
    with pytest.raises(StreamingQueryException) as refused:
        _run_all_new_files(spark, tmp_path / "input", _fan(tmp_path), tmp_path / "checkpoint")
    return str(refused.value)


def _order_ids(sink: Path) -> list[int]:
    return sorted(r["order_id"] for r in delta_rows(sink))


@pytest.mark.parametrize("rolled_back", [1, 2])
def test_checkpoint_restored_from_a_backup_is_refused(
    spark: Any, tmp_path: Path, rolled_back: int
) -> None:
    """Batches 0-2 run, the checkpoint is copied, ``rolled_back`` more batches run, the
    copy is restored and a new file arrives: Spark re-plans batch 3 from the end of batch 2
    to the newest file (the file source's offset is again ``{"logOffset": 3}``), and every
    sink's mark says it holds batch 3 already."""
    rows = _run_batches(spark, tmp_path, 0, 3)
    shutil.copytree(tmp_path / "checkpoint", tmp_path / "backup")
    rows += _run_batches(spark, tmp_path, 3, rolled_back)
    query_id = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    replaced = tmp_path / "checkpoint" / "offsets" / "3"
    original_timestamp = json.loads(replaced.read_text().splitlines()[1])["batchTimestampMs"]
    shutil.rmtree(tmp_path / "checkpoint")
    shutil.copytree(tmp_path / "backup", tmp_path / "checkpoint")
    write_input(tmp_path / "input", 1, 10, start_file=3 + rolled_back)

    message = _refusal(spark, tmp_path)

    assert "CheckpointRollbackError" in message
    assert (
        f"pipeline 'reset': checkpoint rolled back. Spark handed batch 3 of query {query_id}"
        in message
    )
    assert 'Spark re-planned batch 3: source offsets [{"logOffset": 3}], planned at ' in message
    assert (
        f'the ledger recorded batch 3: source offsets [{{"logOffset": 3}}], planned at '
        f"{original_timestamp} (" in message
    )
    high = 2 + rolled_back
    for sink in ("bronze", "silver"):
        assert f"- {sink}: batch {high}, query id {query_id}, source offsets " in message
    assert "Restore the newest checkpoint" in message
    # nothing was written after the refusal: each sink holds exactly the batches run
    expected = sorted(r["order_id"] for r in rows)
    assert _order_ids(tmp_path / "bronze") == _order_ids(tmp_path / "silver") == expected
    assert committed_marks(tmp_path / "ledger", "reset") == {
        (s, b): 1 for s in ("bronze", "silver") for b in range(high + 1)
    }


def test_deleted_newest_offsets_and_commits_are_refused(spark: Any, tmp_path: Path) -> None:
    """The newest ``offsets/N`` and ``commits/N`` deleted (the file source's own log kept):
    Spark re-plans batch 3 with the files of batch 3 and the new one, ``{"logOffset": 4}``."""
    rows = _run_batches(spark, tmp_path, 0, 4)
    for log_dir in ("offsets", "commits"):
        (tmp_path / "checkpoint" / log_dir / "3").unlink()
        (tmp_path / "checkpoint" / log_dir / ".3.crc").unlink(missing_ok=True)
    write_input(tmp_path / "input", 1, 10, start_file=4)

    message = _refusal(spark, tmp_path)

    assert "CheckpointRollbackError" in message
    assert "checkpoint rolled back. Spark handed batch 3 of query" in message
    assert 'Spark re-planned batch 3: source offsets [{"logOffset": 4}]' in message
    assert 'the ledger recorded batch 3: source offsets [{"logOffset": 3}]' in message
    expected = sorted(r["order_id"] for r in rows)
    assert _order_ids(tmp_path / "bronze") == _order_ids(tmp_path / "silver") == expected
    assert committed_marks(tmp_path / "ledger", "reset") == {
        (s, b): 1 for s in ("bronze", "silver") for b in range(4)
    }


def test_deleted_newest_commit_alone_is_a_plain_replay(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only ``commits/3`` deleted: Spark replays batch 3 from the same ``offsets/3``, as after
    a crash; the sinks skip it, and the new file arrives in batch 4, exactly once."""
    rows = _run_batches(spark, tmp_path, 0, 4)
    (tmp_path / "checkpoint" / "commits" / "3").unlink()
    (tmp_path / "checkpoint" / "commits" / ".3.crc").unlink(missing_ok=True)
    rows += write_input(tmp_path / "input", 1, 10, start_file=4)

    with caplog.at_level(logging.INFO, logger="fanout"):
        _run_all_new_files(spark, tmp_path / "input", _fan(tmp_path), tmp_path / "checkpoint")

    assert "pipeline reset, batch 3: skipping bronze, silver (already committed)" in caplog.text
    expected = sorted(r["order_id"] for r in rows)
    assert _order_ids(tmp_path / "bronze") == _order_ids(tmp_path / "silver") == expected
    assert committed_marks(tmp_path / "ledger", "reset") == {
        (s, b): 1 for s in ("bronze", "silver") for b in range(5)
    }


def test_checkpoint_replaced_after_a_kill_before_any_mark_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    """The first query's driver (a subprocess) is killed in its first batch, once admitted:
    the ledger holds no mark and no failed row, only the query's claim of epoch 0. Had
    the kill come after a sink committed (which the ledger cannot tell apart), that sink
    would skip a new checkpoint's batch 0 by its transaction id: so the new query is
    refused, before any sink writes. The new query runs in the test's process, which shares
    nothing with the killed driver but its files (a driver subprocess starts Spark)."""
    write_input(tmp_path / "input", 3, 10)
    driver = [sys.executable, str(Path(__file__).with_name("driver.py")), str(tmp_path)]
    killed = subprocess.run(
        [*driver, "--kill", "batch_start:0"], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    first_query = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    ledger = [(r["sink"], r["status"], r["query_id"]) for r in delta_rows(tmp_path / "ledger")]
    assert ledger == [("*", "epoch", first_query)]

    shutil.rmtree(tmp_path / "checkpoint")
    fan = FanOut(PIPELINE, str(tmp_path / "ledger"), sinks(tmp_path))  # as driver.py runs it
    with pytest.raises(StreamingQueryException) as replaced:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    message = str(replaced.value)
    assert "CheckpointResetError" in message, message[-3000:]
    assert f"but epoch 0 of this pipeline belongs to query {first_query}" in message
    for sink in SINKS:
        assert not (tmp_path / sink).exists(), sink
    assert [r["status"] for r in delta_rows(tmp_path / "ledger")] == ["epoch"]
