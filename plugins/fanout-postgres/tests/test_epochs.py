"""After a checkpoint reset accepted as a new epoch, append-mode progress marks start
afresh: batch ids that repeat old ones are written, not skipped as 'already claimed'."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fanout_postgres.statements import EPOCH_FENCE
from pgcheck import query

from fanout import FanOut
from tests.integration.streams import run_stream, write_input


def _fan(tmp_path: Path, url: str, **kw: Any) -> FanOut:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "epoch_orders",
            "mode": "append", "create_table": True, "partitions": 2}  # fmt: skip
    return FanOut("epochs", str(tmp_path / "ledger"), [sink], **kw)


def test_new_epoch_appends_batches_whose_ids_repeat(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    old = write_input(tmp_path / "input", 2, 10)
    run_stream(spark, tmp_path / "input", _fan(tmp_path, pg_url), tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt")
    shutil.move(tmp_path / "input", tmp_path / "input-done")
    new = write_input(tmp_path / "input", 2, 10, start_file=2)

    fan = _fan(tmp_path, pg_url, on_checkpoint_reset="new_epoch")
    run_stream(spark, tmp_path / "input", fan, tmp_path / "ckpt")

    ids = [row[0] for row in query(pg_url, "SELECT order_id FROM epoch_orders ORDER BY 1")]
    assert ids == sorted(r["order_id"] for r in old + new)
    marks = query(pg_url, "SELECT pipeline, batch_id FROM fanout.progress ORDER BY 1, 2")
    # and the new epoch's fence of the old scope (docs/architecture.md §8.2)
    assert sorted({m for m in marks}) == [
        ("epochs", 0), ("epochs", 1), ("epochs", EPOCH_FENCE), ("epochs@e1", 0),
        ("epochs@e1", 1),
    ]  # fmt: skip
