"""Dead letters written before the sink's commit, the sink's ``dead_letter`` moved between a
kill and the replay (docs/architecture.md §7, "A ``dead_letter`` moved").

A route's letters: the driver (a subprocess) is killed after sink bronze wrote batch 2
(the rows its route refuses written first, as every attempt writes them, to Delta table
``letters_a``) and before its mark; the restart on the same checkpoint names another Delta
table, ``letters_b``. The replay wrote the batch's route letters again, to ``letters_b``:
each row the route refused in batch 2 was then kept twice, once in each table.

A Delta sink's own refused rows (a CHECK constraint), written before its one commit: the
driver is killed right after it wrote batch 2's to ``letters_a``, before the commit. The
replay, which writes the batch (not committed), wrote its letters to ``letters_b`` too.

The restart now asks ``letters_a`` (recorded in the ledger as the sink's target until
batch 2) what it holds of the batch, and writes none of those again; batch 3's go to
``letters_b``."""

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
KILL_BATCH = 2
# a paid order's customer ("c3") is no number: the cast fails under ANSI mode, the row is
# a route letter; the others pass with flag 0
SELECT = ["order_id", "status", "CAST(IF(status = 'paid', customer, '0') AS INT) AS flag"]


def _bronze(workdir: Path, letters: str) -> list[dict[str, object]]:
    return [
        {
            "type": "delta",
            "name": "bronze",
            "path": str(workdir / "bronze"),
            "select": SELECT,
            "dead_letter": str(workdir / letters),
        }
    ]


def _letters(path: Path, source: str = "route") -> Counter[tuple[int, int]]:
    """(batch, order id) of each letter of ``source`` in the Delta table at ``path``."""
    if not (path / "_delta_log").exists():
        return Counter()
    return Counter(
        (r["batch_id"], json.loads(r["row"])["order_id"])
        for r in delta_rows(path)
        if r["source"] == source
    )


def test_a_replay_under_a_moved_target_writes_no_route_letter_the_first_target_holds(
    spark: Any, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    config = tmp_path / "sinks.json"
    config.write_text(json.dumps(_bronze(tmp_path, "letters_a")))
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill", f"sink_done:{KILL_BATCH}:bronze",
           "--sinks", str(config)]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert f"KILL at sink_done batch {KILL_BATCH} sink bronze" in killed.stderr
    assert ("bronze", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)
    paid = {b: {r["order_id"] for r in rows[b * ROWS : (b + 1) * ROWS] if r["status"] == "paid"}
            for b in range(FILES)}  # fmt: skip
    first = _letters(tmp_path / "letters_a")
    assert set(first) == {(b, i) for b in range(KILL_BATCH + 1) for i in paid[b]}  # written

    with FanOut(PIPELINE, str(tmp_path / "ledger"), _bronze(tmp_path, "letters_b")) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    assert _letters(tmp_path / "letters_a") == first
    moved = _letters(tmp_path / "letters_b")
    assert moved == Counter({(FILES - 1, i): 1 for i in paid[FILES - 1]})
    everywhere = first + moved
    assert [key for key, n in everywhere.items() if n > 1] == []
    assert {i for _, i in everywhere} == {r["order_id"] for r in rows if r["status"] == "paid"}
    kept = id_counts(delta_rows(tmp_path / "bronze"))
    assert (set(kept), max(kept.values())) == (
        {r["order_id"] for r in rows if r["status"] != "paid"},
        1,
    )
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("bronze", b): 1 for b in range(FILES)
    }


def test_a_delta_sink_killed_between_its_letters_and_its_commit_keeps_them_once(
    spark: Any, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    schema = pa.schema(
        [("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()),
         ("status", pa.string())]
    )  # fmt: skip
    write_deltalake(str(tmp_path / "bronze"), schema.empty_table())
    DeltaTable(str(tmp_path / "bronze")).alter.add_constraint({"unpaid": "status <> 'paid'"})
    sinks = [{"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze"),
              "dead_letter": str(tmp_path / "letters_a")}]  # fmt: skip
    config = tmp_path / "sinks.json"
    config.write_text(json.dumps(sinks))
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill-after-letters", str(KILL_BATCH),
           "--sinks", str(config)]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert f"KILL after batch {KILL_BATCH}'s dead letters" in killed.stderr
    bronze = DeltaTable(str(tmp_path / "bronze"))
    assert bronze.transaction_version(txn_app_id(PIPELINE, "bronze")) == KILL_BATCH - 1
    paid = {b: {r["order_id"] for r in rows[b * ROWS : (b + 1) * ROWS] if r["status"] == "paid"}
            for b in range(FILES)}  # fmt: skip
    first = _letters(tmp_path / "letters_a", "refused")
    assert first == Counter({(b, i): 1 for b in range(KILL_BATCH + 1) for i in paid[b]})

    sinks[0]["dead_letter"] = str(tmp_path / "letters_b")
    with FanOut(PIPELINE, str(tmp_path / "ledger"), sinks) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    assert _letters(tmp_path / "letters_a", "refused") == first
    moved = _letters(tmp_path / "letters_b", "refused")
    assert moved == Counter({(FILES - 1, i): 1 for i in paid[FILES - 1]})
    kept = id_counts(delta_rows(tmp_path / "bronze"))
    assert kept == Counter({r["order_id"]: 1 for r in rows if r["status"] != "paid"})
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("bronze", b): 1 for b in range(FILES)
    }
