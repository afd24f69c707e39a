"""A deleted checkpoint makes fanout refuse to write, saying what the ledger knows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from fanout import FanOut
from tests.integration.streams import committed_marks, delta_rows, run_stream, write_input


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
    epochs = [r for r in ledger if r["status"] == "epoch"]
    assert [(r["epoch"], r["batch_id"]) for r in epochs] == [(1, 0)]
    marks = sorted(
        (r["epoch"], r["sink"], r["batch_id"]) for r in ledger if r["status"] == "committed"
    )
    assert marks == sorted(
        [(0, s, b) for s in ("bronze", "silver") for b in range(3)]
        + [(1, s, b) for s in ("bronze", "silver") for b in range(2)]
    )
