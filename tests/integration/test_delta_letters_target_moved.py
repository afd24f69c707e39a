"""A Delta sink's refused rows, its dead-letter target moved between a kill and the
replay: the driver (a subprocess) is killed after sink bronze committed batch 2 (its
refused rows' letters written first, to table ``letters_a``) and before its mark; the
restart on the same checkpoint names another Delta dead-letter table, ``letters_b``.

The replay found the batch committed and skipped the data, but wrote the batch's letters
first, to ``letters_b`` too: each refused row of batch 2 was then kept twice, once in each
table. A batch the table already holds had its letters written before its commit (every
attempt writes them first), so the replay writes none."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from fanout import FanOut
from fanout.contract.batch import txn_app_id
from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.driver import PIPELINE
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    run_stream,
    write_input,
)

DRIVER = Path(__file__).with_name("driver.py")
FILES, ROWS = 4, 12


def _bronze(workdir: Path, letters: str) -> list[dict[str, object]]:
    return [
        {
            "type": "delta",
            "name": "bronze",
            "path": str(workdir / "bronze"),
            "dead_letter": str(workdir / letters),
        }
    ]


def test_a_replay_under_a_moved_target_keeps_the_letters_of_a_committed_batch_once(
    spark: Any, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    schema = pa.schema(
        [("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()),
         ("status", pa.string())]
    )  # fmt: skip
    write_deltalake(str(tmp_path / "bronze"), schema.empty_table())
    DeltaTable(str(tmp_path / "bronze")).alter.add_constraint({"unpaid": "status <> 'paid'"})
    config = tmp_path / "sinks.json"
    config.write_text(json.dumps(_bronze(tmp_path, "letters_a")))
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill", "sink_done:2:bronze",
           "--sinks", str(config)]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL at sink_done batch 2 sink bronze" in killed.stderr
    assert ("bronze", 2) not in committed_marks(tmp_path / "ledger", PIPELINE)
    bronze = DeltaTable(str(tmp_path / "bronze"))
    assert bronze.transaction_version(txn_app_id(PIPELINE, "bronze")) == 2

    with FanOut(PIPELINE, str(tmp_path / "ledger"), _bronze(tmp_path, "letters_b")) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    paid = {int(r["order_id"]) for r in rows if r["status"] == "paid"}
    unpaid = {int(r["order_id"]) for r in rows} - paid
    kept = id_counts(delta_rows(tmp_path / "bronze"))
    assert (set(kept), max(kept.values())) == (unpaid, 1)
    letters = Counter(
        (r["batch_id"], json.loads(r["row"])["order_id"])
        for table in ("letters_a", "letters_b")
        for r in delta_rows(tmp_path / table)
    )
    twice = sorted(key for key, n in letters.items() if n > 1)
    assert twice == []
    assert {order_id for _, order_id in letters} == paid
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("bronze", b): 1 for b in range(FILES)
    }
